"""``plugrt.contrib::MultiHeadAttention``: softmax(Q K^T * scale + mask) V in one kernel.

Inputs: Q ``[B, H, Sq, D]``, K ``[Bk, Hk, Sk, D]``, V ``[Bv, Hv, Sk, Dv]`` (``Bk``, ``Bv``
each 1 or B; ``Hk``, ``Hv`` each 1 or H: NumPy broadcasting over Q's batch and heads),
and an optional additive ``mask`` broadcastable to ``[B, H, Sq, Sk]``. Attributes ``scale``
(float; absent: ``1 / sqrt(D)``) and ``guard_nan`` (int, 0): 1 zeroes the probabilities
the softmax makes NaN, as exports' ``Where(IsNaN(p), 0, p)`` does (a row whose scores are
all ``-inf``, or hold a NaN or ``+inf``, is NaN throughout: its output is zeros).
Output ``[B, H, Sq, Dv]`` of Q's dtype.
float16 and float32 (the mask of the same dtype); the kernel computes in float32.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt import ShapeError
from plugrt.plugin import Attr, Example, OpPlugin, TensorInfo, optional

from plugrt_contrib_attention.problem import AttentionShapes
from plugrt_contrib_attention.tactics import attention_tactics

DOMAIN = "plugrt.contrib"
OP_TYPE = "MultiHeadAttention"
OPSET = 1
DTYPES = frozenset({np.dtype(np.float16), np.dtype(np.float32)})


def _known_equal(a, b) -> bool:
    """Equal as far as inference knows: the same int, or the same symbol."""
    return a == b


def _may_differ(a, b) -> bool:
    """Both concrete and different."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def scale_of(node, d) -> float:
    """The node's ``scale``, or ``1 / sqrt(D)`` when it has none."""
    scale = node.attrs.get("scale")
    if scale is not None:
        return float(scale)
    return 1.0 / math.sqrt(int(d)) if int(d) > 0 else 1.0


class MultiHeadAttention(OpPlugin):
    """Fused scaled-dot-product attention (see the module doc)."""

    op_type = OP_TYPE
    domain = DOMAIN
    since_opset = OPSET
    version = "1.1"  # 1.1: guard_nan
    inputs = (3, 4)
    attributes = (Attr("scale", "float", None), Attr("guard_nan", "int", 0))
    dtypes = DTYPES

    def check(self, node, inputs):
        q, k, v = inputs[:3]
        mask = optional(inputs, 3)
        for name, info in (("K", k), ("V", v), ("mask", mask)):
            if info is not None and info.dtype != q.dtype:
                raise self.unsupported(node, f"{name} of dtype {info.dtype} with Q of dtype {q.dtype}",
                                       "cast every input to Q's dtype")
        for name, info in (("Q", q), ("K", k), ("V", v)):
            if info.rank != 4:
                raise self.unsupported(node, f"{name} of rank {info.rank}",
                                       "give Q, K and V as [batch, heads, sequence, head size]")
        if mask is not None and mask.rank > 4:
            raise self.unsupported(node, f"a mask of rank {mask.rank}", "give a mask broadcastable to [B, H, Sq, Sk]")

    def infer(self, node, inputs):
        q, k, v = inputs[:3]
        mask = optional(inputs, 3)
        problems = []
        if _may_differ(q.shape[3], k.shape[3]):
            problems.append(f"Q's head size {q.shape[3]} differs from K's {k.shape[3]}")
        if _may_differ(k.shape[2], v.shape[2]):
            problems.append(f"K has {k.shape[2]} keys but V has {v.shape[2]}")
        for name, info in (("K", k), ("V", v)):
            for axis, label in ((0, "batch"), (1, "heads")):
                if info.shape[axis] != 1 and _may_differ(info.shape[axis], q.shape[axis]):
                    problems.append(f"{name}'s {label} {info.shape[axis]} is neither 1 nor Q's {q.shape[axis]}")
        if mask is not None:
            scores = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            for dim, full in zip(reversed(mask.shape), reversed(scores)):
                if dim != 1 and _may_differ(dim, full):
                    problems.append(f"mask of shape {list(mask.shape)} does not broadcast to [B, H, Sq, Sk] = "
                                    f"{list(scores)}")
                    break
        if problems:
            raise ShapeError(f"{node.describe()}: " + "; ".join(problems) + "; MultiHeadAttention takes "
                             "Q [B, H, Sq, D], K [B or 1, H or 1, Sk, D], V [B or 1, H or 1, Sk, Dv] and a mask "
                             "broadcastable to [B, H, Sq, Sk]")
        return [TensorInfo(q.dtype, (q.shape[0], q.shape[1], q.shape[2], v.shape[3]))]

    def reference(self, node, inputs):
        q, k, v = (np.asarray(x, dtype=np.float64) for x in inputs[:3])
        mask = optional(inputs, 3)
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale_of(node, q.shape[3])
        if mask is not None:
            scores = scores + np.asarray(mask, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            peak = np.max(scores, axis=-1, keepdims=True)
            weights = np.exp(scores - peak)
            weights = weights / np.sum(weights, axis=-1, keepdims=True)
        if node.attrs.get("guard_nan"):
            weights = np.where(np.isnan(weights), 0.0, weights)
        out = np.matmul(weights, v)
        shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
        return [np.broadcast_to(out, shape).astype(inputs[0].dtype)]

    def tactics(self, node, inputs, outputs, epilogue=None):
        q, k, v = inputs[:3]
        mask = optional(inputs, 3)
        shapes = AttentionShapes.of(q.shape, k.shape, v.shape, None if mask is None else mask.shape)
        return attention_tactics(shapes, q.dtype, scale_of(node, q.shape[3]), guard_nan=bool(node.attrs.get("guard_nan")))

    def serialize(self, node):
        """Nothing beyond the attributes: the kernel is fully described by them and the shapes."""
        return {}

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)

        def qkv(dtype, b, h, sq, sk, d, dv, k_lead=None):
            kb, kh = k_lead or (b, h)
            return (TensorInfo(dtype, (b, h, sq, d)), TensorInfo(dtype, (kb, kh, sk, d)),
                    TensorInfo(dtype, (kb, kh, sk, dv)))

        return [
            Example(qkv(f32, 1, 2, 5, 7, 4, 4), rtol=1e-4, atol=1e-5, name="default scale, ragged tiles"),
            Example(qkv(f32, 2, 1, 4, 8, 3, 5) + (TensorInfo(f32, (2, 1, 1, 8)),), {"scale": 0.5},
                    rtol=1e-4, atol=1e-5, name="key-padding mask, Dv != D"),
            Example(qkv(f32, 1, 2, 3, 6, 4, 4, k_lead=(1, 1)) + (TensorInfo(f32, (3, 6)),), {"scale": 0.25},
                    rtol=1e-4, atol=1e-5, name="shared K/V, [Sq, Sk] mask"),
            Example(qkv(f16, 1, 1, 4, 4, 8, 8), rtol=1e-2, atol=1e-3, name="float16"),
            Example(qkv(f32, 1, 2, 4, 5, 4, 4) + (np.array([[0, 0, -np.inf, 0, 0], [-np.inf] * 5, [0] * 5,
                                                            [-np.inf, 0, 0, 0, 0]], np.float32),),
                    {"guard_nan": 1}, rtol=1e-4, atol=1e-5, name="NaN guard, a fully masked row"),
        ]
