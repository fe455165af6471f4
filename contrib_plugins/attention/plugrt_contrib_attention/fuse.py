"""The graph pass ``fuse_attention``: scaled-dot-product attention written in ONNX ops
becomes one ``plugrt.contrib::MultiHeadAttention`` node.

Matched (at the point plugin passes run: after constant folding, which turns the scale
into an initializer, and after the core merges Transpose pairs and fuses primitive-op
softmax into ``Softmax``)::

    scores = MatMul(q', kt')              q' = q, q * c or q / c (a scalar constant)
                                          kt' = kt, kt * c or kt / c;
                                          kt = Transpose(k'', perm) or any value
    scores' = scores, scores * c or scores / c
    logits = scores' or Add(scores', mask)
    probs = Softmax(logits, last axis), or Where(IsNaN(probs), 0, probs) (PyTorch's export of
            scaled_dot_product_attention guards fully masked rows so: ``guard_nan=1``)
    y = MatMul(probs, v)

The fused node takes Q, K in ``[B, H, Sk, D]`` and V; when K only exists transposed
(PyTorch's ``k.transpose(-1, -2)`` after ``permute(0, 2, 1, 3)`` is merged into one
Transpose ``[0, 2, 3, 1]``), a Transpose to ``[B, H, Sk, D]`` is inserted. ``scale`` is the
product of every scalar factor matched. Q, K and V must be 4-D float16/float32 with K's
and V's batch and head dims 1 or Q's, the mask must broadcast to the scores' shape, and
the head sizes must fit some tactic's shared-memory tiles.
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import (Rule, capture, const, either, fresh_name, is_scalar, make_node, op, origin_of,
                                   rewrite_matches, shape_facts)

from plugrt_contrib_attention.op import DOMAIN, DTYPES, OP_TYPE, OPSET
from plugrt_contrib_attention.tactics import fits_head_sizes

NAME = "fuse_attention"


def _scaled(x, tag: str):
    """``x``, ``x * c`` or ``x / c`` for a scalar constant ``c`` (captured as ``tag_mul`` or
    ``tag_div``); the forms with a factor first, so they claim the scale node."""
    return either(op("Mul", x, const(f"{tag}_mul", is_scalar)),
                  op("Div", x, const(f"{tag}_div", is_scalar)),
                  x)


_k_transposed = either(op("Transpose", _scaled(capture("k_src"), "k_in"), name="k_t"), capture("k_t_value"))
_scores = op("MatMul", _scaled(capture("q"), "q"), _scaled(_k_transposed, "k_out"), name="scores")
_logits = either(op("Add", _scaled(_scores, "s"), capture("mask")), _scaled(_scores, "s"))
_softmax = op("Softmax", _logits, name="probs")
_guarded = op("Where", op("IsNaN", _softmax), const("guard_fill"), capture("guarded"), name="guard")
ATTENTION = op("MatMul", either(_guarded, _softmax), capture("v"))

SCALE_TAGS = ("q", "k_in", "k_out", "s")


class _Dims:
    """Dim facts for the rule's checks: inferred dims, or, where those are symbols that
    differ, the dims at the graph's sample shapes (see :func:`plugrt.passes.pattern.shape_facts`)."""

    def __init__(self, graph, registry):
        self.graph, self.registry, self._facts = graph, registry, None

    def _sampled(self, name: str, axis: int):
        if self._facts is None:
            self._facts = shape_facts(self.graph, self.registry)
        return tuple(shape[axis] for shape in self._facts(name))

    def equal(self, a: str, a_axis: int, b: str, b_axis: int) -> bool:
        if self.graph.info(a).shape[a_axis] == self.graph.info(b).shape[b_axis]:
            return True
        return bool(self.graph.sample_inputs) and self._sampled(a, a_axis) == self._sampled(b, b_axis)

    def one_or_equal(self, a: str, a_axis: int, b: str, b_axis: int) -> bool:
        return self.graph.info(a).shape[a_axis] == 1 or self.equal(a, a_axis, b, b_axis)


def _scale(match) -> float:
    """The product of every scalar factor the match holds (a divisor counts as 1 / c)."""
    scale = 1.0
    for tag in SCALE_TAGS:
        factor = match.const(f"{tag}_mul")
        if factor is not None:
            scale *= float(factor.reshape(-1)[0])
        divisor = match.const(f"{tag}_div")
        if divisor is not None:
            scale /= float(divisor.reshape(-1)[0])
    return scale


def _softmax_on_last_axis(node, rank: int) -> bool:
    axis = node.attrs.get("axis")
    if axis is None:
        axis = 1 if node.opset < 13 else -1
    return axis in (-1, rank - 1)  # before opset 13, coercion from the last axis is the same softmax


def _k_layout(match) -> tuple[str, list[int] | None] | None:
    """K's source value and the perm turning it into ``[B, H, Sk, D]`` (``None``: it already
    is); ``None`` for a K transposed at another rank than 4 (no heads axis: not fused)."""
    if "k_src" not in match.values:
        return match.values["k_t_value"], [0, 1, 3, 2]
    perm = match.node("k_t").attrs.get("perm")
    if perm is not None and len(perm) != 4:
        return None
    perm = [3, 2, 1, 0] if perm is None else [int(p) % 4 for p in perm]
    to_bhsd = [perm[0], perm[1], perm[3], perm[2]]
    return match.values["k_src"], (None if to_bhsd == [0, 1, 2, 3] else to_bhsd)


def _fits(graph, registry, match, k_src: str, perm) -> bool:
    """Dtypes, ranks and dims the fused op implements (see the module doc)."""
    q, v, scores, out = match.values["q"], match.values["v"], match.values["scores"], match.root.outputs[0]
    mask = match.values.get("mask")
    infos = [graph.info(name) for name in (q, k_src, v, scores, out) + ((mask,) if mask else ())]
    if any(info is None for info in infos):
        return False
    dtype = infos[0].dtype
    if dtype not in DTYPES or any(info.dtype != dtype for info in infos):
        return False
    if any(info.rank != 4 for info in infos[:5]) or (mask and infos[5].rank > 4):
        return False
    if not _softmax_on_last_axis(match.node("probs"), 4):
        return False
    dims = _Dims(graph, registry)
    k_axes = perm or [0, 1, 2, 3]
    for axis in (0, 1):  # Q's batch and heads are the result's; K's and V's broadcast
        if not (dims.equal(scores, axis, q, axis) and dims.equal(out, axis, q, axis)):
            return False
        if not (dims.one_or_equal(k_src, k_axes[axis], q, axis) and dims.one_or_equal(v, axis, q, axis)):
            return False
    if not (dims.equal(scores, 2, q, 2) and dims.equal(out, 3, v, 3)):
        return False
    head, head_v = infos[0].shape[3], infos[2].shape[3]
    if isinstance(head, int) and isinstance(head_v, int) and not fits_head_sizes(head, head_v):
        return False
    if mask:
        rank = infos[5].rank
        return all(dims.one_or_equal(mask, rank - back, scores, 4 - back) for back in range(1, rank + 1))
    return True


def _guard_nan(match) -> int | None:
    """1 for the NaN guard around the softmax, 0 without one; None for a ``Where`` that is
    not that guard (another fill, or another tensor than the softmax's)."""
    if "guard" not in match.values:
        return 0
    fill = match.const("guard_fill")
    if match.values["guarded"] != match.node("probs").outputs[0] or fill is None or np.any(fill != 0):
        return None
    return 1


def _fuse(graph, registry, match):
    layout = _k_layout(match)
    guard = _guard_nan(match)
    if layout is None or guard is None:
        return None
    k_src, perm = layout
    if not _fits(graph, registry, match, k_src, perm):
        return None
    q, rest = match.values["q"], [match.values["v"]] + ([match.values["mask"]] if "mask" in match.values else [])
    k_name = fresh_name(graph, f"{k_src}/bhsd") if perm else k_src
    fused = match.fused(registry, OP_TYPE, [q, k_name] + rest, {"scale": _scale(match), "guard_nan": guard},
                        opset=OPSET, domain=DOMAIN)
    if fused is None:
        return None
    if perm:
        origin = origin_of([match.node("k_t")]) if "k_src" in match.values else ()
        transpose = make_node(graph, registry, "Transpose", [k_src], [k_name], {"perm": perm},
                                      opset=graph.opsets.get("", 13), name=k_name, origin=origin)
        if transpose is None:
            return None
        graph.add_node(transpose)
    graph.opsets.setdefault(DOMAIN, OPSET)
    return fused


RULES = [Rule("attention", ATTENTION, _fuse)]


def run(graph, registry) -> int:
    """Replace every matched attention subgraph by one MultiHeadAttention node."""
    return rewrite_matches(graph, registry, RULES)
