"""CUDA tactics of the channels-last pools (MaxPoolNHWC, AveragePoolNHWC and the global
pools' NHWC forms), on ``[N, spatial..., C]`` tensors.

The channel index runs fastest over the threads, so consecutive threads read consecutive
channels of one pixel (coalesced). The windowed kernels take the same ``int64[ROWS,
spatial]`` geometry table and tap functions as the channels-first ones
(:mod:`.window_pool`): a tap's offset within one image, in pixels, times C is its offset
in the channels-last image. float16 is loaded as float32 and computed in float32;
float64 computes in float64; MaxPool's int8/uint8 compare in their own type.

Two spatial dims of float16 or float32 with C a multiple of 8 (the networks' pools) also
have a vector kernel, offered first: one thread per output pixel and group of 8 channels,
each window tap one 16-byte load (:func:`plugrt.kernels.vector8`), the pixel decoded once
in 32-bit division and the window clamped to the input, so no tap is tested or decoded.
"""

from __future__ import annotations

import functools

import numpy as np

from numba import float32, int64, uint32

from plugrt.kernels import VECTOR, aligned, cuda, elementwise_grid, flat, grid_1d, jit, to_device, vector8
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type

from .window_pool import (
    DILATION, IN_SIZE, KERNEL, OUT_SIZE, PAD_BEGIN, PAD_END, STRIDE, tap_offset, window_block_order, window_count,
)

#: Thread items (pixel x group of 8 channels) the vector kernels' 32-bit decoding reaches.
MAX_VECTOR_ITEMS = 2**32 - 1


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


@jit(device=True)
def decode_item(item, groups, out_h, out_w):
    """``(image, oh, ow, group)`` of thread item ``((image * out_h + oh) * out_w + ow) *
    groups + group``, in unsigned 32-bit division (``item`` < 2**32, the rest uint32)."""
    item = uint32(item)
    pixel = uint32(item // groups)
    row = uint32(pixel // out_w)
    image = uint32(row // out_h)
    return (int64(image), int64(uint32(row - image * out_h)), int64(uint32(pixel - row * out_w)),
            int64(uint32(item - pixel * groups)))


@jit(device=True)
def inside_taps(start, dilation, kernel, size):
    """``(first, end)``: the taps ``k`` of a window that starts at input position ``start``
    of one spatial dim and fall inside ``[0, size)`` are ``first <= k < end`` (maybe none)."""
    if dilation == 1:
        first = max(-start, 0)
        end = min(kernel, size - start)
    else:
        first = max((dilation - 1 - start) // dilation, 0)
        end = min(kernel, (size - start + dilation - 1) // dilation)
    return first, max(end, first)


@jit(device=True)
def _larger(best, v):
    """The running max after ``v``: ``v`` when greater, or the first NaN (as ``np.max``)."""
    return v if (v > best or (v != v and best == best)) else best


@jit(device=True)
def max8(a, b):
    """Lane by lane :func:`_larger` of two 8-tuples."""
    return (_larger(a[0], b[0]), _larger(a[1], b[1]), _larger(a[2], b[2]), _larger(a[3], b[3]),
            _larger(a[4], b[4]), _larger(a[5], b[5]), _larger(a[6], b[6]), _larger(a[7], b[7]))


@jit(device=True)
def add8(a, b):
    """Lane by lane sum of two 8-tuples."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5], a[6] + b[6], a[7] + b[7])


@jit(device=True)
def divide8(a, d):
    """Each lane of an 8-tuple divided by ``d``."""
    return (a[0] / d, a[1] / d, a[2] / d, a[3] / d, a[4] / d, a[5] / d, a[6] / d, a[7] / d)


@functools.lru_cache(maxsize=None)
def pool_nhwc_vec8_kernel(kind: str):
    """2-D MaxPoolNHWC (``kind`` "max") or AveragePoolNHWC ("avg") of float16 or float32,
    ``C % 8 == 0``, 16-byte aligned data: thread item ``i`` computes channels ``8 * g ..
    8 * g + 7`` of one output pixel, stored at ``y[8 * i]``. Taps are taken in the order
    of :func:`max_pool_nhwc_2d_kernel`, so results are the same bit for bit as the scalar
    kernels'; padding never enters a max, and an average counts it when ``include_pad``."""
    load8, store8 = vector8()
    is_max = kind == "max"
    init = float32(-np.inf) if is_max else float32(0)
    nan = float32(np.nan)

    @jit
    def kernel(y, x, items, channels, geo, include_pad):
        groups, out_h, out_w = uint32(channels // VECTOR), uint32(geo[OUT_SIZE, 0]), uint32(geo[OUT_SIZE, 1])
        kh_size, kw_size = geo[KERNEL, 0], geo[KERNEL, 1]
        sh, sw, dh, dw = geo[STRIDE, 0], geo[STRIDE, 1], geo[DILATION, 0], geo[DILATION, 1]
        ph, pw, height, width = geo[PAD_BEGIN, 0], geo[PAD_BEGIN, 1], geo[IN_SIZE, 0], geo[IN_SIZE, 1]
        for i in range(cuda.grid(1), items, cuda.gridsize(1)):
            image, oh, ow, group = decode_item(i, groups, out_h, out_w)
            top, left = oh * sh - ph, ow * sw - pw
            kh_first, kh_end = inside_taps(top, dh, kh_size, height)
            kw_first, kw_end = inside_taps(left, dw, kw_size, width)
            base = image * height * width * channels + group * VECTOR
            acc = (init, init, init, init, init, init, init, init)
            for kh in range(kh_first, kh_end):
                row = base + ((top + kh * dh) * width + left) * channels
                for kw in range(kw_first, kw_end):
                    v = load8(x, row + kw * dw * channels)
                    acc = max8(acc, v) if is_max else add8(acc, v)
            if is_max:
                store8(y, i * VECTOR, acc)
                continue
            count = (kh_end - kh_first) * (kw_end - kw_first)
            if include_pad != 0:  # the window within the padded input
                first, end = inside_taps(top + ph, dh, kh_size, height + ph + geo[PAD_END, 0])
                count = end - first
                first, end = inside_taps(left + pw, dw, kw_size, width + pw + geo[PAD_END, 1])
                count *= end - first
            if count == 0:
                store8(y, i * VECTOR, (nan, nan, nan, nan, nan, nan, nan, nan))
            else:
                store8(y, i * VECTOR, divide8(acc, float32(count)))

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
    """The tactics of MaxPoolNHWC (``kind`` "max") or AveragePoolNHWC ("avg"): where
    :func:`vectorizable`, the vector tactics first (``nhwc_vec8_t256``...), then the
    one-thread-per-output ones (``nhwc_direct_t64``...), one per block size. ``table`` is
    the window geometry of the channels-first view (:meth:`PoolOp.geometry`)."""
    n = int(np.prod(_ints(y_info.shape), dtype=np.int64))
    found = []
    if vectorizable(x_info, y_info):
        found += [vector_tactic(kind, x_info, y_info, table, include_pad, t) for t in block_sizes(n // VECTOR)]
    for threads in block_sizes(n):
        launches = direct_launches(kind, x_info, y_info, table, include_pad, threads)
        found.append(Tactic(f"nhwc_direct_t{threads}", launches,
                            {"kind": kind, "threads": threads, "format": "channels_last"}))
    return found


def vectorizable(x_info, y_info) -> bool:
    """Whether :func:`pool_nhwc_vec8_kernel` computes this pool: two spatial dims, float16
    or float32, channels a multiple of 8, at most :data:`MAX_VECTOR_ITEMS` thread items."""
    x_shape, y_shape = _ints(x_info.shape), _ints(y_info.shape)
    items = int(np.prod(y_shape, dtype=np.int64)) // VECTOR
    return (len(x_shape) == 4 and np.dtype(x_info.dtype) in (np.float16, np.float32)
            and x_shape[-1] % VECTOR == 0 and 0 < items <= MAX_VECTOR_ITEMS)


def vector_tactic(kind: str, x_info, y_info, table: np.ndarray, include_pad: int, threads: int) -> Tactic:
    """The :func:`pool_nhwc_vec8_kernel` tactic in blocks of ``threads``; on data that is
    not 16-byte aligned it launches the direct kernel instead."""
    channels = _ints(x_info.shape)[-1]
    items = int(np.prod(_ints(y_info.shape), dtype=np.int64)) // VECTOR
    fallback = direct_launches(kind, x_info, y_info, table, include_pad, threads)

    def launches(inputs, outputs, workspace):
        if not (aligned(inputs[0]) and aligned(outputs[0])):
            return fallback(inputs, outputs, workspace)
        blocks, block = elementwise_grid(items, 1, threads)
        args = (flat(outputs[0]), flat(inputs[0]), np.int64(items), np.int64(channels), to_device(table),
                np.int64(include_pad))
        return [Launch(pool_nhwc_vec8_kernel(kind), blocks, block, args)]

    params = {"kind": kind, "threads": threads, "vector": VECTOR, "format": "channels_last"}
    return Tactic(f"nhwc_vec{VECTOR}_t{threads}", launches, params)


def direct_launches(kind: str, x_info, y_info, table: np.ndarray, include_pad: int, threads: int):
    """The launches function of the one-thread-per-output tactic in blocks of ``threads``."""
    dtype = np.dtype(x_info.dtype)
    x_shape, y_shape = _ints(x_info.shape), _ints(y_info.shape)
    channels = x_shape[-1]
    nsp = len(x_shape) - 2
    in_plane = int(np.prod(x_shape[1:-1], dtype=np.int64))
    out_plane = int(np.prod(y_shape[1:-1], dtype=np.int64))
    taps = int(np.prod(table[KERNEL], dtype=np.int64))
    n = int(np.prod(y_shape, dtype=np.int64))
    _, npt, _ = compute_type(dtype)

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

    return launches


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
