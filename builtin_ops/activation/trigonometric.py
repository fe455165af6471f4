"""Scalar device functions of the trigonometric and hyperbolic ops (Tan, Asin, Acos,
Atan, Sinh, Cosh, Asinh, Acosh, Atanh), for the toolkit's pointwise kernel; looked up
through :func:`.device_functions.device_function`, whose conventions they follow.

Outside an op's domain (|x| > 1 for Asin, Acos and Atanh, x < 1 for Acosh, infinities
for Tan) and past Sinh/Cosh's overflow each function gives the GPU's answer (NaN, ±inf)
explicitly: the CUDA simulator runs ``math`` on the host, which raises there.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt.kernels import jit


def _overflow_limit(t):
    """The |x| past which sinh and cosh of type ``t`` are infinite (and ``math`` raises)."""
    return t(89.5) if t == np.float32 else t(710.4758)


def _tan(t):
    zero, nan = t(0), t(np.nan)

    @jit(device=True)
    def tan(x):
        if x - x != zero:  # infinite or NaN
            return nan
        return math.tan(x)

    return tan


def _asin(t):
    one, nan = t(1), t(np.nan)

    @jit(device=True)
    def asin(x):
        if not abs(x) <= one:  # outside [-1, 1], or NaN
            return nan
        return math.asin(x)

    return asin


def _acos(t):
    one, nan = t(1), t(np.nan)

    @jit(device=True)
    def acos(x):
        if not abs(x) <= one:
            return nan
        return math.acos(x)

    return acos


def _atan(t):
    @jit(device=True)
    def atan(x):
        return math.atan(x)

    return atan


def _sinh(t):
    zero, inf, limit = t(0), t(np.inf), _overflow_limit(t)

    @jit(device=True)
    def sinh(x):
        if abs(x) > limit:
            return inf if x > zero else -inf
        return math.sinh(x)

    return sinh


def _cosh(t):
    inf, limit = t(np.inf), _overflow_limit(t)

    @jit(device=True)
    def cosh(x):
        if abs(x) > limit:
            return inf
        return math.cosh(x)

    return cosh


def _asinh(t):
    @jit(device=True)
    def asinh(x):
        return math.asinh(x)

    return asinh


def _acosh(t):
    one, nan = t(1), t(np.nan)

    @jit(device=True)
    def acosh(x):
        if not x >= one:  # below 1, or NaN
            return nan
        return math.acosh(x)

    return acosh


def _atanh(t):
    zero, one, inf, nan = t(0), t(1), t(np.inf), t(np.nan)

    @jit(device=True)
    def atanh(x):
        if abs(x) == one:
            return inf if x > zero else -inf
        if not abs(x) < one:
            return nan
        return math.atanh(x)

    return atanh


#: op type -> builder taking the compute type.
BUILDERS = {
    "Tan": _tan, "Asin": _asin, "Acos": _acos, "Atan": _atan, "Sinh": _sinh, "Cosh": _cosh,
    "Asinh": _asinh, "Acosh": _acosh, "Atanh": _atanh,
}
