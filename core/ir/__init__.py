"""The intermediate representation: graphs of nodes and values with symbolic shapes (see ``graph`` and ``dims``)."""
