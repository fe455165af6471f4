"""Fold per-channel scales into the weights of the anchor that produces their input.

A node whose plugin's :meth:`~plugrt.plugin.OpPlugin.as_scale` describes its output as
``x * scale + shift`` (an inference BatchNormalization, a Mul or Add by a constant) is
removed when ``x`` is output 0 of a node whose plugin's
:meth:`~plugrt.plugin.OpPlugin.fold_scale` absorbs the scale into new constant inputs (a
Conv's W and B, a Gemm's B and C). The plugins do all the arithmetic; this pass only moves
the arrays they return into the graph and reroutes the scale node's readers.

The producer's output must have no other reader and not be a graph output (folding
changes its value), and the scale node's outputs past 0 must be unused. The pass repeats
until nothing folds, so Conv -> BatchNormalization -> Mul -> Add becomes one Conv.
"""

from __future__ import annotations

from plugrt.ir.graph import Graph, Node, origin_of
from plugrt.ir.infer import infer_node
from plugrt.passes import rewrite


def run(graph: Graph, registry) -> int:
    """Fold every foldable scale node into its producer; return how many were folded."""
    folds = 0
    while _fold_one(graph, registry):
        folds += 1
    if folds:
        rewrite.finish(graph, registry)
    return folds


def _fold_one(graph: Graph, registry) -> bool:
    """Fold the first scale node that can be folded; ``False`` when none can."""
    producers, consumers = graph.producers(), graph.consumers()
    for node in graph.nodes:
        if rewrite.extra_outputs_used(graph, node, consumers):
            continue
        scale = registry.op(node).as_scale(node, [graph.info(n) for n in node.inputs])
        if scale is None or scale.input >= len(node.inputs):
            continue
        source = node.inputs[scale.input]
        anchor = producers.get(source)
        if anchor is None or anchor.outputs[0] != source or source in graph.outputs:
            continue
        if any(reader is not node for reader in consumers.get(source, ())):
            continue
        if rewrite.extra_outputs_used(graph, anchor, consumers):
            continue
        folded = registry.op(anchor).fold_scale(anchor, [graph.info(n) for n in anchor.inputs], graph.info(source),
                                                 scale.scale, scale.shift)
        if folded is not None and _apply(graph, registry, node, anchor, folded):
            return True
    return False


def _apply(graph: Graph, registry, node: Node, anchor: Node, folded: dict) -> bool:
    """Give ``anchor`` the new constant inputs, and its output to ``node``'s readers."""
    anchor_at, node_at = graph.nodes.index(anchor), graph.nodes.index(node)
    # replace_value may rename outputs (when node's output is a graph output), which
    # replaces both nodes in place: look them up again by position afterwards.
    if not rewrite.replace_value(graph, node.outputs[0], anchor.outputs[0]):
        return False
    anchor, node = graph.nodes[anchor_at], graph.nodes[node_at]
    inputs = list(anchor.inputs)
    for index in sorted(folded):
        inputs.extend([""] * (index + 1 - len(inputs)))
        base = anchor.inputs[index] if index < len(anchor.inputs) and anchor.inputs[index] else f"{anchor.name}_in{index}"
        inputs[index] = rewrite.add_constant(graph, f"{base}_folded", folded[index])
    replacement = anchor.replace(inputs=tuple(inputs), origin=origin_of([anchor, node]))
    rewrite.replace_node(graph, anchor, replacement)
    rewrite.remove_nodes(graph, [node])
    infer_node(graph, registry, replacement)  # the next scale node reads this type
    return True
