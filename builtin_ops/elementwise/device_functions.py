"""Scalar device functions of the elementwise ops, for the toolkit's broadcasting
pointwise kernel (see :func:`plugrt.plugin.pointwise_tactic`).

Each factory is cached on hashable dtypes and attribute values, so equal nodes share
one device function (and so one compiled kernel). A function computes in the scalar type
of its inputs (:func:`plugrt_builtin_ops.common.scalars.scalar_type`): float16 arrives
widened to float32, float64 stays float64, integers stay in their own type. Constants are
NumPy scalars of that type, so a GPU build never promotes fp32 math to fp64. Integer
results are converted back to their type with ``t(...)`` (Numba computes small integers
in 64 bits): the value then wraps as NumPy's does, inside a fused chain too, and the CUDA
simulator, which stores through NumPy, wraps as the GPU does. Cast's device function is
:func:`cast`.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import jit
from plugrt_builtin_ops.common.scalars import maximum, minimum, scalar_type

BOOL = np.dtype(bool)


# ---------------------------------------------------------------------- arithmetic


def _add(t):
    @jit(device=True)
    def add(a, b):
        return t(a + b)  # integers wrap in their own type (Numba computes them in 64 bits)

    return add


def _sub(t):
    @jit(device=True)
    def sub(a, b):
        return t(a - b)

    return sub


def _mul(t):
    @jit(device=True)
    def mul(a, b):
        return t(a * b)

    return mul


@jit(device=True)
def _true_div(a, b):
    return a / b


def _int_div(t):
    """Integer division truncating toward zero; x / 0 gives 0 (NumPy's result)."""
    zero, one = t(0), t(1)
    signed = np.dtype(t).kind == "i"

    @jit(device=True)
    def div(a, b):
        if b == zero:
            return zero
        q = t(a // b)
        if signed and (a < zero) != (b < zero) and t(a % b) != zero:
            q = t(q + one)
        return q

    return div


def _mod(t, fmod: int):
    """Mod: ``fmod=0`` takes the divisor's sign (np.mod), ``fmod=1`` the dividend's (C fmod)."""
    zero = t(0)
    if np.dtype(t).kind == "f":
        nan = t(np.nan)

        @jit(device=True)
        def float_mod(a, b):
            if b == zero or a - a != zero:  # C fmod's NaN cases (the simulator's math raises)
                return nan
            r = math.fmod(a, b)
            if fmod == 0 and r != zero and (r < zero) != (b < zero):
                r = r + b
            return r

        return float_mod
    signed = np.dtype(t).kind == "i"

    @jit(device=True)
    def int_mod(a, b):
        if b == zero:
            return zero
        r = t(a % b)  # floored, as Python's % on integers
        if fmod == 1 and signed and r != zero and (r < zero) != (a < zero):
            r = t(r - b)
        return r

    return int_mod


def _float_power(w, out):
    """Pow computed in the float type ``w`` (C pow; a negative base with a non-integral
    exponent is NaN), returned as ``out`` (an integer base truncates, as the reference)."""
    zero, nan = w(0), w(np.nan)
    # CUDA's pow is not correctly rounded (pow(9, 0.5) may give 2.9999999999999996);
    # an integer result truncates, so snap results within a few ulps of an integer.
    snap = np.dtype(out).kind in "iu"
    tolerance = w(8 * np.finfo(w).eps)

    @jit(device=True)
    def power(x, y):
        a, b = w(x), w(y)
        if a < zero and math.floor(b) != b:
            return out(nan)
        r = math.pow(a, b)
        if snap:
            nearest = math.floor(r + w(0.5))
            if abs(r - nearest) <= tolerance * max(abs(r), w(1)):
                r = nearest
        return out(r)

    return power


_EXPONENT_LIMIT = np.uint64(1 << 62)
_LOW_BIT = np.uint64(1)


@jit(device=True)
def _exponent(y):
    return np.int64(y)


@jit(device=True)
def _clamped_exponent(y):
    """A uint64 exponent as int64; past 2**62 clamped keeping its parity (as the reference)."""
    if y > _EXPONENT_LIMIT:
        return np.int64(_EXPONENT_LIMIT + (y & _LOW_BIT))
    return np.int64(y)


def _int_power(t, exponent_of):
    """Exact integer Pow in int64 (wrapping), square and multiply; a negative exponent
    gives the truncated real power: 1, -1 or 0."""
    one, minus_one, zero = np.int64(1), np.int64(-1), np.int64(0)

    @jit(device=True)
    def power(x, y):
        base = np.int64(x)
        e = exponent_of(y)
        if e < zero:
            if base == one:
                return t(one)
            if base == minus_one:
                return t(minus_one) if (e & one) == one else t(one)
            return t(zero)
        result = one
        while e > zero:
            if (e & one) == one:
                result = result * base
            base = base * base
            e = e >> one
        return t(result)

    return power


def _power(base: np.dtype, exponent: np.dtype):
    """Pow's function for a base and exponent dtype: float32 math for fp16/fp32 pairs,
    float64 whenever an integer or float64 takes part, exact int64 for int ** int."""
    out = scalar_type(base)
    if base.kind == "f" and exponent.kind == "f":
        return _float_power(np.float64 if np.float64 in (base, exponent) else np.float32, out)
    if base.kind == "f" or exponent.kind == "f":
        return _float_power(np.float64, out)
    return _int_power(base.type, _clamped_exponent if exponent == np.uint64 else _exponent)


def _bit_shift(t, left: bool):
    """BitShift in 64-bit registers; counts outside [0, bits) give the sign fill alone."""
    bits = np.int64(np.dtype(t).itemsize * 8)
    zero, minus_one, zero64 = t(0), t(-1) if np.dtype(t).kind == "i" else t(0), np.int64(0)
    signed = np.dtype(t).kind == "i"

    @jit(device=True)
    def shift(x, y):
        count = np.int64(y)  # uint64 counts past 2**63 turn negative: out of range too
        if count < zero64 or count >= bits:
            if left or not signed:
                return zero
            return minus_one if x < zero else zero
        if left:
            return t(np.uint64(x) << np.uint64(count))
        if signed:
            return t(np.int64(x) >> count)
        return t(np.uint64(x) >> np.uint64(count))

    return shift


def _bitwise_and(t):
    @jit(device=True)
    def bitwise_and(a, b):
        return t(a & b)

    return bitwise_and


def _bitwise_or(t):
    @jit(device=True)
    def bitwise_or(a, b):
        return t(a | b)

    return bitwise_or


def _bitwise_xor(t):
    @jit(device=True)
    def bitwise_xor(a, b):
        return t(a ^ b)

    return bitwise_xor


def _bitwise_not(t):
    @jit(device=True)
    def bitwise_not(x):
        return t(~x)  # wraps back to t whatever width Numba inverts in

    return bitwise_not


# ---------------------------------------------------------------------- variadic


def _variadic(op: str, t, arity: int):
    """Max/Min/Sum/Mean of ``arity`` scalars, generated as one flat function."""
    names = [f"x{k}" for k in range(arity)]
    lines = [f"def fn({', '.join(names)}):", "    acc = x0"]
    for name in names[1:]:
        if op == "Max":
            lines.append(f"    acc = maximum(acc, {name})")
        elif op == "Min":
            lines.append(f"    acc = minimum(acc, {name})")
        else:
            lines.append(f"    acc = acc + {name}")
    lines.append("    return acc / count" if op == "Mean" else "    return acc")
    namespace = {"maximum": maximum, "minimum": minimum, "count": t(arity)}
    exec(compile("\n".join(lines) + "\n", f"<plugrt {op}/{arity}>", "exec"), namespace)
    return jit(device=True)(namespace["fn"])


# ---------------------------------------------------------------------- select, compare, logic


@jit(device=True)
def _where(condition, x, y):
    return x if condition else y


@jit(device=True)
def _equal(a, b):
    return a == b


@jit(device=True)
def _less(a, b):
    return a < b


@jit(device=True)
def _greater(a, b):
    return a > b


@jit(device=True)
def _less_equal(a, b):
    return a <= b


@jit(device=True)
def _greater_equal(a, b):
    return a >= b


@jit(device=True)
def _and(a, b):
    return a and b


@jit(device=True)
def _or(a, b):
    return a or b


@jit(device=True)
def _xor(a, b):
    return a != b


@jit(device=True)
def _not(x):
    return not x


@jit(device=True)
def _is_nan(x):
    return x != x


def _is_inf(t, negative: bool, positive: bool):
    inf = t(np.inf)

    @jit(device=True)
    def is_inf(x):
        return (negative and x == -inf) or (positive and x == inf)

    return is_inf


_FIXED = {
    "Where": _where, "Equal": _equal, "Less": _less,
    "Greater": _greater, "LessOrEqual": _less_equal, "GreaterOrEqual": _greater_equal,
    "And": _and, "Or": _or, "Xor": _xor, "Not": _not, "IsNaN": _is_nan,
}


#: op type -> builder taking the scalar type (the result converted back to it).
_IN_TYPE = {
    "Add": _add, "Sub": _sub, "Mul": _mul,
    "BitwiseAnd": _bitwise_and, "BitwiseOr": _bitwise_or, "BitwiseXor": _bitwise_xor, "BitwiseNot": _bitwise_not,
}


@functools.lru_cache(maxsize=None)
def device_function(op: str, dtypes: tuple, params: tuple = ()):
    """The scalar device function of elementwise op ``op`` for inputs of ``dtypes``.

    :param params: the attribute values the math depends on (Mod: ``(fmod,)``,
        BitShift: ``(direction,)``, IsInf: ``(detect_negative, detect_positive)``).
    """
    dtypes = tuple(np.dtype(d) for d in dtypes)
    t = scalar_type(dtypes[0])
    if op in _FIXED:
        return _FIXED[op]
    if op in _IN_TYPE:
        return _IN_TYPE[op](t)
    if op == "Div":
        return _true_div if dtypes[0].kind == "f" else _int_div(t)
    if op == "Mod":
        return _mod(t, int(params[0]))
    if op == "Pow":
        return _power(dtypes[0], dtypes[1])
    if op == "BitShift":
        return _bit_shift(t, params[0] == "LEFT")
    if op in ("Max", "Min", "Sum", "Mean"):
        return _variadic(op, t, len(dtypes))
    if op == "IsInf":
        return _is_inf(t, bool(params[0]), bool(params[1]))
    raise KeyError(f"no elementwise device function for {op}")


@jit(device=True)
def _identity(x):
    return x


@functools.lru_cache(maxsize=None)
def cast(source, target):
    """Cast's device function, returning the target's value in its pointwise type (float16
    rounded, then carried as float32). To bool: compare with zero (NaN is True); to an
    integer: float truncates toward zero, integers wrap; to a float: round to nearest.
    Converting explicitly (rather than leaving it to the kernel's store) keeps the value
    exact inside fused chains and makes the simulator wrap as the GPU does."""
    source, target = np.dtype(source), np.dtype(target)
    if target == BOOL:
        return _identity if source == BOOL else _nonzero(scalar_type(source))
    if target == np.float16:
        return _to_half
    return _convert(target.type)


@jit(device=True)
def _to_half(x):
    return np.float32(np.float16(x))


def _nonzero(t):
    zero = t(0)

    @jit(device=True)
    def nonzero(x):
        return x != zero

    return nonzero


def _convert(t):
    @jit(device=True)
    def convert(x):
        return t(x)

    return convert
