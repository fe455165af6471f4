"""Scalar device functions of the activations and other unary ops, for the toolkit's
broadcasting pointwise kernel (see :func:`plugrt.plugin.pointwise_tactic`).

:func:`device_function` builds one per (op, dtype, attribute values) and caches it.
float16 arrives widened to float32 and computes in float32, float64 in float64; the
integer ops (Relu, Neg, Abs, Sign, Clip, PRelu) stay in their type, Shrink computes an
integer in float64. Every constant is a NumPy scalar of the compute type ``t``, so fp32
code never promotes to fp64. The trigonometric and hyperbolic ops' builders live in
:mod:`.trigonometric`; the dispatch here includes them.

The guards on domain edges (Log and Sqrt of negatives, Floor/Ceil/Round of non-finite
or already integral values) give the GPU's answer explicitly, so the CUDA simulator,
which runs ``math`` on the host and raises there, agrees with the GPU.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import jit
from plugrt_builtin_ops.common.scalars import maximum, minimum, scalar_type

from . import trigonometric


def _integral_limit(t):
    """The magnitude from which every float of type ``t`` is an integer."""
    return t(2.0**23) if t == np.float32 else t(2.0**52)


# ---------------------------------------------------------------------- rectifiers


def _relu(t):
    zero = t(0)

    @jit(device=True)
    def relu(x):
        return zero if x < zero else x  # NaN stays NaN, as np.maximum

    return relu


def _leaky_relu(t, alpha):
    zero, alpha = t(0), t(alpha)

    @jit(device=True)
    def leaky_relu(x):
        return x if x >= zero else x * alpha

    return leaky_relu


def _thresholded_relu(t, alpha):
    zero, alpha = t(0), t(alpha)

    @jit(device=True)
    def thresholded_relu(x):
        return x if x > alpha else zero

    return thresholded_relu


def _elu(t, alpha):
    zero, alpha = t(0), t(alpha)

    @jit(device=True)
    def elu(x):
        return x if x > zero else alpha * math.expm1(x)

    return elu


def _selu(t, alpha, gamma):
    zero, alpha, gamma = t(0), t(alpha), t(gamma)

    @jit(device=True)
    def selu(x):
        return gamma * x if x > zero else gamma * (alpha * math.expm1(x))

    return selu


def _celu(t, alpha):
    zero, alpha = t(0), t(alpha)

    @jit(device=True)
    def celu(x):
        return maximum(x, zero) + minimum(zero, alpha * math.expm1(x / alpha))

    return celu


def _shrink(t, bias, lambd):
    """Shrink; an integer x compares and shifts in float64 and truncates back, as the reference."""
    w = t if np.dtype(t).kind == "f" else np.float64
    zero, bias, lambd = t(0), w(bias), w(lambd)

    @jit(device=True)
    def shrink(x):
        v = w(x)
        if v < -lambd:
            return t(v + bias)
        if v > lambd:
            return t(v - bias)
        return zero

    return shrink


def _prelu(t):
    zero = t(0)

    @jit(device=True)
    def prelu(x, slope):
        return t(x * slope) if x < zero else x

    return prelu


# ---------------------------------------------------------------------- sigmoids and smooth units


def _sigmoid(t):
    zero, one = t(0), t(1)

    @jit(device=True)
    def sigmoid(x):
        if x >= zero:
            return one / (one + math.exp(-x))
        e = math.exp(x)  # never overflows for x < 0
        return e / (one + e)

    return sigmoid


def _swish(t, alpha):
    """x * sigmoid(alpha * x): SiLU at alpha 1, QuickGELU at 1.702."""
    sigmoid, alpha = _sigmoid(t), t(alpha)

    @jit(device=True)
    def swish(x):
        return x * sigmoid(alpha * x)

    return swish


def _hard_sigmoid(t, alpha, beta):
    zero, one, alpha, beta = t(0), t(1), t(alpha), t(beta)

    @jit(device=True)
    def hard_sigmoid(x):
        return minimum(maximum(alpha * x + beta, zero), one)

    return hard_sigmoid


def _hard_swish(t):
    zero, half, one, six = t(0), t(0.5), t(1), t(6)

    @jit(device=True)
    def hard_swish(x):
        return x * minimum(maximum(x / six + half, zero), one)

    return hard_swish


def _softplus(t):
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    zero = t(0)

    @jit(device=True)
    def softplus(x):
        return maximum(x, zero) + math.log1p(math.exp(-abs(x)))

    return softplus


def _softsign(t):
    one = t(1)

    @jit(device=True)
    def softsign(x):
        return x / (one + abs(x))

    return softsign


def _mish(t):
    softplus = _softplus(t)

    @jit(device=True)
    def mish(x):
        return x * math.tanh(softplus(x))

    return mish


def _gelu(t, approximate):
    half, one = t(0.5), t(1)
    if approximate == "tanh":
        scale, cubic = t(math.sqrt(2.0 / math.pi)), t(0.044715)

        @jit(device=True)
        def gelu_tanh(x):
            return half * x * (one + math.tanh(scale * (x + cubic * x * x * x)))

        return gelu_tanh
    inv_sqrt2 = t(1.0 / math.sqrt(2.0))

    @jit(device=True)
    def gelu(x):
        return half * x * (one + math.erf(x * inv_sqrt2))

    return gelu


# ---------------------------------------------------------------------- math functions


@jit(device=True)
def _tanh(x):
    return math.tanh(x)


@jit(device=True)
def _erf(x):
    return math.erf(x)


@jit(device=True)
def _exp(x):
    return math.exp(x)


@jit(device=True)
def _sin(x):
    return math.sin(x)


@jit(device=True)
def _cos(x):
    return math.cos(x)


def _neg(t):
    @jit(device=True)
    def neg(x):
        return t(-x)  # integers wrap in their type, as np.negative

    return neg


def _log(t):
    zero, nan, minus_inf = t(0), t(np.nan), t(-np.inf)

    @jit(device=True)
    def log(x):
        if x < zero:
            return nan
        if x == zero:
            return minus_inf
        return math.log(x)

    return log


def _sqrt(t):
    zero, nan = t(0), t(np.nan)

    @jit(device=True)
    def sqrt(x):
        return nan if x < zero else math.sqrt(x)

    return sqrt


def _reciprocal(t):
    one = t(1)

    @jit(device=True)
    def reciprocal(x):
        return one / x

    return reciprocal


def _abs(t):
    if np.dtype(t).kind == "u":
        return _identity

    @jit(device=True)
    def absolute(x):
        return t(abs(x))  # wraps for the most negative integer, as np.abs

    return absolute


def _sign(t):
    zero, one = t(0), t(1)
    minus_one = t(-1) if np.dtype(t).kind != "u" else zero

    @jit(device=True)
    def sign(x):
        if x > zero:
            return one
        if x < zero:
            return minus_one
        return x  # zero, or NaN

    return sign


@jit(device=True)
def _identity(x):
    return x


# ---------------------------------------------------------------------- rounding


def _floor(t):
    limit = _integral_limit(t)

    @jit(device=True)
    def floor(x):
        if not abs(x) < limit:  # integral already, infinite or NaN
            return x
        return math.floor(x)

    return floor


def _ceil(t):
    limit = _integral_limit(t)

    @jit(device=True)
    def ceil(x):
        if not abs(x) < limit:
            return x
        return math.ceil(x)

    return ceil


def _round(t):
    """Round half to even."""
    limit, half, one = _integral_limit(t), t(0.5), t(1)

    @jit(device=True)
    def round_even(x):
        if not abs(x) < limit:
            return x
        r = math.floor(x)
        d = x - r
        if d > half or (d == half and math.floor(r * half) != r * half):
            r = r + one
        return r

    return round_even


# ---------------------------------------------------------------------- Clip


def _clip_constant(t, low, high):
    """Clip with bounds from attributes (opset < 11)."""
    low, high = t(low), t(high)

    @jit(device=True)
    def clip(x):
        return minimum(maximum(x, low), high)

    return clip


@jit(device=True)
def _clip_low(x, low):
    return maximum(x, low)


@jit(device=True)
def _clip_high(x, high):
    return minimum(x, high)


@jit(device=True)
def _clip_both(x, low, high):
    return minimum(maximum(x, low), high)


def _clip(t, has_low, has_high, low=None, high=None):
    if low is not None or high is not None:
        return _clip_constant(t, low, high)
    if has_low and has_high:
        return _clip_both
    if has_low:
        return _clip_low
    if has_high:
        return _clip_high
    return _identity


# ---------------------------------------------------------------------- dispatch


_FIXED = {"Tanh": _tanh, "Erf": _erf, "Exp": _exp, "Sin": _sin, "Cos": _cos}

_BUILDERS = {
    "Relu": _relu, "LeakyRelu": _leaky_relu, "ThresholdedRelu": _thresholded_relu, "Elu": _elu,
    "Selu": _selu, "Celu": _celu, "PRelu": _prelu, "Sigmoid": _sigmoid, "Swish": _swish, "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish, "Softplus": _softplus, "Softsign": _softsign, "Mish": _mish,
    "Gelu": _gelu, "Log": _log, "Sqrt": _sqrt, "Reciprocal": _reciprocal, "Abs": _abs,
    "Neg": _neg, "Sign": _sign, "Floor": _floor, "Ceil": _ceil, "Round": _round, "Clip": _clip,
    "Shrink": _shrink, **trigonometric.BUILDERS,
}


@functools.lru_cache(maxsize=None)
def device_function(op: str, dtype, params: tuple = ()):
    """The scalar device function of unary op ``op`` on ``dtype`` input.

    :param params: the attribute values the math depends on, in the builder's order
        (LeakyRelu ``(alpha,)``, Selu ``(alpha, gamma)``, Gelu ``(approximate,)``, Clip
        ``(has_min_input, has_max_input[, min, max])``, ...).
    """
    if op in _FIXED:
        return _FIXED[op]
    return _BUILDERS[op](scalar_type(dtype), *params)
