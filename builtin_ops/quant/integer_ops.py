"""The integer anchors: ConvInteger (and the QLinear ops built on the integer kernels).

ConvInteger is Conv's geometry over int8/uint8 tensors, so it is a :class:`Conv` of the
conv family (attributes, shape checks, output shapes, the float64 reference over
zero-point-shifted values, which is exact for int32 results) with integer inputs, an
int32 output and its own kernels (:mod:`.conv_integer`, ordered in :mod:`.tactics`).
It is an ``ANCHOR``: the core fuses the pointwise chain after it (a Cast to float, a
rescale, an activation, a QuantizeLinear) into its store, the epilogue receiving the
int32 accumulator.
"""

from __future__ import annotations

import numpy as np

from plugrt import ShapeError
from plugrt.kernels import no_epilogue
from plugrt.plugin import Example, TensorInfo, dims, optional
from plugrt_builtin_ops.conv.ops import Conv

from .conv_integer import MAX_RANK
from .tactics import conv_integer_tactics

INT8_DTYPES = frozenset((np.dtype(np.int8), np.dtype(np.uint8)))


def _size(shape) -> int | None:
    """Elements of a static shape, ``None`` for a symbolic one."""
    size = dims.prod(shape)
    return size if isinstance(size, int) else None


def known_zero(info) -> bool:
    """Whether an optional zero point is omitted or a constant of zeros."""
    return info is None or (info.value is not None and not np.any(np.asarray(info.value)))


class ConvInteger(Conv):
    """``y = conv(x - x_zero_point, w - w_zero_point)`` in int32: x and w int8 or uint8,
    x_zero_point a scalar, w_zero_point a scalar or one per output channel; Conv's
    attributes (auto_pad, dilations, group, kernel_shape, pads, strides), any spatial rank.
    Padding contributes zero (an input equal to its zero point)."""

    op_type = "ConvInteger"
    since_opset = 10
    inputs = (2, 4)
    dtypes = INT8_DTYPES

    def check(self, node, inputs):
        super().check(node, inputs[:2])
        x, w = inputs[0], inputs[1]
        x_zp, w_zp = optional(inputs, 2), optional(inputs, 3)
        if x_zp is not None:
            if x_zp.dtype != x.dtype:
                raise ShapeError(f"{node.describe()}: x_zero_point's dtype {x_zp.dtype} differs from x's {x.dtype}")
            if len(x_zp.shape) > 1 or _size(x_zp.shape) not in (1, None):
                raise self.unsupported(node, f"an x_zero_point of shape {dims.format_shape(x_zp.shape)}",
                                       "ONNX takes a scalar (per-tensor) input zero point")
        if w_zp is not None:
            if w_zp.dtype != w.dtype:
                raise ShapeError(f"{node.describe()}: w_zero_point's dtype {w_zp.dtype} differs from w's {w.dtype}")
            size = _size(w_zp.shape)
            if len(w_zp.shape) > 1 or (size not in (1, None) and w_zp.shape[0] != w.shape[0]):
                raise ShapeError(f"{node.describe()}: w_zero_point must be a scalar or 1-D of the {w.shape[0]} output "
                                 f"channels, got {dims.format_shape(w_zp.shape)}")

    def infer(self, node, inputs):
        shape = super().infer(node, inputs[:2])[0].shape
        return [TensorInfo(np.int32, shape)]

    def reference(self, node, inputs):
        x, w = inputs[0], inputs[1]
        x_zp, w_zp = optional(inputs, 2), optional(inputs, 3)
        xs = x.astype(np.float64) - (0.0 if x_zp is None else float(np.asarray(x_zp).reshape(-1)[0]))
        ws = w.astype(np.float64)
        if w_zp is not None:
            w_zp = np.asarray(w_zp, np.float64).reshape(-1)
            ws = ws - (w_zp.reshape((-1,) + (1,) * (w.ndim - 1)) if w_zp.size > 1 else w_zp[0])
        y = super().reference(node, [xs, ws])[0]  # exact: integer sums far below 2**53
        return [np.rint(y).astype(np.int64).astype(np.int32)]

    def fold_scale(self, node, inputs, output, scale, shift):
        return None  # a float scale does not fold into integer weights

    def tactics(self, node, inputs, outputs, epilogue=None):
        """The implicit GEMM (1-D/2-D) and direct tactics (:func:`.tactics.conv_integer_tactics`);
        the epilogue receives the int32 accumulator."""
        geo = self._kernel_geometry(node, inputs[:2], outputs)
        if geo.rank > MAX_RANK:
            raise self.unsupported(node, f"{geo.rank} spatial dims on the GPU", f"the CUDA kernels take up to {MAX_RANK}")
        x_zp, w_zp = optional(inputs, 2), optional(inputs, 3)
        per_channel = w_zp is not None and _size(w_zp.shape) not in (1, None)
        return conv_integer_tactics(geo, inputs[0].dtype, inputs[1].dtype, (not known_zero(x_zp), not known_zero(w_zp)),
                                    per_channel, epilogue or no_epilogue(len(node.inputs)))

    def examples(self):
        u8, i8 = np.uint8, np.int8
        rng = np.random.default_rng(7)
        w = rng.integers(-128, 128, (4, 3, 3, 3)).astype(i8)
        return [
            Example((TensorInfo(u8, (1, 3, 5, 5)), w, np.uint8(128), None), attrs={"pads": [1, 1, 1, 1]},
                    name="uint8 x int8 w, padded 3x3"),
            Example((TensorInfo(i8, (2, 4, 6)), rng.integers(0, 256, (6, 2, 3)).astype(u8), np.int8(-5),
                     np.arange(6, dtype=u8) * 20),
                    attrs={"group": 2, "strides": [2], "dilations": [2]}, name="1-D grouped, per-channel w zero point"),
            Example((TensorInfo(u8, (1, 2, 4, 4)), TensorInfo(u8, (3, 2, 2, 2))), attrs={"auto_pad": "SAME_UPPER"},
                    name="no zero points, SAME_UPPER"),
            Example((TensorInfo(i8, (1, 2, 3, 3, 3)), rng.integers(-128, 128, (2, 2, 2, 2, 2)).astype(i8),
                     np.int8(3), np.int8(-2)), name="3-D"),
        ]


OPS = (ConvInteger,)
