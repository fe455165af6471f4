"""Epilogue fusion: an anchor (Conv, Gemm, MatMul) and the pointwise chain after it, one kernel.

From each anchor, follow its output while the value has exactly one reader, that reader
is a fusible pointwise node, and its output keeps the anchor's shape and dtype (bias,
activation chains, a residual Add of another tensor, scaling). An integer anchor
(ConvInteger, MatMulInteger: an int32 accumulator) may change dtype along the chain: its
epilogue converts, rescales and requantizes, so an INT8 layer stores INT8 (or float). A
chain node's other operand made by a pointwise node read by nothing else, from tensors
outside the chain (a residual's DequantizeLinear, a scaled bias), joins the epilogue
too, computed per element where it is read. The anchor and the chain become one
``plugrt.fused::Fused`` node whose inputs are the anchor's followed by the chain's other
operands; the anchor plugin's tactics run it with the composed epilogue.
"""

from __future__ import annotations

import numpy as np

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
        chain = _with_producers(graph, registry, chain, readers)
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
    converts = np.issubdtype(np.dtype(info.dtype), np.integer)
    chain, current = [], anchor.outputs[0]
    while current not in graph.outputs:
        after = list({id(n): n for n in readers.get(current, [])}.values())
        if len(after) != 1 or not is_fusible_pointwise(graph, registry, after[0]):
            break
        out = after[0].outputs[0]
        if shape_of(out) != shape or (graph.info(out).dtype != info.dtype and not converts):
            break
        chain.append(after[0])
        current = after[0].outputs[0]
    return chain


def _with_producers(graph, registry, chain: list, readers) -> list:
    """``chain`` with, before each node, the pointwise producers of its other operands that
    nothing else reads (not graph outputs) and that read no value of the chain."""
    producers = graph.producers()
    inside = {node.outputs[0] for node in chain}
    taken, found = set(), []
    for node in chain:
        for name in node.inputs:
            source = producers.get(name)
            if (source is None or name in inside or name in graph.outputs or id(source) in taken
                    or len(readers.get(name, [])) != 1 or is_anchor(registry, source)
                    or any(i in inside for i in source.inputs if i)
                    or not is_fusible_pointwise(graph, registry, source)):
                continue
            taken.add(id(source))
            found.append(source)
        found.append(node)
    return found
