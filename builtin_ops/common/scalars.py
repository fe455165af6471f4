"""Scalar types and scalar device functions that the kernels of several families share.

- :func:`scalar_type`: the NumPy type a pointwise device function (elementwise,
  activation) sees and computes a dtype in;
- :func:`compute_type`: the Numba and NumPy types a windowed kernel (pooling, resize)
  computes a dtype in, with the device function that loads an element widened to it;
- :func:`maximum`, :func:`minimum`: ``np.maximum``/``np.minimum`` of two scalars.
"""

from __future__ import annotations

import numpy as np
from numba import float32, float64

from plugrt.kernels import jit


def scalar_type(dtype) -> type:
    """The NumPy scalar type a pointwise function sees and computes ``dtype`` in."""
    dtype = np.dtype(dtype)
    return np.float32 if dtype == np.float16 else dtype.type


@jit(device=True)
def maximum(a, b):
    """``np.maximum`` of two scalars: a NaN in either propagates."""
    return a if (a >= b or a != a) else b


@jit(device=True)
def minimum(a, b):
    """``np.minimum`` of two scalars: a NaN in either propagates."""
    return a if (a <= b or a != a) else b


@jit(device=True)
def _load_f32(a, i):
    return float32(a[i])


@jit(device=True)
def _load_same(a, i):
    return a[i]


def compute_type(dtype):
    """``(numba type, numpy type, load function)`` a kernel computes ``dtype`` in."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return float32, np.float32, _load_f32
    if dtype == np.float32:
        return float32, np.float32, _load_same
    if dtype == np.float64:
        return float64, np.float64, _load_same
    return None, dtype.type, _load_same  # integers (MaxPool): compare in their own type
