"""Activations and other unary pointwise ops (Relu, Sigmoid, Gelu, Exp, Abs, ...)."""

from __future__ import annotations

import math

import numpy as np

from plugrt.plugin import FLOAT_DTYPES, NUMERIC_DTYPES, POINTWISE, Attr, Example, OpPlugin, TensorInfo, optional

from . import device_functions

_SIGNED = FLOAT_DTYPES | {np.dtype(t) for t in ("int8", "int16", "int32", "int64")}
_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """Exact elementwise erf (NumPy has none); returns x's dtype."""
    # frompyfunc gives a bare Python float for a 0-d input: asarray keeps it an array.
    return np.asarray(_erf(x.astype(np.float64)), dtype=np.float64).astype(x.dtype)


class UnaryOp(OpPlugin):
    """A pointwise op with one input and one output of the same dtype and shape.

    Subclasses implement :meth:`compute` on a NumPy array (computing in float64 where
    precision matters and casting back). Their CUDA tactic is the pointwise kernel of
    :func:`device_functions.device_function`, which takes the op's attribute values in
    declaration order.
    """

    groups = frozenset({POINTWISE})
    dtypes = FLOAT_DTYPES

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]

    def reference(self, node, inputs):
        x = inputs[0]
        return [np.asarray(self.compute(node, x)).astype(x.dtype, copy=False)]

    def compute(self, node, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def pointwise(self, node, inputs):
        params = tuple(node.attrs[a.name] for a in self.attributes)
        return device_functions.device_function(self.op_type, inputs[0].dtype, params)


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


class Relu(UnaryOp):
    op_type = "Relu"
    dtypes = _SIGNED

    def compute(self, node, x):
        return np.maximum(x, x.dtype.type(0))

    def examples(self):
        return [Example((TensorInfo(np.float32, (2, 5)),)), Example((TensorInfo(np.float16, (3, 4)),)),
                Example((TensorInfo(np.int32, (7,)),))]


class LeakyRelu(UnaryOp):
    op_type = "LeakyRelu"
    attributes = (Attr("alpha", "float", 0.01),)

    def compute(self, node, x):
        return np.where(x >= 0, x, _wide(x) * node.attrs["alpha"])


class Sigmoid(UnaryOp):
    op_type = "Sigmoid"

    def compute(self, node, x):
        return 1.0 / (1.0 + np.exp(-_wide(x)))


class Swish(UnaryOp):
    """Swish (opset 24): ``x * sigmoid(alpha * x)``; SiLU at alpha 1 (what the family's
    ``fuse_swish`` makes of ``x * Sigmoid(x)``)."""

    op_type = "Swish"
    since_opset = 24
    attributes = (Attr("alpha", "float", 1.0),)

    def compute(self, node, x):
        x = _wide(x)
        return x / (1.0 + np.exp(-node.attrs["alpha"] * x))

    def examples(self):
        return [Example((TensorInfo(np.float32, (2, 5)),), opset=24),
                Example((TensorInfo(np.float32, (3, 4)),), {"alpha": 1.702}, opset=24, name="quick-gelu"),
                Example((TensorInfo(np.float16, (2, 8)),), opset=24, rtol=2e-3, atol=2e-3)]


class HardSigmoid(UnaryOp):
    op_type = "HardSigmoid"
    attributes = (Attr("alpha", "float", 0.2), Attr("beta", "float", 0.5))

    def compute(self, node, x):
        return np.clip(node.attrs["alpha"] * _wide(x) + node.attrs["beta"], 0.0, 1.0)


class HardSwish(UnaryOp):
    op_type = "HardSwish"
    since_opset = 14

    def compute(self, node, x):
        x = _wide(x)
        return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)


class Tanh(UnaryOp):
    op_type = "Tanh"

    def compute(self, node, x):
        return np.tanh(_wide(x))


class Elu(UnaryOp):
    op_type = "Elu"
    attributes = (Attr("alpha", "float", 1.0),)

    def compute(self, node, x):
        x = _wide(x)
        return np.where(x > 0, x, node.attrs["alpha"] * np.expm1(np.minimum(x, 0.0)))


class Selu(UnaryOp):
    op_type = "Selu"
    attributes = (
        Attr("alpha", "float", 1.67326319217681884765625),
        Attr("gamma", "float", 1.05070102214813232421875),
    )

    def compute(self, node, x):
        x = _wide(x)
        alpha, gamma = node.attrs["alpha"], node.attrs["gamma"]
        return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0)))


class Celu(UnaryOp):
    op_type = "Celu"
    since_opset = 12
    attributes = (Attr("alpha", "float", 1.0),)

    def compute(self, node, x):
        x = _wide(x)
        alpha = node.attrs["alpha"]
        return np.maximum(x, 0.0) + np.minimum(0.0, alpha * np.expm1(x / alpha))


class ThresholdedRelu(UnaryOp):
    op_type = "ThresholdedRelu"
    since_opset = 10
    attributes = (Attr("alpha", "float", 1.0),)

    def compute(self, node, x):
        return np.where(x > node.attrs["alpha"], x, 0)

    def pointwise(self, node, inputs):
        # The reference compares in x's dtype (alpha is a weak Python scalar): round alpha so.
        alpha = np.asarray(node.attrs["alpha"], dtype=inputs[0].dtype).item()
        return device_functions.device_function(self.op_type, inputs[0].dtype, (alpha,))


class Gelu(UnaryOp):
    op_type = "Gelu"
    since_opset = 20
    attributes = (Attr("approximate", "string", "none"),)

    def check(self, node, inputs):
        if node.attrs["approximate"] not in ("none", "tanh"):
            raise self.unsupported(node, f"approximate={node.attrs['approximate']!r}", "use 'none' or 'tanh'")

    def compute(self, node, x):
        x = _wide(x)
        if node.attrs["approximate"] == "tanh":
            return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))

    def examples(self):
        f32, f16 = np.float32, np.float16
        return [Example((TensorInfo(f32, (2, 5)),), opset=20),
                Example((TensorInfo(f32, (3, 4)),), {"approximate": "tanh"}, opset=20, name="tanh"),
                Example((TensorInfo(f16, (2, 8)),), {"approximate": "tanh"}, opset=20, rtol=2e-3, atol=2e-3,
                        name="tanh-float16")]


class Erf(UnaryOp):
    op_type = "Erf"
    since_opset = 9

    def compute(self, node, x):
        return erf(_wide(x))


class Softplus(UnaryOp):
    op_type = "Softplus"

    def compute(self, node, x):
        return np.logaddexp(0.0, _wide(x))


class Softsign(UnaryOp):
    op_type = "Softsign"

    def compute(self, node, x):
        x = _wide(x)
        return x / (1.0 + np.abs(x))


class Mish(UnaryOp):
    op_type = "Mish"
    since_opset = 18

    def compute(self, node, x):
        x = _wide(x)
        return x * np.tanh(np.logaddexp(0.0, x))


class Exp(UnaryOp):
    op_type = "Exp"

    def compute(self, node, x):
        return np.exp(_wide(x))


class Log(UnaryOp):
    op_type = "Log"

    def compute(self, node, x):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(_wide(x))


class Sqrt(UnaryOp):
    op_type = "Sqrt"

    def compute(self, node, x):
        with np.errstate(invalid="ignore"):
            return np.sqrt(_wide(x))


class Reciprocal(UnaryOp):
    op_type = "Reciprocal"

    def compute(self, node, x):
        with np.errstate(divide="ignore"):
            return 1.0 / _wide(x)


class Neg(UnaryOp):
    op_type = "Neg"
    dtypes = _SIGNED

    def compute(self, node, x):
        return np.negative(x)


class Abs(UnaryOp):
    op_type = "Abs"
    dtypes = NUMERIC_DTYPES

    def compute(self, node, x):
        return np.abs(x)


class Sign(UnaryOp):
    op_type = "Sign"
    since_opset = 9
    dtypes = NUMERIC_DTYPES

    def compute(self, node, x):
        return np.sign(x)


class Floor(UnaryOp):
    op_type = "Floor"

    def compute(self, node, x):
        return np.floor(x)


class Ceil(UnaryOp):
    op_type = "Ceil"

    def compute(self, node, x):
        return np.ceil(x)


class Round(UnaryOp):
    op_type = "Round"
    since_opset = 11

    def compute(self, node, x):
        return np.round(x)  # half to even, as ONNX specifies


class Sin(UnaryOp):
    op_type = "Sin"
    since_opset = 7

    def compute(self, node, x):
        return np.sin(_wide(x))


class Cos(UnaryOp):
    op_type = "Cos"
    since_opset = 7

    def compute(self, node, x):
        return np.cos(_wide(x))


class Shrink(UnaryOp):
    """Shrink: x + bias below -lambd, x - bias above lambd, else 0. As ONNX's reference,
    a float x compares and shifts in its own type, an integer x in float64 (truncated back)."""

    op_type = "Shrink"
    since_opset = 9
    dtypes = NUMERIC_DTYPES
    attributes = (Attr("bias", "float", 0.0), Attr("lambd", "float", 0.5))

    def compute(self, node, x):
        bias, lambd = node.attrs["bias"], node.attrs["lambd"]
        return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))

    def pointwise(self, node, inputs):
        # A float x meets bias and lambd as weak Python scalars: round them to its dtype.
        dtype = inputs[0].dtype
        attr_type = dtype if dtype.kind == "f" else np.dtype(np.float64)
        params = tuple(np.asarray(node.attrs[a], dtype=attr_type).item() for a in ("bias", "lambd"))
        return device_functions.device_function(self.op_type, dtype, params)

    def examples(self):
        f32, f16 = np.float32, np.float16
        return [Example((TensorInfo(f32, (2, 5)),)),
                Example((TensorInfo(f16, (3, 4)),), {"bias": 0.25, "lambd": 0.75}, rtol=2e-3, atol=2e-3),
                Example((TensorInfo(np.int32, (6,)),), {"bias": 1.0, "lambd": 1.5}, ranges={0: (-9, 10)}),
                Example((TensorInfo(np.uint8, (6,)),), {"bias": 1.0, "lambd": 1.5}, ranges={0: (2, 200)})]


class Clip(UnaryOp):
    """Clip: bounds are attributes before opset 11 and optional inputs from 11 on."""

    op_type = "Clip"
    dtypes = NUMERIC_DTYPES
    inputs = (1, 3)
    attributes = (Attr("min", "float", -3.4028234663852886e38), Attr("max", "float", 3.4028234663852886e38))

    def reference(self, node, inputs):
        x = inputs[0]
        if node.opset < 11:
            low, high = node.attrs["min"], node.attrs["max"]
        else:
            low, high = optional(inputs, 1), optional(inputs, 2)
        out = x
        if low is not None:
            out = np.maximum(out, np.asarray(low, dtype=x.dtype))
        if high is not None:
            out = np.minimum(out, np.asarray(high, dtype=x.dtype))
        return [np.asarray(out, dtype=x.dtype)]

    def forwards(self, node, inputs):
        """Input 0 when neither bound can clip a value of the dtype (absent, or at or past
        the dtype's extremes)."""
        dtype = inputs[0].dtype
        info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
        if node.opset < 11:
            low, high = node.attrs["min"], node.attrs["max"]
        else:
            low, high = (None if i is None else i.value for i in (optional(inputs, 1), optional(inputs, 2)))
            if (optional(inputs, 1) is not None and low is None) or (optional(inputs, 2) is not None and high is None):
                return None
        low_ok = low is None or float(np.asarray(low).reshape(-1)[0]) <= info.min
        high_ok = high is None or float(np.asarray(high).reshape(-1)[0]) >= info.max
        return 0 if low_ok and high_ok else None

    def pointwise(self, node, inputs):
        dtype = inputs[0].dtype
        if node.opset < 11:
            low, high = (np.asarray(node.attrs[k], dtype=dtype).item() for k in ("min", "max"))
            params = (False, False, low, high)
        else:
            params = (optional(inputs, 1) is not None, optional(inputs, 2) is not None)
        return device_functions.device_function("Clip", dtype, params)


class PRelu(OpPlugin):
    """PRelu: slope broadcast unidirectionally to the input."""

    op_type = "PRelu"
    inputs = (2, 2)
    groups = frozenset({POINTWISE})
    dtypes = FLOAT_DTYPES | {np.dtype(t) for t in ("int32", "int64", "uint32", "uint64")}

    def infer(self, node, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, x.shape)]

    def reference(self, node, inputs):
        x, slope = inputs
        return [np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)]

    def pointwise(self, node, inputs):
        return device_functions.device_function("PRelu", inputs[0].dtype)


OPS = (
    Relu, LeakyRelu, PRelu, Sigmoid, Swish, HardSigmoid, HardSwish, Tanh, Elu, Selu, Celu,
    ThresholdedRelu, Gelu, Erf, Softplus, Softsign, Mish, Exp, Log, Sqrt, Reciprocal,
    Neg, Abs, Sign, Floor, Ceil, Round, Sin, Cos, Shrink, Clip,
)
