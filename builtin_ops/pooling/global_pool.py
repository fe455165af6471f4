"""CUDA tactics of the global pools (GlobalAveragePool, GlobalMaxPool, GlobalLpPool): one
block per (n, c) row with a shared-memory tree reduction. float16 is loaded as float32
and computed in float32; float64 computes in float64.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import BLOCK, cuda, flat, jit, rows_grid
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type


@functools.lru_cache(maxsize=None)
def global_pool_kernel(dtype: str, kind: str):
    """One block per (n, c) row: each thread folds a strided part of the row, then a
    shared-memory tree combines the block's partials (any block size up to BLOCK)."""
    ctype, npt, load = compute_type(dtype)
    init = npt(-np.inf) if kind == "max" else npt(0)
    nan = npt(np.nan)
    is_max = kind == "max"
    is_lp = kind == "lp"

    @jit(device=True)
    def combine(a, b):
        if is_max:
            if b > a or b != b:
                return b
            return a
        return a + b

    @jit
    def kernel(y, x, rows, plane, p, inv_p):
        partial = cuda.shared.array(BLOCK, ctype)
        tid = cuda.threadIdx.x
        width = cuda.blockDim.x
        for row in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            acc = init
            base = row * plane
            for j in range(tid, plane, width):
                v = load(x, base + j)
                if is_lp:
                    v = math.pow(abs(v), p)
                acc = combine(acc, v)
            partial[tid] = acc
            cuda.syncthreads()
            half = 1
            while half < width:
                half *= 2
            half //= 2
            while half > 0:
                if tid < half and tid + half < width:
                    partial[tid] = combine(partial[tid], partial[tid + half])
                cuda.syncthreads()
                half //= 2
            if tid == 0:
                total = partial[0]
                if is_lp:
                    y[row] = math.pow(total, inv_p)
                elif is_max:
                    y[row] = total
                elif plane == 0:
                    y[row] = nan
                else:
                    y[row] = total / ctype(plane)
            cuda.syncthreads()

    return kernel


def global_block_order(plane: int) -> tuple:
    """Block sizes for rows of ``plane`` elements, best guess first: the smallest power
    of two from 32 to :data:`BLOCK` giving each thread at most four elements (a ResNet's
    7x7 plane: 32), then the others by distance from it."""
    best = min(BLOCK, max(32, 1 << max(-(-max(plane, 1) // 4) - 1, 0).bit_length()))
    sizes = (32, 64, 128, 256)
    return tuple(sorted(sizes, key=lambda t: (abs(t.bit_length() - best.bit_length()), t)))


def global_pool_tactics(kind: str, x_info, p=2) -> list[Tactic]:
    """The block-per-row tactics of a global pool, one per block size up to the row's
    length, in :func:`global_block_order`."""
    plane = int(np.prod([int(d) for d in x_info.shape[2:]], dtype=np.int64))
    useful = max(32, 1 << max(plane - 1, 0).bit_length())  # more threads than elements would idle
    return [global_pool_tactic(kind, x_info, p, threads=t) for t in global_block_order(plane) if t <= useful]


def global_pool_tactic(kind: str, x_info, p=2, threads=BLOCK) -> Tactic:
    """The block-per-row tactic of GlobalAveragePool ("avg"), GlobalMaxPool ("max") and
    GlobalLpPool ("lp"), ``threads`` (at most :data:`BLOCK`) per row."""
    assert threads <= BLOCK
    dtype = np.dtype(x_info.dtype)
    shape = tuple(int(d) for d in x_info.shape)
    rows = shape[0] * shape[1]
    plane = int(np.prod(shape[2:], dtype=np.int64))
    _, npt, _ = compute_type(dtype)

    def launches(inputs, outputs, workspace):
        kernel = global_pool_kernel(dtype.str, kind)
        blocks, block = rows_grid(rows, threads)
        args = (flat(outputs[0]), flat(inputs[0]), np.int64(rows), np.int64(plane), npt(p), npt(1.0 / p))
        return [Launch(kernel, blocks, block, args)]

    return Tactic(f"block_per_row_t{threads}", launches, {"kind": kind, "threads": threads})
