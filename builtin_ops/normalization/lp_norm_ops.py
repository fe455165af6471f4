"""LpNormalization: X divided by its L1 or L2 norm along one axis. Its kernel is in
:mod:`.lp_norm`.
"""

from __future__ import annotations

import numpy as np

from plugrt import ShapeError
from plugrt.plugin import Attr, Example, TensorInfo

from .lp_norm import lp_norm_tactics
from .ops import NormOp, _shape, _wide


class LpNormalization(NormOp):
    """LpNormalization: ``X / ||X||_p`` along ``axis``, for p = 1 (sum of ``|x|``) or 2 (the
    Euclidean norm); 0 where the norm is 0 (opset 22's wording; earlier opsets leave that
    case open, and 0 is what onnxruntime gives there too)."""

    op_type = "LpNormalization"
    attributes = (Attr("axis", "int", -1), Attr("p", "int", 2))

    def check(self, node, inputs):
        p = node.attrs["p"]
        if p not in (1, 2):
            raise self.unsupported(node, f"p={p}", "LpNormalization takes p=1 or p=2")
        rank = inputs[0].rank
        if not -rank <= node.attrs["axis"] < rank:
            raise ShapeError(f"{node.describe()}: axis {node.attrs['axis']} is out of range for an input of rank "
                             f"{rank}; use an axis in [{-rank}, {rank - 1}]")

    def tactics(self, node, inputs, outputs):
        shape = _shape(inputs[0])
        return lp_norm_tactics(shape, node.attrs["axis"] % len(shape), inputs[0].dtype, node.attrs["p"])

    def reference(self, node, inputs):
        x = _wide(inputs[0])
        axis = node.attrs["axis"] % x.ndim
        if node.attrs["p"] == 1:
            norm = np.sum(np.abs(x), axis=axis, keepdims=True)
        else:
            norm = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.where(norm == 0, 0.0, x / norm)
        return [y.astype(inputs[0].dtype)]

    def examples(self):
        f32, f16, f64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
        return [Example((TensorInfo(f32, (3, 7)),), rtol=1e-5, atol=1e-6, name="float32 p=2 last axis"),
                Example((TensorInfo(f32, (2, 5, 3)),), {"axis": 1, "p": 1}, name="float32 p=1 middle axis"),
                Example((TensorInfo(f16, (4, 6)),), {"axis": 0}, rtol=3e-3, atol=3e-3, name="float16 p=2 axis 0"),
                Example((TensorInfo(f64, (3, 4)),), {"p": 1}, opset=22, name="float64 p=1")]


OPS = (LpNormalization,)
