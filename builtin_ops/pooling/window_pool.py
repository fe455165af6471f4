"""CUDA tactics of the windowed pools (MaxPool, AveragePool, LpPool): one thread per
output element (the global pools are in :mod:`.global_pool`, the channels-last pools,
which share this module's geometry table and tap functions, in :mod:`.nhwc_pool`).

Window geometry travels as one small ``int64[ROWS, spatial]`` device table (see
:func:`window_geometry`), so one compiled kernel serves every shape, kernel size,
stride, dilation and padding. float16 is loaded as float32 and computed in float32;
float64 computes in float64; MaxPool's int8/uint8 compare in their own type.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import BLOCK, cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type

# Rows of the geometry table, one column per spatial dim.
IN_SIZE, OUT_SIZE, KERNEL, STRIDE, DILATION, PAD_BEGIN, PAD_END, IN_STRIDE, INDEX_STRIDE = range(9)
ROWS = 9


def window_geometry(shape, out_shape, kernel, strides, dilations, pads_begin, pads_end,
                    storage_order=0) -> np.ndarray:
    """The ``int64[ROWS, n]`` table of one pooled node: per spatial dim the input and
    output sizes, kernel, stride, dilation, effective begin/end pads (auto_pad and
    ceil_mode already applied), the input's element strides and the Indices strides."""
    n = len(shape) - 2
    table = np.zeros((ROWS, n), np.int64)
    spatial = [int(d) for d in shape[2:]]
    c_order = np.ones(n, np.int64)
    f_order = np.ones(n, np.int64)
    for d in range(n - 2, -1, -1):
        c_order[d] = c_order[d + 1] * spatial[d + 1]
    for d in range(1, n):
        f_order[d] = f_order[d - 1] * spatial[d - 1]
    table[IN_SIZE] = spatial
    table[OUT_SIZE] = [int(d) for d in out_shape[2:]]
    table[KERNEL] = kernel
    table[STRIDE] = strides
    table[DILATION] = dilations
    table[PAD_BEGIN] = pads_begin
    table[PAD_END] = pads_end
    table[IN_STRIDE] = c_order
    table[INDEX_STRIDE] = f_order if storage_order == 1 else c_order
    return table


@jit(device=True)
def tap_offset(geo, i, t, nsp):
    """Input offset (within one plane) of window tap ``t`` of output element ``i``, or -1
    when the tap falls outside the input (on padding)."""
    off = 0
    inside = True
    for d in range(nsp - 1, -1, -1):
        o = i % geo[OUT_SIZE, d]
        i //= geo[OUT_SIZE, d]
        k = t % geo[KERNEL, d]
        t //= geo[KERNEL, d]
        pos = o * geo[STRIDE, d] - geo[PAD_BEGIN, d] + k * geo[DILATION, d]
        if pos < 0 or pos >= geo[IN_SIZE, d]:
            inside = False
        off += pos * geo[IN_STRIDE, d]
    if inside:
        return off
    return -1


@jit(device=True)
def _tap_index(geo, i, t, nsp):
    """The Indices value (within one plane) of tap ``t``: its position clipped into the
    input, flattened row- or column-major as the geometry's INDEX_STRIDE row says."""
    index = 0
    for d in range(nsp - 1, -1, -1):
        o = i % geo[OUT_SIZE, d]
        i //= geo[OUT_SIZE, d]
        k = t % geo[KERNEL, d]
        t //= geo[KERNEL, d]
        pos = o * geo[STRIDE, d] - geo[PAD_BEGIN, d] + k * geo[DILATION, d]
        pos = min(max(pos, 0), geo[IN_SIZE, d] - 1)
        index += pos * geo[INDEX_STRIDE, d]
    return index


@jit(device=True)
def window_count(geo, i, nsp, include_pad):
    """How many taps of output element ``i``'s window an average divides by."""
    total = 1
    for d in range(nsp - 1, -1, -1):
        o = i % geo[OUT_SIZE, d]
        i //= geo[OUT_SIZE, d]
        lo = 0
        hi = geo[IN_SIZE, d]
        if include_pad != 0:
            lo = -geo[PAD_BEGIN, d]
            hi = geo[IN_SIZE, d] + geo[PAD_END, d]
        c = 0
        for k in range(geo[KERNEL, d]):
            pos = o * geo[STRIDE, d] - geo[PAD_BEGIN, d] + k * geo[DILATION, d]
            if pos >= lo and pos < hi:
                c += 1
        total *= c
    return total


@functools.lru_cache(maxsize=None)
def max_pool_kernel(dtype: str):
    """``y[i] = max(window)`` and, when ``want_index``, the first maximum's flat index."""
    _, _, load = compute_type(dtype)

    @jit
    def kernel(y, index, x, n, out_plane, in_plane, taps, nsp, geo, low, want_index):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            nc = i // out_plane
            o = i - nc * out_plane
            base = nc * in_plane
            best = low
            best_tap = 0
            for t in range(taps):
                off = tap_offset(geo, o, t, nsp)
                v = low
                if off >= 0:
                    v = load(x, base + off)
                # np.argmax: the first maximum, the first NaN wins over everything
                if t == 0 or v > best or (v != v and best == best):
                    best = v
                    best_tap = t
            y[i] = best
            if want_index != 0:
                index[i] = base + _tap_index(geo, o, best_tap, nsp)

    return kernel


@functools.lru_cache(maxsize=None)
def sum_pool_kernel(dtype: str, lp: bool):
    """AveragePool (``lp`` False: sum / count) or LpPool (``(sum |x|^p)^(1/p)``)."""
    ctype, npt, load = compute_type(dtype)
    zero = npt(0)
    nan = npt(np.nan)

    @jit
    def kernel(y, x, n, out_plane, in_plane, taps, nsp, geo, include_pad, p, inv_p):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            nc = i // out_plane
            o = i - nc * out_plane
            base = nc * in_plane
            acc = zero
            for t in range(taps):
                off = tap_offset(geo, o, t, nsp)
                if off >= 0:
                    v = load(x, base + off)
                    if lp:
                        acc += math.pow(abs(v), p)
                    else:
                        acc += v
            if lp:
                y[i] = math.pow(acc, inv_p)
            else:
                count = window_count(geo, o, nsp, include_pad)
                if count == 0:
                    y[i] = nan
                else:
                    y[i] = acc / ctype(count)

    return kernel


#: Streaming multiprocessors of the target GPU (H200).
SMS = 132


def window_block_order(n: int) -> tuple:
    """Block sizes for ``n`` outputs, best guess first: 256 when even 256-thread blocks
    give every SM two, smaller blocks (more of them) for smaller outputs."""
    if n >= 2 * SMS * 256:
        return (256, 128, 64)
    if n >= 2 * SMS * 128:
        return (128, 256, 64)
    return (64, 128, 256)


def window_pool_tactics(kind: str, x_info, y_info, table: np.ndarray, **options) -> list[Tactic]:
    """The direct tactics of a windowed pool, one per block size (``direct_t256``...),
    in :func:`window_block_order`; sizes past the output's (rounded to 64) would launch
    the same block and are left out."""
    n = int(np.prod([int(d) for d in y_info.shape], dtype=np.int64))
    sizes = [t for t in window_block_order(n) if t <= max(64, -(-n // 32) * 32)]
    return [window_pool_tactic(kind, x_info, y_info, table, threads=t, **options) for t in sizes]


def window_pool_tactic(kind: str, x_info, y_info, table: np.ndarray, *, with_index=False,
                       include_pad=0, p=2, threads=BLOCK) -> Tactic:
    """The direct tactic of MaxPool (``kind`` "max"), AveragePool ("avg") or LpPool ("lp"),
    one output per thread in blocks of ``threads``."""
    dtype = np.dtype(x_info.dtype)
    x_shape = tuple(int(d) for d in x_info.shape)
    y_shape = tuple(int(d) for d in y_info.shape)
    nsp = len(x_shape) - 2
    in_plane = int(np.prod(x_shape[2:], dtype=np.int64))
    out_plane = int(np.prod(y_shape[2:], dtype=np.int64))
    taps = int(np.prod(table[KERNEL], dtype=np.int64))
    n = int(np.prod(y_shape, dtype=np.int64))
    _, npt, _ = compute_type(dtype)

    def launches(inputs, outputs, workspace):
        geo = to_device(table)
        blocks, block = grid_1d(n, threads)
        common = (np.int64(n), np.int64(max(out_plane, 1)), np.int64(in_plane), np.int64(taps), np.int64(nsp), geo)
        y, x = flat(outputs[0]), flat(inputs[0])
        if kind == "max":
            low = npt(-np.inf) if dtype.kind == "f" else npt(np.iinfo(dtype).min)
            index = flat(outputs[1]) if with_index else to_device(np.zeros(1, np.int64))
            kernel = max_pool_kernel(dtype.str)
            args = (y, index, x) + common + (low, np.int64(with_index))
        else:
            kernel = sum_pool_kernel(dtype.str, kind == "lp")
            args = (y, x) + common + (np.int64(include_pad), npt(p), npt(1.0 / p) if kind == "lp" else npt(1))
        return [Launch(kernel, blocks, block, args)]

    return Tactic(f"direct_t{threads}", launches, {"kind": kind, "threads": threads})
