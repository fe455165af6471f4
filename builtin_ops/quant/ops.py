"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear (ONNX opsets 10 to 25+).

Integer targets int8, uint8, int16 and uint16; per-tensor, per-axis and blocked scales
(:mod:`.granularity`). The per-tensor forms are ``POINTWISE`` ops: their scalar device
functions (:mod:`.device_functions`) fuse into generated chains and into the epilogues
of anchors (an integer Conv or MatMul's requantizing store). Per-axis and blocked forms
run their own kernel (:mod:`.per_axis`). float8, int4/uint4, int2/uint2, float4/6 and
bfloat16 tensors are declared unsupported (NumPy has no such dtypes; the core refuses
them as inputs, :meth:`QuantizeLinear.check` as ``output_dtype`` targets).
"""

from __future__ import annotations

import numpy as np

from plugrt import ModelError
from plugrt.plugin import POINTWISE, Attr, Example, OpPlugin, TensorInfo, optional, pointwise_tactics

from . import device_functions
from .device_functions import QUANT_DTYPES, division_dtype, limits
from .dynamic import dynamic_tactic
from .granularity import TENSOR, expand, granularity
from .per_axis import per_axis_tactic

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SCALE_DTYPES = frozenset((F16, F32, F64))
#: Most elements of a constant int32 DequantizeLinear input whose value inference gives.
BIAS_VALUE_LIMIT = 1 << 16
#: TensorProto.DataType codes of the dtypes the family reads and writes.
ONNX_CODES = {1: F32, 2: np.dtype(np.uint8), 3: np.dtype(np.int8), 4: np.dtype(np.uint16),
              5: np.dtype(np.int16), 6: np.dtype(np.int32), 10: F16, 11: F64}


def type_name(code: int) -> str:
    """``FLOAT8E4M3FN`` for a TensorProto.DataType code (the number where onnx lacks it)."""
    try:
        from onnx import TensorProto

        return TensorProto.DataType.Name(code)
    except (ImportError, ValueError):
        return str(code)


def _rint(values: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.rint(values)


def quantize_values(q: np.ndarray, zero_point, target) -> np.ndarray:
    """``clamp(rint(q) + zero_point, lo, hi)`` in ``target``; NaN gives ``lo``."""
    low, high = limits(target)
    v = _rint(np.asarray(q, np.float64)) + np.asarray(zero_point, np.float64)
    v = np.where(np.isnan(v), low, np.clip(v, low, high))
    return v.astype(target)


class _LinearQuantization(OpPlugin):
    """What QuantizeLinear and DequantizeLinear share: attributes, granularity, tactics."""

    since_opset = 10
    inputs = (2, 3)
    attributes = (Attr("axis", "int", 1), Attr("block_size", "int", 0), Attr("output_dtype", "int", 0))

    def _granularity(self, node, inputs):
        x, scale, zero_point = inputs[0], inputs[1], optional(inputs, 2)
        return granularity(node, x.shape, scale.shape, None if zero_point is None else zero_point.shape)

    def _expanded(self, node, inputs):
        """The scale and zero point (0 when omitted) broadcastable to x, as arrays."""
        x, scale, zero_point = inputs[0], inputs[1], optional(inputs, 2)
        g = granularity(node, x.shape, scale.shape, None if zero_point is None else zero_point.shape)
        zero = np.zeros((), np.int64) if zero_point is None else expand(zero_point, x.shape, g)
        return expand(scale, x.shape, g), zero

    def _scalar_function(self, node, inputs):
        raise NotImplementedError

    def pointwise(self, node, inputs):
        """The per-tensor form's scalar function; ``None`` per axis or per block."""
        if self._granularity(node, inputs).kind != TENSOR:
            return None
        return self._scalar_function(node, inputs)

    def tactics(self, node, inputs, outputs, epilogue=None):
        fn = self._scalar_function(node, inputs)
        g = self._granularity(node, inputs)
        if g.kind == TENSOR:
            return pointwise_tactics(fn, inputs, outputs[0])
        return [per_axis_tactic(fn, inputs[0], inputs[1], optional(inputs, 2) is not None, g)]


class QuantizeLinear(_LinearQuantization):
    """``y = saturate(rint(x / y_scale) + y_zero_point)``, rounding half to even.

    The target is ``output_dtype``, else the zero point's dtype, else uint8. ``x / y_scale``
    is divided in ``precision`` when given, else in NumPy's promotion of the two dtypes
    (as ONNX's reference does). ``saturate`` only concerns float8 targets, which are not
    supported.
    """

    op_type = "QuantizeLinear"
    groups = frozenset({POINTWISE})
    dtypes = SCALE_DTYPES | frozenset(QUANT_DTYPES) | {np.dtype(np.int32)}
    attributes = _LinearQuantization.attributes + (Attr("saturate", "int", 1), Attr("precision", "int", 0))

    def target(self, node, inputs) -> np.dtype:
        zero_point, code = optional(inputs, 2), int(node.attrs["output_dtype"])
        if code and zero_point is not None and ONNX_CODES.get(code) != zero_point.dtype:
            raise ModelError(f"{node.describe()}: output_dtype={type_name(code)} differs from the zero point's dtype "
                             f"{zero_point.dtype}; ONNX requires them equal")
        if zero_point is not None:
            return zero_point.dtype
        return ONNX_CODES.get(code, np.dtype(np.uint8)) if code else np.dtype(np.uint8)

    def precision(self, node) -> np.dtype | None:
        code = int(node.attrs["precision"])
        return ONNX_CODES[code] if code else None

    def check(self, node, inputs):
        x, scale, zero_point = inputs[0], inputs[1], optional(inputs, 2)
        if x.dtype not in SCALE_DTYPES | {np.dtype(np.int32)}:
            raise self.unsupported(node, f"x of dtype {x.dtype}", "quantize float16, float32, float64 or int32")
        if scale.dtype not in SCALE_DTYPES | {np.dtype(np.int32)}:
            raise self.unsupported(node, f"y_scale of dtype {scale.dtype}", "use a float16 or float32 scale")
        code = int(node.attrs["output_dtype"])
        if code and ONNX_CODES.get(code) not in QUANT_DTYPES:
            raise self.unsupported(node, f"quantizing to {type_name(code)}",
                                   "quantize to INT8, UINT8, INT16 or UINT16 (float8, 4-bit and 2-bit targets "
                                   "have no NumPy dtype)")
        if zero_point is not None and zero_point.dtype not in QUANT_DTYPES:
            raise self.unsupported(node, f"a zero point of dtype {zero_point.dtype}", "use int8, uint8, int16 or uint16")
        precision = int(node.attrs["precision"])
        if precision and ONNX_CODES.get(precision) not in SCALE_DTYPES:
            raise self.unsupported(node, f"precision={type_name(precision)}", "use FLOAT, FLOAT16 or DOUBLE, or omit it")
        self.target(node, inputs)
        self._granularity(node, inputs)

    def infer(self, node, inputs):
        return [TensorInfo(self.target(node, inputs), inputs[0].shape)]

    def reference(self, node, inputs):
        x, scale = inputs[0], inputs[1]
        infos = [None if i is None else TensorInfo(i.dtype, i.shape) for i in inputs]
        target = self.target(node, infos)
        scale_x, zero_x = self._expanded(node, inputs)
        p = division_dtype(x.dtype, scale.dtype, self.precision(node))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = x.astype(p) / scale_x.astype(p)
        return [quantize_values(q, zero_x, target)]

    def _scalar_function(self, node, inputs):
        zero_point = optional(inputs, 2)
        return device_functions.quantize(inputs[0].dtype, inputs[1].dtype, self.target(node, inputs),
                                         zero_point is not None, self.precision(node))

    def examples(self):
        x = TensorInfo(F32, (2, 3, 4))
        positive = {1: (0.05, 0.5)}
        return [
            Example((x, np.float32(0.1), np.int8(-3)), name="per-tensor int8"),
            Example((x, TensorInfo(F32, ()), TensorInfo(np.uint8, ())), ranges=positive, name="runtime scale uint8"),
            Example((TensorInfo(F16, (3, 5)), np.float16(0.25)), name="float16 x, no zero point (uint8)"),
            Example((x, np.linspace(0.05, 0.2, 3, dtype=np.float32), np.array([0, 5, -5], np.int8)),
                    attrs={"axis": 1}, opset=13, name="per-axis int8"),
            Example((x, np.float32(0.01), np.int16(100)), opset=21, name="int16"),
            Example((TensorInfo(F32, (4, 6)), np.linspace(0.05, 0.3, 12, dtype=np.float32).reshape(4, 3),
                     np.arange(12, dtype=np.uint8).reshape(4, 3)),
                    attrs={"axis": 1, "block_size": 2}, opset=21, name="blocked uint8"),
            Example((TensorInfo(F32, (2, 4)), np.float32(0.125)), attrs={"output_dtype": 3}, opset=21,
                    name="output_dtype int8"),
        ]


class DequantizeLinear(_LinearQuantization):
    """``y = (x - x_zero_point) * x_scale``, in float32 (as ONNX's reference computes it),
    stored as ``output_dtype`` or else the scale's dtype.

    Not ``foldable``: constant folding must leave DequantizeLinear(int8 weight) alone, so
    the Q/DQ fusion pass sees the int8 weight and its scale and can make the anchor an
    integer one; that pass folds the DequantizeLinear nodes it leaves behind itself. An
    int32 constant (a quantized bias, which no integer anchor reads as such) is the
    exception: inference gives its dequantized value, so passes read the bias as a float
    constant.
    """

    op_type = "DequantizeLinear"
    groups = frozenset({POINTWISE})
    dtypes = SCALE_DTYPES | frozenset(QUANT_DTYPES) | {np.dtype(np.int32)}
    foldable = False

    def output(self, node, inputs) -> np.dtype:
        code = int(node.attrs["output_dtype"])
        return ONNX_CODES[code] if code else inputs[1].dtype

    def check(self, node, inputs):
        x, scale, zero_point = inputs[0], inputs[1], optional(inputs, 2)
        if x.dtype not in QUANT_DTYPES + (np.dtype(np.int32),):
            raise self.unsupported(node, f"x of dtype {x.dtype}", "dequantize int8, uint8, int16, uint16 or int32")
        if scale.dtype not in SCALE_DTYPES:
            raise self.unsupported(node, f"x_scale of dtype {scale.dtype}", "use a float16 or float32 scale")
        if zero_point is not None and zero_point.dtype != x.dtype:
            raise ModelError(f"{node.describe()}: the zero point's dtype {zero_point.dtype} differs from x's {x.dtype}; "
                             "ONNX requires them equal")
        code = int(node.attrs["output_dtype"])
        if code and ONNX_CODES.get(code) not in SCALE_DTYPES:
            raise self.unsupported(node, f"output_dtype={type_name(code)}", "use FLOAT or FLOAT16, or omit it")
        self._granularity(node, inputs)

    def infer(self, node, inputs):
        out = TensorInfo(self.output(node, inputs), inputs[0].shape)
        present = [i for i in inputs if i is not None]
        if (inputs[0].dtype == np.int32 and all(i.value is not None for i in present)
                and sum(np.size(i.value) for i in present) <= BIAS_VALUE_LIMIT):
            out = out.with_value(self.reference(node, [None if i is None else np.asarray(i.value) for i in inputs])[0])
        return [out]

    def reference(self, node, inputs):
        x = inputs[0]
        out = self.output(node, [TensorInfo(i.dtype, i.shape) if i is not None else None for i in inputs])
        scale_x, zero_x = self._expanded(node, inputs)
        wide = F64 if out == F64 else F32
        y = (x.astype(F32) - zero_x.astype(F32)) * scale_x.astype(wide)
        return [np.asarray(y.astype(out))]

    def _scalar_function(self, node, inputs):
        return device_functions.dequantize(self.output(node, inputs), optional(inputs, 2) is not None)

    def examples(self):
        x8 = TensorInfo(np.int8, (2, 3, 4))
        return [
            Example((x8, np.float32(0.1), np.int8(-3)), name="per-tensor int8"),
            Example((TensorInfo(np.uint8, (3, 4)), TensorInfo(F32, ()), TensorInfo(np.uint8, ())), name="runtime scale"),
            Example((TensorInfo(np.int32, (6,)), np.float32(0.5)), name="int32, no zero point"),
            Example((x8, np.float16(0.25), np.int8(1)), rtol=1e-3, atol=1e-3, opset=19, name="float16 scale"),
            Example((x8, np.linspace(0.05, 0.2, 3, dtype=np.float32), np.array([0, 5, -5], np.int8)),
                    attrs={"axis": 1}, opset=13, name="per-axis int8"),
            Example((TensorInfo(np.uint8, (4, 6)), np.linspace(0.05, 0.3, 12, dtype=np.float32).reshape(4, 3),
                     np.arange(12, dtype=np.uint8).reshape(4, 3)),
                    attrs={"axis": 1, "block_size": 2}, opset=21, name="blocked uint8"),
            Example((TensorInfo(np.int16, (5,)), np.float32(0.01), np.int16(-7)), opset=21, name="int16"),
        ]


class DynamicQuantizeLinear(OpPlugin):
    """x (float32) to uint8 with a scale and zero point computed from x's range widened to
    include 0: ``scale = (max - min) / 255``, ``zero_point = rint(clamp(-min / scale, 0,
    255))``, then QuantizeLinear's formula. Outputs y, y_scale (scalar), y_zero_point."""

    op_type = "DynamicQuantizeLinear"
    since_opset = 11
    outputs = (1, 3)
    dtypes = frozenset({F32})

    def infer(self, node, inputs):
        return [TensorInfo(np.uint8, inputs[0].shape), TensorInfo(F32, ()), TensorInfo(np.uint8, ())]

    def reference(self, node, inputs):
        x = inputs[0]
        high = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
        low = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
        scale = np.float32(1.0 if high == low else high - low) / np.float32(255)
        zero_point = _rint(np.clip(np.float32(0) - low / scale, 0, 255)).astype(np.uint8)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = quantize_values(x / scale, zero_point, np.uint8)
        return [y, np.asarray(scale, F32), np.asarray(zero_point)]

    def tactics(self, node, inputs, outputs, epilogue=None):
        size = int(np.prod([int(d) for d in inputs[0].shape], dtype=np.int64))
        return [dynamic_tactic(size)]

    def examples(self):
        return [Example((TensorInfo(F32, (3, 7)),), n_outputs=3, name="normal"),
                Example((TensorInfo(F32, (40,)),), n_outputs=3, ranges={0: (0.5, 3.0)}, name="positive (min 0)"),
                Example((TensorInfo(F32, (2, 5)),), n_outputs=3, ranges={0: (-3.0, -0.5)}, name="negative (max 0)")]


OPS = (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear)
