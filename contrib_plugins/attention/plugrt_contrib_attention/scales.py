"""Attention scales computed from shapes, pinned as constants before :mod:`.fuse` matches.

An export may compute the softmax scale from a tensor's shape instead of writing it as a
number: ``torch.nn.MultiheadAttention`` (TorchScript exporter) scales Q and K^T each by
``sqrt(1 / sqrt(D))`` with ``D = Shape(q)[-1]``. Where the graph's dims are symbolic
(a dynamic batch), inference cannot fold that: the scale stays a computed scalar, which
the fusion's ``q * c`` patterns (``c`` a constant) do not take, so the Muls stay kernels.

Here a one-element float operand of a ``Mul`` or ``Div`` on either input of a MatMul
that a Softmax reads (maybe through a Transpose), or on its output, becomes a constant
where it is a shape computation (its value known at every sample shape of the graph, so
no tensor data feeds it) with one value at all of them: the facts the other attention
rewrites rely on (:mod:`.facts`). It is the head size's function, fixed by the weights.
Without sample shapes nothing is pinned.
"""

from __future__ import annotations

import logging

import numpy as np

from plugrt.passes.pattern import add_constant, constant_value, replace_node, sample_values

log = logging.getLogger("plugrt.passes.fuse_attention")

#: How far (nodes) after the scores MatMul the Softmax may be: scale, masks, bias.
_SOFTMAX_REACH = 6


def _feeds_softmax(node, readers) -> bool:
    frontier = [node]
    for _ in range(_SOFTMAX_REACH):
        frontier = [r for n in frontier for out in n.outputs for r in readers.get(out, ())]
        if any(n.op_type == "Softmax" for n in frontier):
            return True
    return False


def _scale_nodes(graph, scores, producers, readers) -> list:
    """The Mul and Div nodes that may scale ``scores``'s inputs or its output."""
    found = [r for r in readers.get(scores.outputs[0], ()) if r.op_type in ("Mul", "Div")]
    for name in scores.inputs[:2]:
        node = producers.get(name)
        if node is not None and node.op_type == "Transpose":
            node = producers.get(node.inputs[0])
        if node is not None and node.op_type in ("Mul", "Div"):
            found.append(node)
    return found


class _Samples:
    """The graph's values at every sample shape (concretized once, when first asked)."""

    def __init__(self, graph, registry):
        self.graph, self.registry, self._graphs = graph, registry, None

    def fixed(self, name: str) -> np.ndarray | None:
        """``name``'s value where it is known and the same at every sample, else ``None``."""
        if not self.graph.sample_inputs:
            return None
        if self._graphs is None:
            self._graphs = sample_values(self.graph, self.registry)
        values = self._graphs(name)
        if not values or any(value is None for value in values):
            return None
        first = np.asarray(values[0])
        return first if all(np.array_equal(first, np.asarray(v)) for v in values[1:]) else None


def _operands(node) -> tuple:
    """The input positions a scale factor may take: either of a Mul's, a Div's divisor."""
    return (1, 0) if node.op_type == "Mul" else (1,)


def run(graph, registry) -> int:
    """Pin the shape-computed scalar scales of attention scores; return how many."""
    producers, readers = graph.producers(), graph.consumers()
    candidates = {}
    for scores in graph.nodes:
        if scores.op_type == "MatMul" and _feeds_softmax(scores, readers):
            candidates.update((node.name, node) for node in _scale_nodes(graph, scores, producers, readers))
    samples, pinned = _Samples(graph, registry), 0
    for node in candidates.values():
        for index in _operands(node):
            operand = node.inputs[index]
            info = graph.info(operand)
            if constant_value(graph, operand) is not None or info is None or info.dtype.kind != "f":
                continue
            if info.is_static and int(np.prod(info.shape)) != 1:
                continue
            value = samples.fixed(operand)
            if value is None or value.size != 1:
                log.info("fuse_attention: %s keeps its operand %r: not one shape-computed value at every sample "
                         "shape", node.describe(), operand)
                continue
            inputs = list(node.inputs)
            inputs[index] = add_constant(graph, f"{operand}/pinned", value.astype(info.dtype))
            replace_node(graph, node, node.replace(inputs=tuple(inputs)))
            pinned += 1
            break
    return pinned
