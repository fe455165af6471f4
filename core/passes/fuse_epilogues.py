"""Epilogue fusion: an anchor (Conv, Gemm, MatMul) and the pointwise chain after it, one kernel.

From each anchor, follow its output while the value has exactly one reader, that reader
is a fusible pointwise node, and its output keeps the anchor's shape and dtype (bias,
activation chains, a residual Add of another tensor, scaling). The anchor and the chain
become one ``plugrt.fused::Fused`` node whose inputs are the anchor's followed by the
chain's other operands; the anchor plugin's tactics run it with the composed epilogue.
"""

from __future__ import annotations

from plugrt.fusion.op import fused_node, is_anchor, is_fusible_pointwise
from plugrt.passes.rewrite import finish, remove_nodes, replace_node, shape_facts


def run(graph, registry) -> int:
    fused = 0
    readers = graph.consumers()
    shape_of = shape_facts(graph, registry)
    for anchor in list(graph.nodes):
        if not is_anchor(registry, anchor):
            continue
        chain = _chain(graph, registry, anchor, readers, shape_of)
        if not chain:
            continue
        values = {anchor.outputs[0]} | {node.outputs[0] for node in chain}
        extras: list[str] = []
        for node in chain:
            extras += [name for name in node.inputs if name and name not in values and name not in extras]
        members = [anchor] + chain
        node = fused_node(" + ".join(m.name for m in members), members, anchor.inputs + tuple(extras),
                          chain[-1].outputs, registry)
        replace_node(graph, chain[-1], node)
        remove_nodes(graph, members[:-1])
        readers = graph.consumers()
        fused += 1
    if fused:
        finish(graph, registry)
    return fused


def _chain(graph, registry, anchor, readers, shape_of) -> list:
    """The longest run of single-reader pointwise nodes after ``anchor`` it can absorb."""
    info, shape = graph.info(anchor.outputs[0]), shape_of(anchor.outputs[0])
    chain, current = [], anchor.outputs[0]
    while current not in graph.outputs:
        after = list({id(n): n for n in readers.get(current, [])}.values())
        if len(after) != 1 or not is_fusible_pointwise(graph, registry, after[0]):
            break
        out = after[0].outputs[0]
        if shape_of(out) != shape or graph.info(out).dtype != info.dtype:
            break
        chain.append(after[0])
        current = after[0].outputs[0]
    return chain
