"""``plugrt.contrib::MultiHeadAttention``: softmax(Q K^T * scale + mask) V in one kernel.

Inputs: Q with ``H`` heads of size ``D``, K and V with ``Hk`` heads (1, ``H``, or a divisor
of ``H``: grouped-query attention, query head ``h`` reading K/V head ``h // (H / Hk)``) and
batch 1 or Q's, and an optional additive ``mask`` broadcastable to ``[B, H, Sq, Sk]``.
Each of Q, K, V and the output is in the layout the attribute ``layout`` names
(``"q,k,v,out"``, default ``"bhsd,bhsd,bhsd,bhsd"``): ``bhsd`` ``[B, H, S, D]``, ``bshd``
``[B, S, H, D]``, or ``bsh`` ``[B, S, H * D]`` (heads split by the op: Q's by
``num_heads``, K's and V's by ``kv_num_heads``, 0 meaning ``num_heads``), so that the
exports' head split (Reshape, Transpose) and merge need no kernels of their own.
Attributes ``scale`` (float; absent: ``1 / sqrt(D)``), ``guard_nan`` (int, 0): 1 zeroes
the probabilities the softmax makes NaN, as exports' ``Where(IsNaN(p), 0, p)`` does (a
row whose scores are all ``-inf``, or hold a NaN or ``+inf``, is NaN throughout: its
output is zeros), ``causal`` (int, 0): 1 hides the keys ``j > i`` from query row ``i``
(PyTorch's ``is_causal``, a Trilu mask), 2 the keys ``j > i + Sk - Sq`` (the queries are
the last ``Sq`` of ``Sk`` positions, as GPT-2's sliced ``bias`` says), and ``causal_fill``
(float; absent: ``-inf``): the score of a hidden key, before the mask is added (the
exports' ``Where(causal, scores, finfo.min) + mask``, exactly); ``mask_period`` (int, 0):
the mask's batch holds that many entries, batch ``b`` reading entry ``b % mask_period``
(Swin's shifted-window mask, the batch being images x windows); ``packed`` (ints, empty):
``[nq, nk, nv]`` says Q, K and V are the columns ``[0, nq)``, ``[nq, nq + nk)`` and
``[nq + nk, nq + nk + nv)`` of their inputs' ``[B, S, nq + nk + nv]`` rows (layout ``bsh``):
one packed projection given as all three, read in place (op version 1.3).
Output ``[B, H, Sq, Dv]`` in its layout, of Q's dtype. float16 and float32 (the mask of
the same dtype); the kernel computes in float32.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt import ShapeError
from plugrt.plugin import Attr, Example, OpPlugin, TensorInfo, optional

from plugrt_contrib_attention.problem import AttentionShapes, merged_shape, packed_widths, parse_layout, split_heads
from plugrt_contrib_attention.tactics import attention_tactics

DOMAIN = "plugrt.contrib"
OP_TYPE = "MultiHeadAttention"
OPSET = 1
DTYPES = frozenset({np.dtype(np.float16), np.dtype(np.float32)})
RANKS = {"bhsd": 4, "bshd": 4, "bsh": 3}


def _may_differ(a, b) -> bool:
    """Both concrete and different."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def scale_of(node, d) -> float:
    """The node's ``scale``, or ``1 / sqrt(D)`` when it has none."""
    scale = node.attrs.get("scale")
    if scale is not None:
        return float(scale)
    return 1.0 / math.sqrt(int(d)) if int(d) > 0 else 1.0


def views(node, shapes):
    """``[B, H, S, D]`` dims of Q, K and V (shapes or TensorInfos) as the node's layout
    (and ``packed`` columns) reads them; ``None`` for one whose heads do not divide its width."""
    q_l, k_l, v_l, _ = parse_layout(node.attrs.get("layout"))
    widths = packed_widths(node.attrs.get("packed"))
    if widths is not None:
        shapes = [tuple(shape[:2]) + (width,) for shape, width in zip(shapes, widths)]
    q = split_heads(tuple(shapes[0]), q_l, node.attrs.get("num_heads") or None)
    kv_heads = node.attrs.get("kv_num_heads") or (q[1] if q else None)
    return q, split_heads(tuple(shapes[1]), k_l, kv_heads), split_heads(tuple(shapes[2]), v_l, kv_heads)


def _to_bhsd(x: np.ndarray, layout: str, heads: int) -> np.ndarray:
    if layout == "bshd":
        return np.swapaxes(x, 1, 2)
    if layout == "bsh":
        return np.swapaxes(x.reshape(x.shape[0], x.shape[1], heads, -1), 1, 2)
    return x


def _periodic(mask: np.ndarray, batch: int, period) -> np.ndarray:
    """The mask over the whole batch where its batch repeats every ``period`` entries."""
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if period and mask.shape[0] == period != batch:
        mask = np.tile(mask, (batch // period, 1, 1, 1))
    return mask


class MultiHeadAttention(OpPlugin):
    """Fused scaled-dot-product attention (see the module doc)."""

    op_type = OP_TYPE
    domain = DOMAIN
    since_opset = OPSET
    version = "1.3"  # 1.1: guard_nan; 1.2: causal, causal_fill, layout, num_heads, kv_num_heads, mask_period,
    # grouped K/V heads; 1.3: packed
    loads_versions = ("1.0", "1.1", "1.2")  # the attributes since default to what those versions did
    inputs = (3, 4)
    attributes = (Attr("scale", "float", None), Attr("guard_nan", "int", 0), Attr("causal", "int", 0),
                  Attr("causal_fill", "float", None), Attr("layout", "string", None), Attr("num_heads", "int", 0),
                  Attr("kv_num_heads", "int", 0), Attr("mask_period", "int", 0), Attr("packed", "ints", None))
    dtypes = DTYPES

    def check(self, node, inputs):
        q, k, v = inputs[:3]
        mask = optional(inputs, 3)
        for name, info in (("K", k), ("V", v), ("mask", mask)):
            if info is not None and info.dtype != q.dtype:
                raise self.unsupported(node, f"{name} of dtype {info.dtype} with Q of dtype {q.dtype}",
                                       "cast every input to Q's dtype")
        layout = parse_layout(node.attrs.get("layout"))
        if layout is None:
            raise self.unsupported(node, f"layout {node.attrs.get('layout')!r}",
                                   "give four of bhsd, bshd, bsh for Q, K, V and the output, comma-separated")
        self._check_packed(node, inputs[:3], layout)
        for name, info, tensor_layout in (("Q", q, layout[0]), ("K", k, layout[1]), ("V", v, layout[2])):
            if info.rank != RANKS[tensor_layout]:
                raise self.unsupported(node, f"{name} of rank {info.rank} in layout {tensor_layout}",
                                       "give Q, K and V as [batch, heads, sequence, head size] (bhsd), "
                                       "[batch, sequence, heads, head size] (bshd) or [batch, sequence, hidden] (bsh)")
        if layout[0] == "bsh" and not node.attrs.get("num_heads"):
            raise self.unsupported(node, "a Q of layout bsh without num_heads", "say how many heads Q holds")
        if node.attrs.get("causal", 0) not in (0, 1, 2):
            raise self.unsupported(node, f"causal={node.attrs.get('causal')}", "give 0, 1 or 2")
        if mask is not None and mask.rank > 4:
            raise self.unsupported(node, f"a mask of rank {mask.rank}", "give a mask broadcastable to [B, H, Sq, Sk]")

    def _check_packed(self, node, inputs, layout) -> None:
        packed = node.attrs.get("packed")
        if not packed:
            return
        if len(packed) != 3 or any(int(w) < 1 for w in packed):
            raise self.unsupported(node, f"packed={list(packed)}", "give the widths [nq, nk, nv] of Q, K and V")
        if layout[:3] != ("bsh", "bsh", "bsh"):
            raise self.unsupported(node, f"packed Q, K and V in layout {','.join(layout[:3])}",
                                   "give packed Q, K and V as [batch, sequence, nq + nk + nv] (bsh)")
        total = sum(int(w) for w in packed)
        for name, info in zip("QKV", inputs):
            width = info.shape[-1]
            if isinstance(width, int) and width != total:
                raise self.unsupported(node, f"packed {name} of width {width}, not nq + nk + nv = {total}",
                                       "give the packed projection, its columns Q, K, V side by side")

    def infer(self, node, inputs):
        q_info, k_info, v_info = inputs[:3]
        mask = optional(inputs, 3)
        q, k, v = views(node, [q_info.shape, k_info.shape, v_info.shape])
        problems = []
        for name, view in (("Q", q), ("K", k), ("V", v)):
            if view is None:
                problems.append(f"{name}'s hidden size does not split into the heads num_heads/kv_num_heads say")
        if not problems:
            problems = self._mismatches(node, q, k, v, mask)
        if problems:
            raise ShapeError(f"{node.describe()}: " + "; ".join(problems) + "; MultiHeadAttention takes "
                             "Q [B, H, Sq, D], K [B or 1, Hk, Sk, D], V [B or 1, Hk, Sk, Dv] (Hk dividing H) in "
                             "their layouts and a mask broadcastable to [B, H, Sq, Sk]")
        out_layout = parse_layout(node.attrs.get("layout"))[3]
        return [TensorInfo(q_info.dtype, merged_shape(q[0], q[1], q[2], v[3], out_layout))]

    @staticmethod
    def _mismatches(node, q, k, v, mask) -> list[str]:
        problems = []
        heads = node.attrs.get("num_heads")
        if heads and _may_differ(heads, q[1]):
            problems.append(f"num_heads={heads} but Q has {q[1]} heads")
        if _may_differ(q[3], k[3]):
            problems.append(f"Q's head size {q[3]} differs from K's {k[3]}")
        if _may_differ(k[2], v[2]):
            problems.append(f"K has {k[2]} keys but V has {v[2]}")
        for name, view in (("K", k), ("V", v)):
            if view[0] != 1 and _may_differ(view[0], q[0]):
                problems.append(f"{name}'s batch {view[0]} is neither 1 nor Q's {q[0]}")
            if isinstance(view[1], int) and isinstance(q[1], int) and (view[1] < 1 or q[1] % view[1]):
                problems.append(f"{name}'s {view[1]} heads do not divide Q's {q[1]}")
        if mask is not None:
            scores = (q[0], q[1], q[2], k[2])
            period = node.attrs.get("mask_period") or 0
            if period and isinstance(q[0], int) and q[0] % period:
                problems.append(f"mask_period={period} does not divide the batch {q[0]}")
            for axis, dim, full in zip(range(3, -1, -1), reversed(mask.shape), reversed(scores)):
                if axis == 0 and period and dim == period:
                    continue
                if dim != 1 and _may_differ(dim, full):
                    problems.append(f"mask of shape {list(mask.shape)} does not broadcast to [B, H, Sq, Sk] = "
                                    f"{list(scores)}")
                    break
        return problems

    def reference(self, node, inputs):
        q_l, k_l, v_l, o_l = parse_layout(node.attrs.get("layout"))
        (b, h, sq, d), (_, hk, sk, _), (_, hv, _, dv) = views(node, [x.shape for x in inputs[:3]])
        q, k, v = (np.asarray(x, dtype=np.float64) for x in inputs[:3])
        widths = packed_widths(node.attrs.get("packed"))
        if widths is not None:  # each its columns of the packed rows
            nq, nk, nv = widths
            q, k, v = q[..., :nq], k[..., nq:nq + nk], v[..., nq + nk:nq + nk + nv]
        q = _to_bhsd(q, q_l, h)
        k = np.repeat(_to_bhsd(k, k_l, hk), h // hk, axis=1)
        v = np.repeat(_to_bhsd(v, v_l, hv), h // hv, axis=1)
        mask = optional(inputs, 3)
        # the products in float64; the fill and the mask in float32, as the kernels (and the
        # exports' Where and Add) apply them: finfo.min + finfo.min is -inf there
        scores = (np.matmul(q, np.swapaxes(k, -1, -2)) * scale_of(node, d)).astype(np.float32)
        causal = node.attrs.get("causal", 0)
        if causal:
            diag = sk - sq if causal == 2 else 0
            keep = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + diag
            fill = node.attrs.get("causal_fill")
            scores = np.where(keep, scores, np.float32(-np.inf if fill is None else fill))
        with np.errstate(invalid="ignore", over="ignore"):
            if mask is not None:
                scores = scores + _periodic(np.asarray(mask, dtype=np.float32), b, node.attrs.get("mask_period"))
            scores = scores.astype(np.float64)
            peak = np.max(scores, axis=-1, keepdims=True)
            weights = np.exp(scores - peak)
            weights = weights / np.sum(weights, axis=-1, keepdims=True)
        if node.attrs.get("guard_nan"):
            weights = np.where(np.isnan(weights), 0.0, weights)
        out = np.broadcast_to(np.matmul(weights, v), (b, h, sq, dv))
        if o_l != "bhsd":
            out = np.swapaxes(out, 1, 2)
        return [np.ascontiguousarray(out).reshape(merged_shape(b, h, sq, dv, o_l)).astype(inputs[0].dtype)]

    def tactics(self, node, inputs, outputs, epilogue=None, wanted=None):
        q, k, v = inputs[:3]
        mask = optional(inputs, 3)
        shapes = AttentionShapes.of(q.shape, k.shape, v.shape, None if mask is None else mask.shape,
                                    node.attrs.get("layout"), node.attrs.get("num_heads") or 0,
                                    node.attrs.get("kv_num_heads") or 0, node.attrs.get("causal") or 0,
                                    node.attrs.get("causal_fill"), node.attrs.get("mask_period") or 0,
                                    node.attrs.get("packed"))
        return attention_tactics(shapes, q.dtype, scale_of(node, shapes.d),
                                 guard_nan=bool(node.attrs.get("guard_nan")), wanted=wanted)

    def serialize(self, node):
        """Nothing beyond the attributes: the kernel is fully described by them and the shapes."""
        return {}

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)

        def qkv(dtype, b, h, sq, sk, d, dv, k_lead=None):
            kb, kh = k_lead or (b, h)
            return (TensorInfo(dtype, (b, h, sq, d)), TensorInfo(dtype, (kb, kh, sk, d)),
                    TensorInfo(dtype, (kb, kh, sk, dv)))

        tol = dict(rtol=1e-4, atol=1e-5)
        return [
            Example(qkv(f32, 1, 2, 5, 7, 4, 4), name="default scale, ragged tiles", **tol),
            Example(qkv(f32, 2, 1, 4, 8, 3, 5) + (TensorInfo(f32, (2, 1, 1, 8)),), {"scale": 0.5},
                    name="key-padding mask, Dv != D", **tol),
            Example(qkv(f32, 1, 2, 3, 6, 4, 4, k_lead=(1, 1)) + (TensorInfo(f32, (3, 6)),), {"scale": 0.25},
                    name="shared K/V, [Sq, Sk] mask", **tol),
            Example(qkv(f16, 1, 1, 4, 4, 8, 8), rtol=1e-2, atol=1e-3, name="float16"),
            Example(qkv(f32, 1, 2, 4, 5, 4, 4) + (np.array([[0, 0, -np.inf, 0, 0], [-np.inf] * 5, [0] * 5,
                                                            [-np.inf, 0, 0, 0, 0]], np.float32),),
                    {"guard_nan": 1}, name="NaN guard, a fully masked row", **tol),
            Example(qkv(f32, 2, 4, 6, 6, 4, 4, k_lead=(2, 2)) + (TensorInfo(f32, (2, 1, 1, 6)),), {"causal": 1},
                    name="causal, grouped K/V heads", **tol),
            Example(qkv(f32, 1, 2, 3, 7, 4, 4), {"causal": 2}, name="causal from the lower right", **tol),
            Example(qkv(f32, 2, 2, 5, 5, 4, 4) + (np.array([[[[-3e38, 0, 0, 0, 0]]], [[[0, -3e38, 0, 0, 0]]]],
                                                           np.float32),),
                    {"causal": 1, "causal_fill": float(np.finfo(np.float32).min)}, name="causal fill and a mask",
                    **tol),
            Example(qkv(f32, 4, 2, 4, 4, 4, 4) + (TensorInfo(f32, (2, 2, 4, 4)),), {"mask_period": 2},
                    name="window mask repeating over the batch", **tol),
            Example((TensorInfo(f32, (2, 5, 8)), TensorInfo(f32, (2, 5, 4)), TensorInfo(f32, (2, 5, 1, 4))),
                    {"layout": "bsh,bsh,bshd,bsh", "num_heads": 2, "kv_num_heads": 1}, name="heads split and merged",
                    **tol),
            Example((TensorInfo(f32, (2, 3, 16)),) * 3,
                    {"layout": "bsh,bsh,bsh,bsh", "num_heads": 2, "kv_num_heads": 1, "packed": [8, 4, 4]},
                    name="packed projection, grouped K/V heads", **tol),
        ]
