"""The graph validator: structural checks that run after import and after every pass."""

from __future__ import annotations

from plugrt.errors import ModelError
from plugrt.ir.graph import Graph


def validate_graph(graph: Graph, registry=None, require_types: bool = True) -> None:
    """Raise :class:`ModelError` on the first structural problem found.

    Checks: every input of a node is defined before it (topological order); no value is
    produced twice; graph outputs exist; with ``registry``, every node has a plugin; with
    ``require_types``, every value has an inferred type.
    """
    defined = set(graph.inputs) | {v.name for v in graph.values.values() if v.is_const}
    for name in graph.inputs:
        if name not in graph.values:
            raise ModelError(f"graph input {name!r} has no value entry")
    for node in graph.nodes:
        for name in node.inputs:
            if name and name not in defined:
                raise ModelError(f"{node.describe()}: input {name!r} is not defined before the node")
        for name in node.outputs:
            if not name:
                continue
            if name in defined:
                raise ModelError(f"{node.describe()}: output {name!r} is already defined elsewhere")
            if name not in graph.values:
                raise ModelError(f"{node.describe()}: output {name!r} has no value entry")
            defined.add(name)
        if registry is not None:
            registry.op(node)
    for name in graph.outputs:
        if name not in defined:
            raise ModelError(f"graph output {name!r} is not produced by any node, input or initializer")
    if require_types:
        for name in defined:
            if graph.values[name].info is None:
                raise ModelError(f"value {name!r} has no inferred type")
