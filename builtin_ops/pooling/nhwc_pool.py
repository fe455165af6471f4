"""CUDA tactics of the channels-last pools (MaxPoolNHWC, AveragePoolNHWC and the global
pools' NHWC forms), on ``[N, spatial..., C]`` tensors.

The channel index runs fastest over the threads, so consecutive threads read consecutive
channels of one pixel (coalesced). The windowed kernels take the same ``int64[ROWS,
spatial]`` geometry table and tap functions as the channels-first ones
(:mod:`.window_pool`): a tap's offset within one image, in pixels, times C is its offset
in the channels-last image. float16 is loaded as float32 and computed in float32;
float64 computes in float64; MaxPool's int8/uint8 compare in their own type.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type

from .window_pool import (
    DILATION, IN_SIZE, KERNEL, OUT_SIZE, PAD_BEGIN, STRIDE, tap_offset, window_block_order, window_count,
)


@functools.lru_cache(maxsize=None)
def max_pool_nhwc_kernel(dtype: str):
    """``y[n, o..., c] = max`` of the window of output pixel ``o`` in channel ``c``;
    padding never enters the max, the first NaN wins (as ``np.max``)."""
    _, _, load = compute_type(dtype)

    @jit
    def kernel(y, x, n, channels, out_plane, in_plane, taps, nsp, geo, low):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            pixel = i // channels
            c = i - pixel * channels
            image = pixel // out_plane
            o = pixel - image * out_plane
            base = image * in_plane * channels + c
            best = low
            for t in range(taps):
                off = tap_offset(geo, o, t, nsp)
                v = low
                if off >= 0:
                    v = load(x, base + off * channels)
                if t == 0 or v > best or (v != v and best == best):
                    best = v
            y[i] = best

    return kernel


@functools.lru_cache(maxsize=None)
def max_pool_nhwc_2d_kernel(dtype: str):
    """:func:`max_pool_nhwc_kernel` for two spatial dims (the networks' case): the window's
    rows and columns walked by nested loops from the output pixel decoded once, instead
    of decoding every tap (eight int64 divisions each)."""
    _, _, load = compute_type(dtype)

    @jit
    def kernel(y, x, n, channels, out_plane, in_plane, taps, nsp, geo, low):
        ow_size, kh_size, kw_size = geo[OUT_SIZE, 1], geo[KERNEL, 0], geo[KERNEL, 1]
        sh, sw, dh, dw = geo[STRIDE, 0], geo[STRIDE, 1], geo[DILATION, 0], geo[DILATION, 1]
        ph, pw, height, width = geo[PAD_BEGIN, 0], geo[PAD_BEGIN, 1], geo[IN_SIZE, 0], geo[IN_SIZE, 1]
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            pixel = i // channels
            c = i - pixel * channels
            image = pixel // out_plane
            o = pixel - image * out_plane
            oh = o // ow_size
            base = image * in_plane * channels + c
            best = low
            first = True
            for kh in range(kh_size):
                ih = oh * sh - ph + kh * dh
                for kw in range(kw_size):
                    iw = (o - oh * ow_size) * sw - pw + kw * dw
                    v = low
                    if ih >= 0 and ih < height and iw >= 0 and iw < width:
                        v = load(x, base + (ih * width + iw) * channels)
                    if first or v > best or (v != v and best == best):
                        best = v
                    first = False
            y[i] = best

    return kernel


@functools.lru_cache(maxsize=None)
def average_pool_nhwc_kernel(dtype: str):
    """``y[n, o..., c] = sum / count`` over the window of output pixel ``o`` in channel
    ``c``, ``count`` taking padding taps only when ``include_pad`` is nonzero."""
    ctype, npt, load = compute_type(dtype)
    zero = npt(0)
    nan = npt(np.nan)

    @jit
    def kernel(y, x, n, channels, out_plane, in_plane, taps, nsp, geo, include_pad):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            pixel = i // channels
            c = i - pixel * channels
            image = pixel // out_plane
            o = pixel - image * out_plane
            base = image * in_plane * channels + c
            acc = zero
            for t in range(taps):
                off = tap_offset(geo, o, t, nsp)
                if off >= 0:
                    acc += load(x, base + off * channels)
            count = window_count(geo, o, nsp, include_pad)
            if count == 0:
                y[i] = nan
            else:
                y[i] = acc / ctype(count)

    return kernel


@functools.lru_cache(maxsize=None)
def global_pool_nhwc_kernel(dtype: str, kind: str):
    """One thread per (n, c): the mean (``kind`` "avg") or max ("max") of channel ``c``
    over image ``n``'s ``plane`` pixels."""
    ctype, npt, load = compute_type(dtype)
    init = npt(-np.inf) if kind == "max" else npt(0)
    nan = npt(np.nan)
    is_max = kind == "max"

    @jit
    def kernel(y, x, n, channels, plane):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            image = i // channels
            c = i - image * channels
            base = image * plane * channels + c
            acc = init
            for j in range(plane):
                v = load(x, base + j * channels)
                if is_max:
                    if v > acc or v != v:  # a NaN sticks: nothing compares greater than it
                        acc = v
                else:
                    acc += v
            if is_max:
                y[i] = acc
            elif plane == 0:
                y[i] = nan
            else:
                y[i] = acc / ctype(plane)

    return kernel


def block_sizes(n: int) -> list[int]:
    """:func:`window_block_order` for ``n`` threads, without the sizes past ``n`` (rounded
    to 64) that would launch the same block."""
    return [t for t in window_block_order(n) if t <= max(64, -(-n // 32) * 32)]


def _ints(shape) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def window_pool_nhwc_tactics(kind: str, x_info, y_info, table: np.ndarray, include_pad: int = 0) -> list[Tactic]:
    """The one-thread-per-output tactics of MaxPoolNHWC (``kind`` "max") or AveragePoolNHWC
    ("avg"), one per block size (``nhwc_direct_t64``...). ``table`` is the window geometry
    of the channels-first view (:meth:`PoolOp.geometry`)."""
    dtype = np.dtype(x_info.dtype)
    x_shape, y_shape = _ints(x_info.shape), _ints(y_info.shape)
    channels = x_shape[-1]
    nsp = len(x_shape) - 2
    in_plane = int(np.prod(x_shape[1:-1], dtype=np.int64))
    out_plane = int(np.prod(y_shape[1:-1], dtype=np.int64))
    taps = int(np.prod(table[KERNEL], dtype=np.int64))
    n = int(np.prod(y_shape, dtype=np.int64))
    _, npt, _ = compute_type(dtype)

    def tactic(threads: int) -> Tactic:
        def launches(inputs, outputs, workspace):
            blocks, block = grid_1d(n, threads)
            sizes = (np.int64(n), np.int64(max(channels, 1)), np.int64(max(out_plane, 1)), np.int64(in_plane),
                     np.int64(taps), np.int64(nsp), to_device(table))
            if kind == "max":
                low = npt(-np.inf) if dtype.kind == "f" else npt(np.iinfo(dtype).min)
                factory = max_pool_nhwc_2d_kernel if nsp == 2 else max_pool_nhwc_kernel
                kernel, extra = factory(dtype.str), (low,)
            else:
                kernel, extra = average_pool_nhwc_kernel(dtype.str), (np.int64(include_pad),)
            return [Launch(kernel, blocks, block, (flat(outputs[0]), flat(inputs[0])) + sizes + extra)]

        return Tactic(f"nhwc_direct_t{threads}", launches, {"kind": kind, "threads": threads, "format": "channels_last"})

    return [tactic(t) for t in block_sizes(n)]


def global_pool_nhwc_tactics(kind: str, x_info) -> list[Tactic]:
    """The one-thread-per-(n, c) tactics of GlobalAveragePoolNHWC (``kind`` "avg") or
    GlobalMaxPoolNHWC ("max"), one per block size (``nhwc_per_channel_t64``...)."""
    dtype = np.dtype(x_info.dtype)
    shape = _ints(x_info.shape)
    channels = shape[-1]
    plane = int(np.prod(shape[1:-1], dtype=np.int64))
    n = shape[0] * channels

    def tactic(threads: int) -> Tactic:
        def launches(inputs, outputs, workspace):
            blocks, block = grid_1d(n, threads)
            args = (flat(outputs[0]), flat(inputs[0]), np.int64(n), np.int64(max(channels, 1)), np.int64(plane))
            return [Launch(global_pool_nhwc_kernel(dtype.str, kind), blocks, block, args)]

        return Tactic(f"nhwc_per_channel_t{threads}", launches, {"kind": kind, "threads": threads, "format": "channels_last"})

    return [tactic(t) for t in block_sizes(n)]
