"""Dead code elimination: nodes and initializers nothing needs.

A node is live when one of its outputs is a graph output or is read by a live node;
everything else goes, and so do the initializers no live node reads (graph outputs
excepted). Graph inputs stay even when unread: they are bindings.
"""

from __future__ import annotations

from plugrt.ir.graph import Graph
from plugrt.passes.rewrite import finish, remove_nodes


def run(graph: Graph, registry) -> int:
    """Remove dead nodes and unread initializers; return how many went."""
    live = set(graph.outputs)
    dead = []
    for node in reversed(graph.nodes):  # readers come after producers
        if any(name and name in live for name in node.outputs):
            live.update(name for name in node.inputs if name)
        else:
            dead.append(node)
    remove_nodes(graph, dead)
    unread = [name for name, value in graph.values.items()
              if value.is_const and name not in live and name not in graph.inputs]
    for name in unread:
        del graph.values[name]
    if dead or unread:
        finish(graph, registry)
    return len(dead) + len(unread)
