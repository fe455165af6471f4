"""CUDA tactic of AffineGrid: one thread per output point computes its 2 (or 3) coordinates,
``theta[n] @ [x, y, (z,) 1]``, from its base-grid position. The sizes are arguments, so
one compiled kernel per dtype and rank serves every shape; float16 computes in float32.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import cuda, flat, grid_1d, jit
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type


@functools.lru_cache(maxsize=None)
def affine_grid_kernel(dtype: str, rank: int):
    """``kernel(grid, theta, points, depth, height, width, align)`` over ``rank`` (2 or 3)
    spatial dims; ``depth`` is 1 for 2-D."""
    _, npt, load = compute_type(dtype)
    one, two = npt(1), npt(2)
    cols = rank + 1

    @jit(device=True)
    def base(i, size, align):
        if align:
            return -one if size == 1 else -one + two * npt(i) / npt(size - 1)
        return (two * npt(i) + one) / npt(size) - one

    @jit
    def kernel(grid, theta, points, depth, height, width, align):
        start, step = cuda.grid(1), cuda.gridsize(1)
        for p in range(start, points, step):
            w = p % width
            rest = p // width
            h = rest % height
            rest //= height
            n = rest // depth
            x, y = base(w, width, align), base(h, height, align)
            z = base(rest % depth, depth, align)
            for j in range(rank):
                row = (n * rank + j) * cols
                value = load(theta, row) * x + load(theta, row + 1) * y + load(theta, row + rank)
                if rank == 3:
                    value += load(theta, row + 2) * z
                grid[p * rank + j] = value

    return kernel


def affine_grid_tactic(theta, out, rank: int, align: int) -> Tactic:
    """The one tactic of an AffineGrid node: ``out`` ``[N, (D,) H, W, rank]``."""
    spatial = [int(d) for d in out.shape[1:-1]]
    depth, height, width = ([1] + spatial)[-3:] if rank == 2 else spatial
    points = int(out.shape[0]) * math.prod(spatial)
    kernel = affine_grid_kernel(np.dtype(theta.dtype).str, rank)

    def launches(inputs, outputs, workspace):
        if points == 0:
            return []
        blocks, threads = grid_1d(points)
        return [Launch(kernel, blocks, threads, (flat(outputs[0]), flat(inputs[0]), np.int64(points), np.int64(depth),
                                                 np.int64(height), np.int64(width), np.int64(align)))]

    return Tactic("points", launches, {})
