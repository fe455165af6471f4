"""Common subexpression elimination: nodes that compute the same thing are computed once.

Two nodes are the same computation when they have the same op identity (domain, op type,
opset), read the same values, produce the same outputs (by position) and carry equal
attributes (arrays compare by dtype, shape and bytes), and their plugin is ``foldable``
(a random op gives a different result each time). The first is kept, its ``origin``
extended with the other's; the other's readers read the first's outputs.

Identical small initializers are merged first, so nodes reading equal copies of one
constant (as exporters often write them) become the same computation too.
"""

from __future__ import annotations

import numpy as np

from plugrt.ir.graph import Graph, Node, origin_of
from plugrt.passes.rewrite import finish, remove_nodes, replace_node, replace_value

#: Initializers of at most this many elements are compared for merging (bigger weights
#: are rarely duplicated, and comparing them costs a hash of every byte).
SMALL_INITIALIZER = 1 << 16


def run(graph: Graph, registry) -> int:
    """Merge duplicate initializers and nodes; return how many were merged."""
    merged = _merge_initializers(graph)
    while True:
        count = _merge_nodes(graph, registry)
        if not count:
            break
        merged += count
    if merged:
        finish(graph, registry)
    return merged


def _merge_initializers(graph: Graph) -> int:
    seen: dict[tuple, str] = {}
    merged = 0
    for name, value in list(graph.values.items()):
        array = value.const
        if array is None or array.size > SMALL_INITIALIZER:
            continue
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in seen:
            seen[key] = name
        elif name not in graph.outputs and replace_value(graph, name, seen[key]):
            del graph.values[name]
            merged += 1
    return merged


def _merge_nodes(graph: Graph, registry) -> int:
    """One sweep in topological order; positions stay put until the duplicates go."""
    seen: dict[tuple, int] = {}
    duplicates = []
    for index in range(len(graph.nodes)):
        node = graph.nodes[index]
        if not registry.op(node).foldable:
            continue
        key = _key(node)
        if key not in seen:
            seen[key] = index
            continue
        keep = graph.nodes[seen[key]]
        if not _reroute(graph, keep, node):
            continue
        duplicates.append(index)
        keep = graph.nodes[seen[key]]  # rerouting a graph output renames keep's output
        replace_node(graph, keep, keep.replace(origin=origin_of([keep, node])))
    remove_nodes(graph, [graph.nodes[i] for i in duplicates])
    return len(duplicates)


def _reroute(graph: Graph, keep: Node, duplicate: Node) -> bool:
    """Make the duplicate's readers read the kept node's outputs; ``False`` (nothing
    changed) when both outputs are graph outputs, which must stay distinct bindings."""
    pairs = [(k, d) for k, d in zip(keep.outputs, duplicate.outputs) if d]
    if any(d in graph.outputs and k in graph.outputs for k, d in pairs):
        return False
    for kept_name, duplicate_name in pairs:
        replace_value(graph, duplicate_name, kept_name)
    return True


def _key(node: Node) -> tuple:
    attrs = tuple(sorted((name, _canonical(value)) for name, value in node.attrs.items()))
    present = tuple(bool(name) for name in node.outputs)
    return node.domain, node.op_type, node.opset, node.inputs, present, attrs


def _canonical(value):
    """A hashable stand-in for an attribute value; unknown kinds compare by identity."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_canonical(v) for v in value))
    if isinstance(value, float) and value != value:
        return ("nan",)
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return value
