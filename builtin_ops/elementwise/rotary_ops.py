"""RotaryEmbedding: rotary position embeddings in the "rotate half" form (LLaMA, GPT-NeoX,
Mistral), what the family's ``fuse_rotary`` pass makes of their exported subgraph."""

from __future__ import annotations

import numpy as np

from plugrt.plugin import FLOAT_DTYPES, Example, OpPlugin, TensorInfo

from . import rotary

DOMAIN = "plugrt.elementwise"


def rotate_half(x: np.ndarray) -> np.ndarray:
    """``concat(-x2, x1)`` of the last axis' halves ``x1``, ``x2``."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class RotaryEmbedding(OpPlugin):
    """``plugrt.elementwise::RotaryEmbedding``: ``Y = X * cos + rotate_half(X) * sin``.

    cos and sin are full-width tensors (last axis as X's, or 1) that broadcast
    unidirectionally to X, as Hugging Face models compute them (``[B, 1, S, D]`` against
    ``[B, H, S, D]``). ONNX's own RotaryEmbedding (opset 23) takes half-width caches and
    position ids instead, which an export does not give without proving the two halves of
    its cos equal. X's last axis must be even.
    """

    domain = DOMAIN
    op_type = "RotaryEmbedding"
    inputs = (3, 3)
    dtypes = FLOAT_DTYPES

    def check(self, node, inputs):
        x = inputs[0]
        if any(t.dtype != x.dtype for t in inputs[1:]):
            raise self.unsupported(node, f"cos/sin of dtypes {inputs[1].dtype}/{inputs[2].dtype} with X of {x.dtype}",
                                   "give all three one dtype")
        if x.rank < 1 or (isinstance(x.shape[-1], int) and x.shape[-1] % 2):
            raise ValueError(f"X's last axis must be even, got shape {tuple(x.shape)}")
        for name, table in (("cos", inputs[1]), ("sin", inputs[2])):
            if table.rank > x.rank or any(not _broadcasts(t, d) for t, d in zip(table.shape[::-1], x.shape[::-1])):
                raise ValueError(f"{name} of shape {tuple(table.shape)} does not broadcast to X's {tuple(x.shape)}")

    def infer(self, node, inputs):
        return [TensorInfo(inputs[0].dtype, inputs[0].shape)]

    def tactics(self, node, inputs, outputs):
        return rotary.rotary_tactics(*inputs)

    def reference(self, node, inputs):
        x, cos, sin = (np.asarray(a, np.float64) for a in inputs)
        y = x * cos + rotate_half(x) * sin
        return [y.astype(inputs[0].dtype)]

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
        unit = {1: (-1.0, 1.0), 2: (-1.0, 1.0)}
        table = np.linspace(-1, 1, 24, dtype=f32).reshape(3, 8)
        return [Example((TensorInfo(f32, (2, 3, 4, 8)), TensorInfo(f32, (2, 1, 4, 8)), TensorInfo(f32, (2, 1, 4, 8))),
                        ranges=unit, name="heads-broadcast"),
                Example((TensorInfo(f32, (3, 6)), TensorInfo(f32, (3, 6)), TensorInfo(f32, (3, 6))), ranges=unit),
                Example((TensorInfo(f32, (2, 2, 3, 8)), table, np.cos(table)), name="constant-tables"),
                Example((TensorInfo(f16, (1, 2, 3, 8)), TensorInfo(f16, (1, 1, 3, 8)), TensorInfo(f16, (1, 1, 3, 8))),
                        ranges=unit, rtol=2e-3, atol=2e-3, name="float16")]


def _broadcasts(size, to) -> bool:
    """Whether a dim of cos/sin may stretch to X's (symbolic dims: known at build time)."""
    return size == 1 or size == to or not (isinstance(size, int) and isinstance(to, int))


OPS = (RotaryEmbedding,)
