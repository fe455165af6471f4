"""No-op removal: nodes whose output 0 is one of their inputs, unchanged.

Each plugin says when its node is a no-op through ``OpPlugin.forwards`` (Identity, an
inference Dropout, a Reshape to the shape the input already has, a Cast to the dtype it
already has, ...). The node goes when its other outputs are unused and its readers can
read the forwarded input instead (``rewrite.replace_value``); a node between a graph
input and a graph output stays, since both names are bindings.
"""

from __future__ import annotations

import numpy as np

from plugrt.errors import PluginError
from plugrt.ir.graph import Graph, Node
from plugrt.passes.rewrite import extra_outputs_used, finish, remove_nodes, replace_value


def run(graph: Graph, registry) -> int:
    """Remove every no-op node that can be bypassed; return how many."""
    removed = []
    # replace_value edits nodes in place (same positions), so walk by position.
    for index in range(len(graph.nodes)):
        node = graph.nodes[index]
        source = _forwarded_input(graph, registry, node)
        if source is None or not node.outputs[0] or extra_outputs_used(graph, node):
            continue
        if replace_value(graph, node.outputs[0], node.inputs[source]):
            removed.append(index)
    if removed:
        remove_nodes(graph, [graph.nodes[i] for i in removed])
        finish(graph, registry)
    return len(removed)


def _forwarded_input(graph: Graph, registry, node: Node) -> int | None:
    """The input index the plugin says output 0 equals, checked; ``None`` if none."""
    op = registry.op(node)
    inputs = [graph.info(name) for name in node.inputs]
    source = op.forwards(node, inputs)
    if source is None:
        return None
    if not isinstance(source, (int, np.integer)) or not 0 <= source < len(inputs) or inputs[source] is None:
        raise PluginError(f"{node.describe()}: forwards() of plugin {type(op).__name__} returned {source!r}, "
                          "which is not the index of an input the node has")
    out = graph.info(node.outputs[0]) if node.outputs[0] else None
    if out is not None and out.dtype != inputs[source].dtype:
        raise PluginError(f"{node.describe()}: forwards() of plugin {type(op).__name__} says output 0 is input "
                          f"{source}, but their dtypes differ ({out.dtype} and {inputs[source].dtype})")
    return int(source)
