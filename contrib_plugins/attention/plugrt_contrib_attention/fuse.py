"""The graph pass ``fuse_attention``: scaled-dot-product attention written in ONNX ops
becomes one ``plugrt.contrib::MultiHeadAttention`` node.

Matched (at the point plugin passes run: after constant folding, which turns the scale
and constant masks into initializers, and after the core merges Transpose pairs and
fuses primitive-op softmax into ``Softmax``)::

    scores = MatMul(q', kt')              q' = q, q * c or q / c (a scalar constant)
                                          kt' = kt, kt * c or kt / c;
                                          kt = Transpose(k'', perm) or any value
    scores' = scores, scores * c or scores / c
    selected = scores' or Where(cond, scores', fill) or Where(cond, fill, scores')
    biased = selected, selected + t1, or (selected + t1) + t2
    logits = biased, or Reshape(Reshape(biased, [B / nW, nW, H, N, N]) + window mask, [B, H, N, N])
    probs = Softmax(logits, last axis), or Where(IsNaN(probs), 0, probs) (PyTorch's export of
            scaled_dot_product_attention guards fully masked rows so: ``guard_nan=1``)
    y = MatMul(probs, v)

so the scale may sit on Q, on K (before or after its transpose), on both (the SDPA
export's square-root split) or on the scores, as a Mul or a Div; ``scale`` is the product
of every factor. The Where and the added terms become the op's ``causal`` attribute and
its one ``mask`` input (:mod:`.masks`, :mod:`.causal`). K goes in as ``[B, H, Sk, D]``,
or as ``[B, Sk, H, D]`` (layout ``bshd``) where PyTorch's permute and
``transpose(-1, -2)`` merged into one Transpose ``[0, 2, 3, 1]``; other K transposes get a
Transpose to ``[B, H, Sk, D]`` inserted. Q, K and V must be 4-D float16/float32 with K's
and V's batch and head dims 1 or Q's, the mask must broadcast to the scores' shape, and
the head sizes must fit some tactic's shared-memory tiles. Then :mod:`.heads` takes the
head split and merge (Reshape, Transpose) and grouped K/V heads' repeat into the op.
Where a match cannot be fused, the graph keeps it and ``-v`` says why.
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import (Rule, capture, const, either, fresh_name, is_scalar, make_node, op, origin_of,
                                   rewrite_matches)

from plugrt_contrib_attention import heads, scales, standard
from plugrt_contrib_attention.facts import Dims, not_fused
from plugrt_contrib_attention.masks import causal_fill, mask_input, read_masking
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
_scores = _scaled(op("MatMul", _scaled(capture("q"), "q"), _scaled(_k_transposed, "k_out"), name="scores"), "s")
_fill = const("select_fill", is_scalar)
_selected = either(op("Where", capture("select_cond"), _scores, _fill, name="select_keep"),
                   op("Where", capture("select_cond"), _fill, _scores, name="select_drop"),
                   _scores)
_biased = either(op("Add", op("Add", _selected, capture("term_a")), capture("term_b")),
                 op("Add", _selected, capture("term_a")),
                 _selected)
_windowed = op("Reshape", op("Add", op("Reshape", _biased, capture("win_split"), name="win5"), capture("win_mask")),
               capture("win_merge"), name="win")
_softmax = op("Softmax", either(_windowed, _biased), name="probs")
_guarded = op("Where", op("IsNaN", _softmax), const("guard_fill"), capture("guarded"), name="guard")
ATTENTION = op("MatMul", either(_guarded, _softmax), capture("v"))

SCALE_TAGS = ("q", "k_in", "k_out", "s")


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


def _misfit(graph, dims, match, k_src: str, perm) -> str | None:
    """Why the match's dtypes, ranks or dims are not what the fused op implements, or ``None``."""
    q, v, scores, out = match.values["q"], match.values["v"], match.values["scores"], match.root.outputs[0]
    infos = [graph.info(name) for name in (q, k_src, v, scores, out)]
    if any(info is None for info in infos):
        return "a tensor of unknown type"
    dtype = infos[0].dtype
    if dtype not in DTYPES or any(info.dtype != dtype for info in infos):
        return f"dtypes {[str(info.dtype) for info in infos]}: Q, K and V must be one of float16, float32"
    if any(info.rank != 4 for info in infos):
        return "Q, K, V or the scores not 4-D [batch, heads, sequence, head size]"
    if not _softmax_on_last_axis(match.node("probs"), 4):
        return "the softmax is not over the keys (the last axis)"
    k_axes = perm or [0, 1, 2, 3]
    for axis in (0, 1):  # Q's batch and heads are the result's; K's and V's broadcast
        if not (dims.equal(scores, axis, q, axis) and dims.equal(out, axis, q, axis)):
            return "the scores or the result do not keep Q's batch and heads"
        if not (dims.one_or_equal(k_src, k_axes[axis], q, axis) and dims.one_or_equal(v, axis, q, axis)):
            return "K's or V's batch or heads are neither 1 nor Q's"
    if not (dims.equal(scores, 2, q, 2) and dims.equal(out, 3, v, 3)):
        return "the product's dims do not line up"
    head, head_v = infos[0].shape[3], infos[2].shape[3]
    if isinstance(head, int) and isinstance(head_v, int) and not fits_head_sizes(head, head_v):
        return f"head sizes {head}, {head_v}: no kernel's tiles fit in shared memory"
    return None


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
    if layout is None:
        return not_fused(match.root, "K is transposed at another rank than 4 (no heads axis)")
    guard = _guard_nan(match)
    if guard is None:
        return not_fused(match.root, "the Where after the softmax is not Where(IsNaN(p), 0, p)")
    k_src, perm = layout
    dims = Dims(graph, registry)
    why = _misfit(graph, dims, match, k_src, perm)
    masking = read_masking(graph, dims, match) if why is None else why
    if isinstance(masking, str):
        return not_fused(match.root, masking)
    k_layout = "bshd" if perm == [0, 2, 1, 3] else "bhsd"
    insert_k = perm is not None and k_layout == "bhsd"
    k_name = fresh_name(graph, f"{k_src}/bhsd") if insert_k else k_src
    mask = mask_input(graph, registry, masking, graph.info(match.values["q"]).dtype, match.root.name, match.nodes)
    attrs = {"scale": _scale(match), "guard_nan": guard, "causal": masking.causal,
             "causal_fill": causal_fill(masking) if masking.causal else None, "mask_period": masking.period,
             "layout": f"bhsd,{k_layout},bhsd,bhsd"}
    fused = match.fused(registry, OP_TYPE, [match.values["q"], k_name, match.values["v"]] + ([mask] if mask else []),
                        attrs, opset=OPSET, domain=DOMAIN)
    if fused is None:
        return None
    if insert_k:
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
    """Make standard ``Attention`` nodes MultiHeadAttention ones (:mod:`.standard`), pin
    shape-computed scales (:mod:`.scales`), replace every matched attention subgraph by one
    MultiHeadAttention node, then take the head layouts around the fused nodes into them."""
    converted = standard.run(graph, registry)
    pinned = scales.run(graph, registry)
    return converted + pinned + rewrite_matches(graph, registry, RULES) + heads.run(graph, registry)
