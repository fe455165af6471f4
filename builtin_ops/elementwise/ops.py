"""Elementwise ops with NumPy-style broadcasting: arithmetic (Add, Div, Pow, Mod, BitShift,
...), bitwise (BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot), variadic (Max, Min, Sum,
Mean) and Where; and the :class:`ElementwiseOp` base and input checks the family's other
op modules share (comparisons, logic, IsNaN and IsInf are in :mod:`.predicate_ops`, Cast
and CastLike in :mod:`.cast_ops`; the device functions of all of them in
:mod:`.device_functions`).

The binary ops are claimed from opset 7, where multidirectional broadcasting replaced the
legacy ``broadcast``/``axis`` attributes; the variadic ops from opset 6.
"""

from __future__ import annotations

import numpy as np

from plugrt import ModelError, ShapeError
from plugrt.plugin import (FLOAT_DTYPES, INT_DTYPES, NUMERIC_DTYPES, POINTWISE, REQUIRED, VARIADIC, Attr, Example,
                           OpPlugin, Scale, TensorInfo, dims)

from . import device_functions

BOOL = np.dtype(bool)
BOOL_DTYPES = frozenset({BOOL})
_POW_BASE_DTYPES = FLOAT_DTYPES | {np.dtype("int32"), np.dtype("int64")}


def broadcast_shape(node, inputs) -> tuple:
    """The multidirectional broadcast of the inputs' shapes (symbolic dims allowed)."""
    try:
        return dims.broadcast([i.shape for i in inputs])
    except ValueError as exc:
        shapes = ", ".join(dims.format_shape(i.shape) for i in inputs)
        raise ShapeError(f"{node.describe()}: input shapes {shapes} do not broadcast ({exc})") from None


def require_inputs(op: OpPlugin, node, inputs) -> None:
    """Every input present and their count within ``op.inputs`` (the core leaves this to ops)."""
    low, high = op.inputs
    if not low <= len(inputs) <= high or any(i is None for i in inputs):
        count = f"{low}" if low == high else f"{low} or more" if high >= VARIADIC else f"{low} to {high}"
        raise ModelError(f"{node.describe()}: takes {count} non-empty inputs, got {len(inputs)}: "
                         + ", ".join(repr(n) for n in node.inputs))


def require_same_dtype(node, inputs, indices) -> None:
    dtypes = [inputs[i].dtype for i in indices if inputs[i] is not None]
    if len(set(dtypes)) > 1:
        raise ModelError(f"{node.describe()}: inputs {list(indices)} must share one dtype, got "
                         + ", ".join(str(d) for d in dtypes))


class ElementwiseOp(OpPlugin):
    """A broadcasting pointwise op. Subclasses implement :meth:`compute` on NumPy arrays.

    ``same_dtype`` lists the inputs that must share a dtype (``None``: all of them);
    :meth:`out_dtype` gives the output dtype (default: input 0's).
    """

    groups = frozenset({POINTWISE})
    inputs = (2, 2)
    same_dtype: tuple | None = None

    def check(self, node, inputs):
        require_inputs(self, node, inputs)
        indices = range(len(inputs)) if self.same_dtype is None else self.same_dtype
        require_same_dtype(node, inputs, indices)

    def out_dtype(self, node, dtypes: list) -> np.dtype:
        return dtypes[0]

    def infer(self, node, inputs):
        dtype = self.out_dtype(node, [i.dtype for i in inputs])
        return [TensorInfo(dtype, broadcast_shape(node, inputs))]

    def reference(self, node, inputs):
        dtype = self.out_dtype(node, [x.dtype for x in inputs])
        shape = np.broadcast_shapes(*(np.shape(x) for x in inputs))
        with np.errstate(all="ignore"):
            out = np.asarray(self.compute(node, *inputs)).astype(dtype, copy=False)
        if out.shape != shape:
            out = np.broadcast_to(out, shape).copy()
        elif any(out is x for x in inputs):  # e.g. a single-input Max: never alias an input
            out = out.copy()
        return [out]

    def compute(self, node, *xs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def kernel_params(self, node) -> tuple:
        """The attribute values the device function depends on (its cache key)."""
        return ()

    def pointwise(self, node, inputs):
        dtypes = tuple(i.dtype for i in inputs)
        return device_functions.device_function(self.op_type, dtypes, self.kernel_params(node))


# ---------------------------------------------------------------------- arithmetic


def constant_operand(node, inputs) -> tuple[int, np.ndarray] | None:
    """``(k, c)`` when input ``k`` has the output's shape and the other input is the
    constant ``c`` (float64): the binary float op is then a scale of input ``k``.
    Input 0 is tried first; ``None`` when neither fits (or the dtype is not a float)."""
    if len(inputs) != 2 or any(i is None for i in inputs) or inputs[0].dtype not in FLOAT_DTYPES:
        return None
    shape = broadcast_shape(node, inputs)
    for k in (0, 1):
        x, c = inputs[k], inputs[1 - k]
        if c.value is not None and tuple(x.shape) == tuple(shape):
            return k, np.array(c.value, dtype=np.float64)  # a copy: never the initializer itself
    return None


_ZERO, _ONE = np.zeros(()), np.ones(())
_ZERO.setflags(write=False)  # shared by every Scale returned: never written
_ONE.setflags(write=False)


class Add(ElementwiseOp):
    op_type = "Add"
    commutative = True
    since_opset = 7
    dtypes = NUMERIC_DTYPES

    def compute(self, node, a, b):
        return np.add(a, b)

    def as_scale(self, node, inputs):
        found = constant_operand(node, inputs)
        return None if found is None else Scale(found[0], _ONE, found[1])

    def examples(self):
        f32, f16 = np.float32, np.float16
        return [Example((TensorInfo(f32, (2, 3)), TensorInfo(f32, (3,)))),
                Example((TensorInfo(f32, (2, 1)), np.linspace(-1, 1, 3, dtype=f32).reshape(1, 3))),
                Example((TensorInfo(np.int64, (4,)), TensorInfo(np.int64, (4,)))),
                Example((TensorInfo(f16, (2, 3)), TensorInfo(f16, (2, 3))), rtol=1e-3, atol=1e-3)]


class Sub(ElementwiseOp):
    op_type = "Sub"
    since_opset = 7
    dtypes = NUMERIC_DTYPES

    def compute(self, node, a, b):
        return np.subtract(a, b)

    def as_scale(self, node, inputs):
        """x - c is a shift by -c; c - x a scale by -1 and a shift by c."""
        found = constant_operand(node, inputs)
        if found is None:
            return None
        k, c = found
        return Scale(0, _ONE, -c) if k == 0 else Scale(1, -_ONE, c)


class Mul(ElementwiseOp):
    op_type = "Mul"
    commutative = True
    since_opset = 7
    dtypes = NUMERIC_DTYPES

    def compute(self, node, a, b):
        return np.multiply(a, b)

    def as_scale(self, node, inputs):
        found = constant_operand(node, inputs)
        return None if found is None else Scale(found[0], found[1], _ZERO)


def trunc_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero (C semantics), in integer arithmetic."""
    q = np.floor_divide(a, b)
    if a.dtype.kind == "u":
        return q
    inexact = (np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0))
    return q + inexact.astype(q.dtype)


class Div(ElementwiseOp):
    """Div; integer inputs divide with truncation toward zero (test_div_int32_trunc)."""

    op_type = "Div"
    since_opset = 7
    dtypes = NUMERIC_DTYPES

    def compute(self, node, a, b):
        if a.dtype.kind in "iu":
            return trunc_divide(a, b)
        return np.divide(a, b)

    def as_scale(self, node, inputs):
        """x / c is a scale by 1/c when c is a finite nonzero constant divisor."""
        found = constant_operand(node, inputs)
        if found is None or found[0] != 0 or not np.all(np.isfinite(found[1]) & (found[1] != 0)):
            return None
        return Scale(0, 1.0 / found[1], _ZERO)


def _int_exponent(y: np.ndarray) -> np.ndarray:
    """An integer exponent as int64; huge uint64 values are clamped keeping their parity."""
    if y.dtype == np.uint64:
        limit = np.uint64(1 << 62)
        y = np.where(y > limit, limit + (y & np.uint64(1)), y)
    return y.astype(np.int64)


class Pow(ElementwiseOp):
    """Pow: base T (float, int32, int64), exponent T1 (any numeric); output T.

    A float base or exponent computes in float64 and casts (truncating for an integer
    base); integer ** integer stays exact (wrapping), negative exponents give the
    truncated result of the real power (1, -1 or 0).
    """

    op_type = "Pow"
    since_opset = 7
    dtypes = NUMERIC_DTYPES

    def check(self, node, inputs):
        require_inputs(self, node, inputs)
        if node.opset < 12:
            require_same_dtype(node, inputs, (0, 1))
        self.require_dtypes(node, inputs, _POW_BASE_DTYPES, which=(0,))

    def compute(self, node, x, y):
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            return np.power(x.astype(np.float64), y.astype(np.float64))
        e = _int_exponent(y)
        x = x.astype(np.int64)
        negative = e < 0
        out = np.power(x, np.where(negative, 0, e))
        if not negative.any():
            return out
        odd = (e & 1) == 1
        reciprocal = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0))
        return np.where(negative, reciprocal, out)


class Mod(ElementwiseOp):
    """Mod: ``fmod=0`` floors (sign of the divisor), ``fmod=1`` truncates (C fmod)."""

    op_type = "Mod"
    since_opset = 10
    dtypes = NUMERIC_DTYPES
    attributes = (Attr("fmod", "int", 0),)

    def check(self, node, inputs):
        super().check(node, inputs)
        if node.attrs["fmod"] not in (0, 1):
            raise self.unsupported(node, f"fmod={node.attrs['fmod']}", "fmod must be 0 or 1")

    def compute(self, node, a, b):
        return np.fmod(a, b) if node.attrs["fmod"] == 1 else np.mod(a, b)

    def kernel_params(self, node):
        return (node.attrs["fmod"],)


class BitShift(ElementwiseOp):
    """BitShift: arithmetic right shift for signed types; shifts < 0 or >= the bit width
    give the sign fill alone (-1 for a right shift of a negative value, else 0)."""

    op_type = "BitShift"
    since_opset = 11
    dtypes = INT_DTYPES
    attributes = (Attr("direction", "string", REQUIRED),)

    def check(self, node, inputs):
        super().check(node, inputs)
        if node.attrs["direction"] not in ("LEFT", "RIGHT"):
            raise self.unsupported(node, f"direction={node.attrs['direction']!r}", "use 'LEFT' or 'RIGHT'")

    def compute(self, node, x, y):
        bits = x.dtype.itemsize * 8
        count = y.astype(np.int64)  # uint64 counts past 2**63 turn negative: out of range too
        valid = (count >= 0) & (count < bits)
        count = np.where(valid, count, 0).astype(x.dtype)
        if node.attrs["direction"] == "LEFT":
            return np.where(valid, np.left_shift(x, count), 0)
        fill = np.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
        return np.where(valid, np.right_shift(x, count), fill)

    def kernel_params(self, node):
        return (node.attrs["direction"],)


def _bitwise_examples(arity: int) -> list:
    """Integer cases of a bitwise op drawn across the sign bit; a broadcast pair for a binary."""
    def case(dtype, *shapes, low=-100, high=100):
        inputs = tuple(TensorInfo(dtype, shape) for shape in shapes[:arity])
        return Example(inputs, ranges={k: (low, high) for k in range(arity)})

    return [case(np.int32, (2, 3), (3,)), case(np.int8, (4,), (4,)), case(np.int64, (2, 1), (1, 3)),
            case(np.uint8, (5,), (1,), low=0, high=256), case(np.uint64, (3,), (3,), low=0, high=1 << 40)]


class BitwiseAnd(ElementwiseOp):
    op_type = "BitwiseAnd"
    commutative = True
    since_opset = 18
    dtypes = INT_DTYPES

    def compute(self, node, a, b):
        return np.bitwise_and(a, b)

    def examples(self):
        return _bitwise_examples(2)


class BitwiseOr(ElementwiseOp):
    op_type = "BitwiseOr"
    commutative = True
    since_opset = 18
    dtypes = INT_DTYPES

    def compute(self, node, a, b):
        return np.bitwise_or(a, b)

    def examples(self):
        return _bitwise_examples(2)


class BitwiseXor(ElementwiseOp):
    op_type = "BitwiseXor"
    commutative = True
    since_opset = 18
    dtypes = INT_DTYPES

    def compute(self, node, a, b):
        return np.bitwise_xor(a, b)

    def examples(self):
        return _bitwise_examples(2)


class BitwiseNot(ElementwiseOp):
    op_type = "BitwiseNot"
    since_opset = 18
    inputs = (1, 1)
    dtypes = INT_DTYPES

    def compute(self, node, x):
        return np.bitwise_not(x)

    def examples(self):
        return _bitwise_examples(1)


# ---------------------------------------------------------------------- variadic


class VariadicOp(ElementwiseOp):
    """Max, Min, Sum, Mean: one or more inputs of one dtype, broadcast together."""

    since_opset = 6
    inputs = (1, VARIADIC)


class Max(VariadicOp):
    op_type = "Max"
    dtypes = NUMERIC_DTYPES

    def compute(self, node, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = np.maximum(out, x)
        return out


class Min(VariadicOp):
    op_type = "Min"
    dtypes = NUMERIC_DTYPES

    def compute(self, node, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = np.minimum(out, x)
        return out


class Sum(VariadicOp):
    op_type = "Sum"
    dtypes = FLOAT_DTYPES

    def compute(self, node, *xs):
        out = xs[0].astype(np.float64)
        for x in xs[1:]:
            out = out + x.astype(np.float64)
        return out


class Mean(VariadicOp):
    op_type = "Mean"
    dtypes = FLOAT_DTYPES

    def compute(self, node, *xs):
        out = xs[0].astype(np.float64)
        for x in xs[1:]:
            out = out + x.astype(np.float64)
        return out / len(xs)


class Where(ElementwiseOp):
    """Where(condition, X, Y): X where condition else Y; output of X's dtype."""

    op_type = "Where"
    since_opset = 9
    inputs = (3, 3)
    same_dtype = (1, 2)

    def check(self, node, inputs):
        super().check(node, inputs)
        if inputs[0].dtype != BOOL:
            raise ModelError(f"{node.describe()}: condition must be bool, got {inputs[0].dtype}")

    def out_dtype(self, node, dtypes):
        return dtypes[1]

    def compute(self, node, condition, x, y):
        return np.where(condition, x, y)


OPS = (Add, Sub, Mul, Div, Pow, Mod, BitShift, BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot, Max, Min, Sum, Mean,
       Where)
