"""Scalar device functions of linear quantization, shared by every tactic of the family.

- :func:`quantize`: QuantizeLinear's ``saturate(rint(x / scale) + zero_point)``, the value
  already rounded and clamped to the target's range, so the store's cast is exact (in a
  fused chain or an anchor's epilogue too);
- :func:`dequantize`: DequantizeLinear's ``(x - zero_point) * scale``;
- :func:`rint`: round half to even, identical on the GPU (libdevice ``rint``) and in the
  CUDA simulator (``np.rint``; the simulator's libdevice stubs return NaN).

Factories are cached on dtypes, so equal nodes share one device function (and so one
compiled kernel). float16 arrives widened to float32, as in every pointwise function.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import jit, simulated

#: The integer targets QuantizeLinear saturates to, and DequantizeLinear reads.
QUANT_DTYPES = tuple(np.dtype(t) for t in ("int8", "uint8", "int16", "uint16"))


def limits(dtype) -> tuple[int, int]:
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def division_dtype(x_dtype, scale_dtype, precision=None) -> np.dtype:
    """The dtype ``x / scale`` is computed in: ``precision`` when given, else NumPy's
    promotion of the two (ONNX's reference: float16 by float16 stays float16, float32 by
    float16 is float32, an int32 ``x`` is divided in float64)."""
    if precision is not None:
        return np.dtype(precision)
    return np.result_type(np.dtype(x_dtype), np.dtype(scale_dtype))


@functools.lru_cache(maxsize=None)
def rint(dtype):
    """Round half to even in ``dtype``'s compute type (float32 for float16 and float32)."""
    t = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    if simulated():
        @jit(device=True)
        def rint_sim(x):
            return t(np.rint(x))

        return rint_sim
    from numba.cuda import libdevice

    if t is np.float64:
        @jit(device=True)
        def rint64(x):
            return libdevice.rint(x)

        return rint64

    @jit(device=True)
    def rint32(x):
        return libdevice.rintf(x)

    return rint32


@functools.lru_cache(maxsize=None)
def _divide(x_dtype, scale_dtype, precision):
    """``x / scale`` in the division dtype, float16 rounded then carried as float32 (a
    float32 quotient of two float16 values rounded once to float16 is the correctly
    rounded float16 quotient)."""
    p = division_dtype(x_dtype, scale_dtype, precision)
    if p == np.float16:
        @jit(device=True)
        def divide_half(x, scale):
            return np.float32(np.float16(np.float32(np.float16(x)) / np.float32(np.float16(scale))))

        return divide_half
    t = p.type

    @jit(device=True)
    def divide(x, scale):
        return t(x) / t(scale)

    return divide


@functools.lru_cache(maxsize=None)
def quantize(x_dtype, scale_dtype, target, with_zero_point: bool, precision=None):
    """``fn(x, scale[, zero_point])`` returning the quantized value in ``target``'s type:
    ``clamp(rint(x / scale) + zero_point, lo, hi)``; NaN quantizes to ``lo`` (what the ONNX
    reference's cast gives on x86). Omitted zero points are 0."""
    p = division_dtype(x_dtype, scale_dtype, precision)
    c = np.float64 if p == np.float64 else np.float32
    out = np.dtype(target).type
    low, high = limits(target)
    lo, hi = c(low), c(high)
    divide, round_even = _divide(np.dtype(x_dtype), np.dtype(scale_dtype), precision), rint(c)

    @jit(device=True)
    def saturate(q, zero_point):
        v = round_even(q) + c(zero_point)
        if v != v or v < lo:
            return out(low)
        if v > hi:
            return out(high)
        return out(v)

    if with_zero_point:
        @jit(device=True)
        def quantize_linear(x, scale, zero_point):
            return saturate(divide(x, scale), zero_point)

        return quantize_linear

    @jit(device=True)
    def quantize_linear_symmetric(x, scale):
        return saturate(divide(x, scale), 0)

    return quantize_linear_symmetric


@functools.lru_cache(maxsize=None)
def dequantize(output, with_zero_point: bool):
    """``fn(x, scale[, zero_point])``: ``(float32(x) - float32(zero_point)) * scale`` in
    float32 (float64 for a float64 output), as ONNX's reference computes it; a float16
    output is rounded to float16 and carried as float32."""
    output = np.dtype(output)
    c = np.float64 if output == np.float64 else np.float32
    half = output == np.float16

    @jit(device=True)
    def finish(v):
        if half:
            return np.float32(np.float16(v))
        return c(v)

    if with_zero_point:
        @jit(device=True)
        def dequantize_linear(x, scale, zero_point):
            return finish((np.float32(x) - np.float32(zero_point)) * c(scale))

        return dequantize_linear

    @jit(device=True)
    def dequantize_linear_symmetric(x, scale):
        return finish(np.float32(x) * c(scale))

    return dequantize_linear_symmetric
