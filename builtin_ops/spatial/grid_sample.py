"""CUDA tactics of GridSample: a thread per output point computes its taps once (input
offsets and weights, per :mod:`.grid_sample_ops`' rules) and applies them to a run of
channels.

- ``points``: one thread per (batch, output point), every channel;
- ``channel_split``: the channels dealt out to ``split`` threads per point, for grids with
  few points and many channels (each thread recomputes the point's taps).

The kernel is compiled per X and grid dtype, spatial rank, mode, padding mode and
``align_corners`` (its coordinate math then has no branches on them); float16 data and
grids compute in float32, float64 ones in float64. Sizes travel in a small int64 table.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import float32, float64, int64

from plugrt.kernels import cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type

from .grid_sample_ops import CUBIC_A, TAPS, coordinate_type

_MODE_CODES = {"nearest": 0, "linear": 1, "cubic": 2}
_PADDING_CODES = {"zeros": 0, "border": 1, "reflection": 2}
#: Threads a point's channels may be dealt out to (``channel_split``).
MAX_SPLIT = 64


@functools.lru_cache(maxsize=None)
def _reflect(ct):
    """``reflect(x, low, high)`` of :func:`.grid_sample_ops.reflect`, in ``ct``."""
    zero = ct(0)

    @jit(device=True)
    def reflect(x, low, high):
        span = high - low
        if span <= zero:
            return low
        if x < low:
            dx = low - x
        elif x > high:
            dx = x - high
        else:
            return x
        flips = int64(math.floor(dx / span))
        rest = dx - ct(flips) * span
        if (flips % 2 == 0) == (x < low):
            return low + rest
        return high - rest

    return reflect


@functools.lru_cache(maxsize=None)
def _axis_taps(ct, mode: int, padding: int, align: bool):
    """``taps(g, length, stride, offsets, weights, at)``: one spatial axis's taps of a
    normalized coordinate ``g``, written to ``offsets[at:at + taps]`` (index times
    ``stride``, or -1 for a zeros-padding tap outside) and ``weights[at:...]``."""
    reflect = _reflect(ct)
    zero, one, two, half = ct(0), ct(1), ct(2), ct(0.5)
    a = ct(CUBIC_A)

    @jit(device=True)
    def taps(g, length, stride, offsets, weights, at):
        size = ct(length)
        if align:
            x = (g + one) / two * (size - one)
            low = zero
            high = size - one
        else:
            x = ((g + one) * size - one) / two
            low = -half
            high = size - half
        if mode == 0:  # rint: ties to even, as np.rint
            f = ct(math.floor(x))
            if x - f > half or (x - f == half and int64(f) % 2 != 0):
                f += one
            x = f
        if x < low or x > high:
            if padding == 1:
                x = min(max(x, zero), size - one)
            elif padding == 2:
                x = reflect(x, low, high)
        if mode == 0:
            first = int64(x)  # truncation, as the reference's cast
            count = 1
            weights[at] = one
        else:
            base = int64(math.floor(x))
            t = x - ct(base)
            if mode == 1:
                first = base
                count = 2
                weights[at] = one - t
                weights[at + 1] = t
            else:
                first = base - 1
                count = 4
                far = t + one
                near_2 = one - t
                far_2 = two - t
                weights[at] = ((a * far - ct(5) * a) * far + ct(8) * a) * far - ct(4) * a
                weights[at + 1] = ((a + two) * t - (a + ct(3))) * t * t + one
                weights[at + 2] = ((a + two) * near_2 - (a + ct(3))) * near_2 * near_2 + one
                weights[at + 3] = ((a * far_2 - ct(5) * a) * far_2 + ct(8) * a) * far_2 - ct(4) * a
        for k in range(count):
            i = first + k
            if padding == 0:
                if i < 0 or i >= length:
                    offsets[at + k] = -1
                    continue
            elif padding == 1:
                i = min(max(i, int64(0)), length - 1)
            else:
                i = int64(reflect(ct(i), low, high))
            offsets[at + k] = i * stride

    return taps


@functools.lru_cache(maxsize=None)
def _point_taps(ct, rank: int, mode: str, padding: str, align: bool):
    """``point_taps(grid, point, geo, axis_offsets, axis_weights, offsets, weights)``:
    every tap of one output point, combined over the axes: its input offset (-1 where a
    zeros-padding tap is outside) and weight (the product of its axes' weights)."""
    taps = _axis_taps(ct, _MODE_CODES[mode], _PADDING_CODES[padding], align)
    per_axis = TAPS[mode]
    combos = per_axis ** rank
    one = ct(1)

    @jit(device=True)
    def point_taps(grid, point, geo, axis_offsets, axis_weights, offsets, weights):
        for d in range(rank):
            g = ct(grid[point * rank + rank - 1 - d])
            taps(g, geo[d], geo[rank + d], axis_offsets, axis_weights, d * per_axis)
        for k in range(combos):
            rest = k
            offset = int64(0)
            w = one
            for d in range(rank - 1, -1, -1):
                t = d * per_axis + rest % per_axis
                rest //= per_axis
                if axis_offsets[t] < 0 or offset < 0:
                    offset = int64(-1)
                else:
                    offset += axis_offsets[t]
                w *= axis_weights[t]
            offsets[k] = offset
            weights[k] = w

    return point_taps


@functools.lru_cache(maxsize=None)
def grid_sample_kernel(x_dtype: str, grid_dtype: str, rank: int, mode: str, padding: str, align: bool):
    """``kernel(y, x, grid, zero, n_items, points, channels, split, geo)``: for item ``i``
    (point ``i % (N * points)``, channel run ``i // (N * points)`` of ``split``), Y at
    channels ``run, run + split, ...``. ``geo`` is ``[D1..Dr, their strides, D1*..*Dr]``;
    ``zero`` holds X's 0 (what nearest reads outside, with zeros padding)."""
    ct = float64 if coordinate_type(x_dtype, grid_dtype) == np.float64 else float32
    point_taps = _point_taps(ct, rank, mode, padding, align)
    n_axis_taps = rank * TAPS[mode]
    combos = TAPS[mode] ** rank
    if mode == "nearest":
        @jit
        def nearest(y, x, grid, zero, n_items, points, channels, split, geo):
            axis_offsets = cuda.local.array(n_axis_taps, int64)
            axis_weights = cuda.local.array(n_axis_taps, ct)
            offsets = cuda.local.array(1, int64)
            weights = cuda.local.array(1, ct)
            size = geo[2 * rank]
            n_points = n_items // split
            for i in range(cuda.grid(1), n_items, cuda.gridsize(1)):
                point = i % n_points
                run = i // n_points
                point_taps(grid, point, geo, axis_offsets, axis_weights, offsets, weights)
                n = point // points
                x_at = (n * channels + run) * size + offsets[0]
                y_at = (n * channels + run) * points + point % points
                for c in range(run, channels, split):
                    y[y_at] = x[x_at] if offsets[0] >= 0 else zero[0]
                    x_at += split * size
                    y_at += split * points

        return nearest

    load = compute_type(x_dtype)[2]
    zero_ct = ct(0)

    @jit
    def weighted(y, x, grid, zero, n_items, points, channels, split, geo):
        axis_offsets = cuda.local.array(n_axis_taps, int64)
        axis_weights = cuda.local.array(n_axis_taps, ct)
        offsets = cuda.local.array(combos, int64)
        weights = cuda.local.array(combos, ct)
        size = geo[2 * rank]
        n_points = n_items // split
        for i in range(cuda.grid(1), n_items, cuda.gridsize(1)):
            point = i % n_points
            run = i // n_points
            point_taps(grid, point, geo, axis_offsets, axis_weights, offsets, weights)
            n = point // points
            x_base = (n * channels + run) * size
            y_at = (n * channels + run) * points + point % points
            for c in range(run, channels, split):
                acc = zero_ct
                for k in range(combos):
                    if offsets[k] >= 0:
                        acc += weights[k] * load(x, x_base + offsets[k])
                y[y_at] = acc
                x_base += split * size
                y_at += split * points

    return weighted


def _split(n_points: int, channels: int) -> int:
    """Threads per point for ``channel_split``: enough items to fill an H200 (132 SMs x
    2048 threads), never more than the channels."""
    want = -(-132 * 2048 // max(n_points, 1))
    return max(1, min(channels, want, MAX_SPLIT))


def grid_sample_tactics(x_info, grid_info, y_info, mode: str, padding: str, align: bool) -> list[Tactic]:
    """``points`` and, where the points are few and the channels many, ``channel_split``."""
    x_shape = tuple(int(d) for d in x_info.shape)
    y_shape = tuple(int(d) for d in y_info.shape)
    batch, channels, spatial = x_shape[0], x_shape[1], x_shape[2:]
    rank = len(spatial)
    points = math.prod(y_shape[2:])
    strides = [math.prod(spatial[d + 1:]) for d in range(rank)]
    geo = np.asarray(list(spatial) + strides + [math.prod(spatial)], np.int64)
    x_dtype, grid_dtype = np.dtype(x_info.dtype).str, np.dtype(grid_info.dtype).str

    def tactic(name: str, split: int) -> Tactic:
        n_items = batch * points * split

        def launches(inputs, outputs, workspace):
            if n_items == 0 or channels == 0:
                return []
            blocks, threads = grid_1d(n_items)
            kernel = grid_sample_kernel(x_dtype, grid_dtype, rank, mode, padding, align)
            zero = to_device(np.zeros(1, x_info.dtype))
            args = (flat(outputs[0]), flat(inputs[0]), flat(inputs[1]), zero, np.int64(n_items), np.int64(points),
                    np.int64(channels), np.int64(split), to_device(geo))
            return [Launch(kernel, blocks, threads, args)]

        return Tactic(name, launches, {"split": split})

    found = [tactic("points", 1)]
    split = _split(batch * points, channels)
    if split > 1:
        found.append(tactic("channel_split", split))
    return found
