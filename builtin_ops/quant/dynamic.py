"""The CUDA tactic of DynamicQuantizeLinear: a min/max reduction, then a pointwise pass.

Three launches: :func:`range_kernel` reduces every block's share of ``x`` to a partial
minimum and maximum in the workspace (shared-memory tree per block); :func:`parameters_kernel`
(one block) reduces the partials and computes ONNX's uint8 scale and zero point into the
node's outputs 1 and 2; :func:`quantize_kernel` quantizes ``x`` with them, through the
family's QuantizeLinear device function.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import float32, int64

from plugrt.kernels import cuda, elementwise_grid, flat, jit, simulated
from plugrt.plugin import Launch, Tactic

from .device_functions import quantize, rint

#: Threads per block of the reduction kernels (a power of two).
THREADS = 256
#: Most blocks (partials) of the first reduction; the workspace holds two floats per block.
MAX_PARTIALS = 1024
#: The empty range's bounds.
INF = np.float32(np.inf)


def _threads() -> int:
    return 8 if simulated() else THREADS


@functools.lru_cache(maxsize=None)
def tree_range(threads: int):
    """A device function folding a block's ``threads`` (low, high) pairs in shared memory
    into ``low[0]``, ``high[0]`` (both kernels' last step)."""

    @jit(device=True)
    def fold(low, high, tid):
        step = threads // 2
        while step > 0:
            if tid < step:
                low[tid] = min(low[tid], low[tid + step])
                high[tid] = max(high[tid], high[tid + step])
            cuda.syncthreads()
            step //= 2

    return fold


@functools.lru_cache(maxsize=None)
def range_kernel(threads: int):
    """Block ``b`` stores the minimum and maximum of its grid-stride share of ``x`` at
    ``partial[2b]`` and ``partial[2b + 1]`` (+inf/-inf for an empty share)."""
    fold = tree_range(threads)

    @jit
    def block_range(x, n, partial):
        low = cuda.shared.array(threads, float32)
        high = cuda.shared.array(threads, float32)
        tid = cuda.threadIdx.x
        lo, hi = INF, -INF
        for i in range(int64(cuda.grid(1)), n, int64(cuda.gridsize(1))):
            v = x[i]
            lo = min(lo, v)
            hi = max(hi, v)
        low[tid], high[tid] = lo, hi
        cuda.syncthreads()
        fold(low, high, tid)
        if tid == 0:
            partial[2 * cuda.blockIdx.x] = low[0]
            partial[2 * cuda.blockIdx.x + 1] = high[0]

    return block_range


@functools.lru_cache(maxsize=None)
def parameters_kernel(threads: int):
    """One block: the partials' range widened to include 0, then ONNX's
    ``scale = (max - min) / 255`` (``1 / 255`` for an all-zero range) and
    ``zero_point = rint(clamp(-min / scale, 0, 255))``."""
    round_even = rint(np.float32)
    qmax = float32(255)
    fold = tree_range(threads)

    @jit
    def parameters(partial, count, scale, zero_point):
        low = cuda.shared.array(threads, float32)
        high = cuda.shared.array(threads, float32)
        tid = cuda.threadIdx.x
        lo, hi = float32(0), float32(0)
        for b in range(tid, count, threads):
            lo = min(lo, partial[2 * b])
            hi = max(hi, partial[2 * b + 1])
        low[tid], high[tid] = lo, hi
        cuda.syncthreads()
        fold(low, high, tid)
        if tid == 0:
            lo, hi = low[0], high[0]
            s = float32(1) / qmax if hi == lo else (hi - lo) / qmax
            z = float32(0) - lo / s
            z = min(max(z, float32(0)), qmax)
            scale[0] = s
            zero_point[0] = np.uint8(round_even(z))

    return parameters


@functools.lru_cache(maxsize=None)
def quantize_kernel():
    """``y[i] = saturate(rint(x[i] / scale) + zero_point)`` to uint8."""
    fn = quantize(np.dtype(np.float32), np.dtype(np.float32), np.dtype(np.uint8), True)

    @jit
    def dynamic_quantize(y, x, n, scale, zero_point):
        s, z = scale[0], zero_point[0]
        for i in range(int64(cuda.grid(1)), n, int64(cuda.gridsize(1))):
            y[i] = fn(x[i], s, z)

    return dynamic_quantize


def dynamic_tactic(size: int) -> Tactic:
    """The three launches over ``size`` elements of ``x``."""
    threads = _threads()
    first, params, last = range_kernel(threads), parameters_kernel(threads), quantize_kernel()
    blocks = max(1, min(-(-size // (4 * threads)), MAX_PARTIALS, 2 if simulated() else MAX_PARTIALS))

    def launches(ins, outs, workspace):
        x, n = flat(ins[0]), np.int64(size)
        partial = workspace[:8 * blocks].view(np.float32)
        y, scale, zero_point = flat(outs[0]), flat(outs[1]), flat(outs[2])
        grid, block = elementwise_grid(size, 4)
        return [Launch(first, blocks, threads, (x, n, partial)),
                Launch(params, 1, threads, (partial, np.int64(blocks), scale, zero_point)),
                Launch(last, grid, block, (y, x, n, scale, zero_point))]

    return Tactic("reduce_then_quantize", launches, {"partials": blocks}, workspace_bytes=8 * blocks)
