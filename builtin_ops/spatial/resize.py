"""CUDA tactics of Resize and Upsample: one generic gather kernel over host-made tap tables.

The host computes, with the reference's own coordinate math
(:func:`.resize_ops.axis_taps`), per axis and output coordinate the input offsets (index
times the input's stride) and weights of its taps: 1 for nearest and unchanged axes, 2 for
linear, 4 for cubic, more when antialiasing widens the kernel. An output element is the
sum, over every combination of its axes' taps, of the product of their weights times the
input there; nearest is a pure gather. tf_crop_and_resize's outside positions carry offset
-1, and take the extrapolation value. This keeps every mode exact to the reference's rules.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import float64, from_dtype

from plugrt.kernels import c_strides, cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type

from .permute import permute_kernel

# Rows of the per-axis table: output size, taps per output coordinate, first table entry.
OUT_SIZE, TAPS, BASE = range(3)


@functools.lru_cache(maxsize=None)
def nearest_kernel():
    """``y[i] = x[sum of the axes' offsets]``, or ``fill[0]`` where an axis is outside."""

    @jit
    def kernel(y, x, fill, n, ndim, geo, offsets):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            r = i
            src = 0
            outside = False
            for d in range(ndim - 1, -1, -1):
                o = r % geo[OUT_SIZE, d]
                r //= geo[OUT_SIZE, d]
                v = offsets[geo[BASE, d] + o]
                if v < 0:
                    outside = True
                else:
                    src += v
            if outside:
                y[i] = fill[0]
            else:
                y[i] = x[src]

    return kernel


@functools.lru_cache(maxsize=None)
def weighted_kernel(dtype: str):
    """Linear, cubic and antialiased resampling of ``dtype`` data (float16 and float32
    computed in float32; float64 and integers in float64, integers stored rounded half
    to even and saturated, as the reference's cast does)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        npt, load, store = np.float64, _load_f64, _rounding_store(dtype.str)
    else:
        _, npt, load = compute_type(dtype)
        store = _plain_store
    zero = npt(0)
    one = npt(1)

    @jit
    def kernel(y, x, fill, n, ndim, geo, offsets, weights, combos, lo, hi):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            r = i
            outside = False
            for d in range(ndim - 1, -1, -1):
                o = r % geo[OUT_SIZE, d]
                r //= geo[OUT_SIZE, d]
                if offsets[geo[BASE, d] + o * geo[TAPS, d]] < 0:
                    outside = True
            acc = fill
            if not outside:
                acc = zero
                for t in range(combos):
                    r = i
                    rt = t
                    src = 0
                    w = one
                    for d in range(ndim - 1, -1, -1):
                        o = r % geo[OUT_SIZE, d]
                        r //= geo[OUT_SIZE, d]
                        k = rt % geo[TAPS, d]
                        rt //= geo[TAPS, d]
                        e = geo[BASE, d] + o * geo[TAPS, d] + k
                        src += offsets[e]
                        w *= weights[e]
                    acc += w * load(x, src)
            store(y, i, acc, lo, hi)

    return kernel


@jit(device=True)
def _load_f64(a, i):
    return float64(a[i])


@jit(device=True)
def _plain_store(y, i, v, lo, hi):
    y[i] = v


@functools.lru_cache(maxsize=None)
def _rounding_store(dtype: str):
    """Store a float64 into an integer array as ``np.clip(np.round(v), lo, hi)`` does."""
    cast = from_dtype(np.dtype(dtype))
    exact = float64(2.0**52)  # from here on every float64 is an integer

    @jit(device=True)
    def store(y, i, v, lo, hi):
        f = v
        if v < exact and v > -exact:
            f = float64(math.floor(v))
            diff = v - f
            if diff > 0.5 or (diff == 0.5 and math.fmod(f, 2.0) != 0):
                f += float64(1)
        if f < lo:
            f = lo
        if f > hi:
            f = hi
        y[i] = cast(f)

    return store


def pack_tables(shape, tables):
    """``(geo int64[3, ndim], offsets int64[...], weights float64[...], combos)`` from the
    per-axis ``(idx[n_out, k], w or None, outside or None)`` of ``resample_tables``."""
    ndim = len(shape)
    strides = c_strides(shape)
    geo = np.zeros((3, max(ndim, 1)), np.int64)
    geo[OUT_SIZE] = 1
    offsets, weights, base, combos = [], [], 0, 1
    for d, (idx, w, outside) in enumerate(tables):
        n_out, taps = idx.shape
        off = idx.astype(np.int64) * strides[d]
        if outside is not None:
            off[np.asarray(outside, bool)] = -1
        geo[:, d] = (n_out, taps, base)
        offsets.append(off.reshape(-1))
        weights.append(np.ones(idx.size) if w is None else np.asarray(w, np.float64).reshape(-1))
        base += idx.size
        combos *= taps
    offsets = np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
    weights = np.concatenate(weights) if weights else np.zeros(0)
    pad = max(1 - offsets.size, 0)  # never an empty device table
    return geo, np.pad(offsets, (0, pad)), np.pad(weights, (0, pad)), combos


def resize_tactic(x_info, y_info, tables, nearest: bool, fill, constant_output=None) -> Tactic:
    """The tap-table tactic of Resize and Upsample.

    :param tables: per-axis taps (``resize_ops.resample_tables``) for a non-empty input.
    :param fill: the extrapolation value, already cast to the data's dtype for nearest.
    :param constant_output: the whole output, when it does not depend on the input's
        contents (an empty input); the launch then copies it.
    """
    dtype = np.dtype(x_info.dtype)
    y_shape = tuple(int(d) for d in y_info.shape)
    n = int(np.prod(y_shape, dtype=np.int64))
    if constant_output is not None:
        constant = np.ascontiguousarray(constant_output, dtype).reshape(-1)

        def copy_launches(inputs, outputs, workspace):
            blocks, threads = grid_1d(n)
            args = (flat(outputs[0]), to_device(constant if n else np.zeros(1, dtype)), np.int64(n), np.int64(1),
                    to_device(np.asarray([max(n, 1)], np.int64)), to_device(np.ones(1, np.int64)))
            return [Launch(permute_kernel(), blocks, threads, args)]

        return Tactic("constant", copy_launches, {})

    x_shape = tuple(int(d) for d in x_info.shape)
    geo, offsets, weights, combos = pack_tables(x_shape, tables)
    ndim = len(x_shape)

    def launches(inputs, outputs, workspace):
        blocks, threads = grid_1d(n)
        y, x = flat(outputs[0]), flat(inputs[0])
        common = (np.int64(n), np.int64(ndim), to_device(geo), to_device(offsets))
        if nearest:
            fill_array = to_device(np.asarray(fill, dtype).reshape(1))
            return [Launch(nearest_kernel(), blocks, threads, (y, x, fill_array) + common)]
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            npt, lo, hi = np.float64, np.float64(info.min), np.float64(info.max)
        else:
            npt = compute_type(dtype)[1]
            lo = hi = npt(0)
        args = (y, x, npt(fill)) + common + (to_device(weights.astype(npt)), np.int64(combos), lo, hi)
        return [Launch(weighted_kernel(dtype.str), blocks, threads, args)]

    return Tactic("taps", launches, {"combos": combos})
