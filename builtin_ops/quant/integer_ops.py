"""The integer anchors: ConvInteger, and QLinearConv and QLinearMatMul on the integer kernels.

ConvInteger is Conv's geometry over int8/uint8 tensors, so it is a :class:`Conv` of the
conv family (attributes, shape checks, output shapes, the float64 reference over
zero-point-shifted values, which is exact for int32 results) with integer inputs, an
int32 output and its own kernels (:mod:`.conv_integer`, ordered in :mod:`.tactics`).
It is an ``ANCHOR``: the core fuses the pointwise chain after it (a Cast to float, a
rescale, an activation, a QuantizeLinear) into its store, the epilogue receiving the
int32 accumulator.

QLinearConv and QLinearMatMul are ConvInteger and the matmul family's MatMulInteger
followed by a requantizing store: their tactics are those ops' tactics on the integer
inputs, with :mod:`.requantize`'s epilogue (then any chain fused after them).
"""

from __future__ import annotations

import numpy as np

from plugrt import ShapeError
from plugrt.kernels import no_epilogue
from plugrt.plugin import ANCHOR, Example, OpPlugin, Tactic, TensorInfo, dims, optional
from plugrt_builtin_ops.conv.ops import Conv
from plugrt_builtin_ops.matmul.ops import MatMulInteger

from .conv_integer import MAX_RANK
from .device_functions import limits
from .requantize import remapped_launches, requantizing
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

    #: The tactics at a node's geometry (ConvIntegerNHWC has its own).
    integer_tactics = staticmethod(conv_integer_tactics)

    def tactics(self, node, inputs, outputs, epilogue=None):
        """The implicit GEMM (1-D/2-D) and direct tactics (:func:`.tactics.conv_integer_tactics`);
        the epilogue receives the int32 accumulator."""
        geo = self._kernel_geometry(node, inputs[:2], outputs)
        if geo.rank > MAX_RANK:
            raise self.unsupported(node, f"{geo.rank} spatial dims on the GPU", f"the CUDA kernels take up to {MAX_RANK}")
        x_zp, w_zp = optional(inputs, 2), optional(inputs, 3)
        per_channel = w_zp is not None and _size(w_zp.shape) not in (1, None)
        return self.integer_tactics(geo, inputs[0].dtype, inputs[1].dtype, (not known_zero(x_zp), not known_zero(w_zp)),
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


def requantized(acc: np.ndarray, multiplier: np.ndarray, zero_point, dtype) -> np.ndarray:
    """ONNX's QLinear output: ``clamp(rint(acc * multiplier + zero_point))``, the product in float64."""
    low, high = limits(dtype)
    y = np.rint(acc.astype(np.float64) * multiplier.astype(np.float64) + float(np.asarray(zero_point).reshape(-1)[0]))
    return np.clip(y, low, high).astype(dtype)


def _scalar(node, name: str, info, op) -> None:
    if info is not None and _size(info.shape) not in (1, None):
        raise op.unsupported(node, f"a {name} of shape {dims.format_shape(info.shape)}",
                             f"give {name} one value (per-tensor)")


def _per_channel(node, name: str, info, channels) -> None:
    size = _size(info.shape)
    if len(info.shape) > 1 or (size not in (1, None) and isinstance(channels, int) and size != channels):
        raise ShapeError(f"{node.describe()}: {name} must be a scalar or 1-D of {channels} values, got "
                         f"{dims.format_shape(info.shape)}")


class QLinearConv(OpPlugin):
    """``y = saturate(rint((conv(x - x_zp, w - w_zp) + B) * x_scale * w_scale / y_scale) + y_zp)``:
    ConvInteger's geometry and kernels with a requantizing store; w_scale and w_zero_point
    scalars or per output channel, B int32 per output channel, y the zero point's dtype."""

    op_type = "QLinearConv"
    since_opset = 10
    inputs = (8, 9)
    groups = frozenset({ANCHOR})
    attributes = ConvInteger.attributes
    dtypes = INT8_DTYPES | {np.dtype(np.float32), np.dtype(np.int32)}

    def _conv(self, node, inputs):
        """The ConvInteger sub-node and its inputs (x, w, x_zp, w_zp)."""
        sub = node.replace(op_type="ConvInteger", inputs=tuple(node.inputs[k] for k in (0, 3, 2, 5)), opset=10)
        return sub, [inputs[k] for k in (0, 3, 2, 5)]

    def check(self, node, inputs):
        sub, ins = self._conv(node, inputs)
        ConvInteger().check(sub, ins)
        for k, name in ((1, "x_scale"), (4, "w_scale"), (6, "y_scale")):
            if inputs[k].dtype != np.float32:
                raise self.unsupported(node, f"a {name} of dtype {inputs[k].dtype}", "ONNX takes float32 scales")
        _scalar(node, "x_scale", inputs[1], self)
        _scalar(node, "y_scale", inputs[6], self)
        _scalar(node, "y_zero_point", inputs[7], self)
        _per_channel(node, "w_scale", inputs[4], inputs[3].shape[0])
        if inputs[7].dtype not in INT8_DTYPES:
            raise self.unsupported(node, f"a y_zero_point of dtype {inputs[7].dtype}", "use int8 or uint8")
        b = optional(inputs, 8)
        if b is not None and (b.dtype != np.int32 or len(b.shape) != 1):
            raise ShapeError(f"{node.describe()}: B must be 1-D int32 (one per output channel), got {b.dtype}"
                             f"{dims.format_shape(b.shape)}")

    def infer(self, node, inputs):
        sub, ins = self._conv(node, inputs)
        return [TensorInfo(inputs[7].dtype, ConvInteger().infer(sub, ins)[0].shape)]

    def reference(self, node, inputs):
        sub, ins = self._conv(node, inputs)
        acc = ConvInteger().reference(sub, ins)[0].astype(np.int64)
        channels = acc.shape[1]
        b = optional(inputs, 8)
        if b is not None:
            acc = acc + b.astype(np.int64).reshape((1, channels) + (1,) * (acc.ndim - 2))
        w_scale = np.asarray(inputs[4], np.float32).reshape(-1)
        w_scale = w_scale.reshape((1, channels) + (1,) * (acc.ndim - 2)) if w_scale.size > 1 else w_scale[0]
        x_scale, y_scale = (np.float32(np.asarray(inputs[k]).reshape(-1)[0]) for k in (1, 6))
        multiplier = np.asarray(np.float32(x_scale * w_scale) / y_scale, np.float32)
        return [requantized(acc.astype(np.int32), multiplier, inputs[7], inputs[7].dtype)]

    def tactics(self, node, inputs, outputs, epilogue=None):
        sub, ins = self._conv(node, inputs)
        out = outputs[0]
        plane = int(np.prod([int(d) for d in out.shape[2:]], dtype=np.int64))
        table = [plane, int(out.shape[1]), int(_size(inputs[4].shape) != 1), int(optional(inputs, 8) is not None)]
        inner = requantizing(epilogue or no_epilogue(len(node.inputs)), 4, np.float32, out.dtype, table)
        found = ConvInteger().tactics(sub, ins, [TensorInfo(np.int32, out.shape)], epilogue=inner)
        launches = [remapped_launches(t, (0, 3, 2, 5), (1, 4, 6, 7, 8), np.zeros(1, np.int32)) for t in found]
        return [Tactic(t.name, run, t.params, t.workspace_bytes) for t, run in zip(found, launches)]

    def examples(self):
        rng = np.random.default_rng(11)
        f32, u8, i8 = np.float32, np.uint8, np.int8
        w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(i8)
        return [
            Example((TensorInfo(u8, (1, 3, 5, 5)), f32(0.02), u8(128), w, np.linspace(0.01, 0.02, 4, dtype=f32), i8(0),
                     f32(0.5), u8(100), rng.integers(-500, 500, 4).astype(np.int32)), attrs={"pads": [1, 1, 1, 1]},
                    name="uint8, per-channel w_scale, bias"),
            Example((TensorInfo(i8, (2, 2, 6)), TensorInfo(f32, ()), TensorInfo(i8, ()), TensorInfo(i8, (2, 1, 3)),
                     TensorInfo(f32, ()), TensorInfo(i8, ()), TensorInfo(f32, ()), TensorInfo(i8, ())),
                    attrs={"group": 2, "strides": [2]}, ranges={1: (0.01, 0.1), 4: (0.01, 0.1), 6: (0.05, 0.2)},
                    name="runtime scales and zero points, 1-D grouped"),
        ]


class QLinearMatMul(OpPlugin):
    """``y = saturate(rint((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp)``:
    MatMulInteger's kernels with a requantizing store (numpy broadcasting of batch dims);
    a_scale and a_zero_point per tensor, b_scale and b_zero_point per tensor or per column
    of b, the scales float32 or float16 (the multiplier then in float16 arithmetic, as
    ONNX's reference computes it)."""

    op_type = "QLinearMatMul"
    since_opset = 10
    inputs = (8, 8)
    groups = frozenset({ANCHOR})
    dtypes = INT8_DTYPES | {np.dtype(np.float32), np.dtype(np.float16)}

    def _matmul(self, node, inputs):
        sub = node.replace(op_type="MatMulInteger", inputs=tuple(node.inputs[k] for k in (0, 3, 2, 5)), opset=10)
        return sub, [inputs[k] for k in (0, 3, 2, 5)]

    def check(self, node, inputs):
        a, b = inputs[0], inputs[3]
        for k, name in ((0, "a"), (3, "b"), (7, "y_zero_point")):
            if inputs[k].dtype not in INT8_DTYPES:
                raise self.unsupported(node, f"{name} of dtype {inputs[k].dtype}",
                                       "use int8 or uint8 (float8 has no NumPy dtype)")
        for k, zero in ((2, 0), (5, 3)):
            if inputs[k].dtype != inputs[zero].dtype:
                raise ShapeError(f"{node.describe()}: input {k}'s dtype {inputs[k].dtype} differs from its "
                                 f"tensor's {inputs[zero].dtype}")
        scales = {inputs[k].dtype for k in (1, 4, 6)}
        if len(scales) != 1 or not scales <= {np.dtype(np.float32), np.dtype(np.float16)}:
            raise self.unsupported(node, f"scales of dtypes {sorted(map(str, scales))}",
                                   "give all three scales one dtype, float32 or float16")
        for k, name in ((1, "a_scale"), (2, "a_zero_point"), (6, "y_scale"), (7, "y_zero_point")):
            _scalar(node, name, inputs[k], self)
        columns = b.shape[-1] if len(b.shape) >= 2 else 1
        _per_channel(node, "b_scale", inputs[4], columns)
        _per_channel(node, "b_zero_point", inputs[5], columns)
        MatMulInteger().infer(*self._matmul(node, inputs))  # shapes that multiply
        if len(a.shape) < 1 or len(b.shape) < 1:
            raise ShapeError(f"{node.describe()}: a and b must have rank >= 1")

    def infer(self, node, inputs):
        return [TensorInfo(inputs[7].dtype, MatMulInteger().infer(*self._matmul(node, inputs))[0].shape)]

    def reference(self, node, inputs):
        a = inputs[0].astype(np.int64) - np.asarray(inputs[2], np.int64).reshape(-1)[0]
        b = inputs[3].astype(np.int64) - np.asarray(inputs[5], np.int64).reshape(-1)
        acc = np.matmul(a, b).astype(np.int32)  # int32 wraps as the kernels' accumulator
        t = inputs[1].dtype.type
        multiplier = np.asarray(t(np.asarray(inputs[1]).reshape(-1)[0]) * np.asarray(inputs[4], t).reshape(-1)
                                / t(np.asarray(inputs[6]).reshape(-1)[0]), t)
        return [requantized(acc, multiplier if multiplier.size > 1 else multiplier[0], inputs[7], inputs[7].dtype)]

    def tactics(self, node, inputs, outputs, epilogue=None):
        sub, ins = self._matmul(node, inputs)
        out = outputs[0]
        columns = int(out.shape[-1]) if len(out.shape) else 1
        table = [1, columns, int(_size(inputs[4].shape) != 1), 0]
        inner = requantizing(epilogue or no_epilogue(len(node.inputs)), 4, inputs[1].dtype, out.dtype, table)
        found = MatMulInteger().tactics(sub, ins, [TensorInfo(np.int32, out.shape)], epilogue=inner)
        launches = [remapped_launches(t, (0, 3, 2, 5), (1, 4, 6, 7, None), np.zeros(1, np.int32)) for t in found]
        return [Tactic(t.name, run, t.params, t.workspace_bytes) for t, run in zip(found, launches)]

    def examples(self):
        f32, f16, u8, i8 = np.float32, np.float16, np.uint8, np.int8
        return [
            Example((TensorInfo(u8, (3, 5)), f32(0.05), u8(120), TensorInfo(u8, (5, 4)), f32(0.02), u8(7), f32(0.3),
                     u8(30)), name="uint8 2-D"),
            Example((TensorInfo(i8, (2, 3, 6)), f16(0.05), i8(-2), np.arange(24, dtype=i8).reshape(6, 4) - 12,
                     np.linspace(0.01, 0.04, 4).astype(f16), np.array([0, 1, -1, 2], i8), f16(0.25), i8(5)),
                    name="int8 batched, float16 scales, per-column b"),
        ]


OPS = (ConvInteger, QLinearConv, QLinearMatMul)
