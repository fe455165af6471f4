"""CUDA tactic of TopK: one thread per line along the axis (the lines of :mod:`.scan`),
keeping the best ``k`` so far in the output buffers themselves.

Each thread walks its line of ``n`` elements in index order and inserts each element that
ranks before the current last of its ``k`` (or that arrives while fewer than ``k`` are kept)
at its place, shifting the worse ones down: O(n * k) per line, for the common small ``k``
(``k`` up to the axis length is correct, only slower). An element moves ahead of another
only when it ranks strictly before it, so equal values stay in index order (the lower index
first), as in ONNX's reference; NaN ranks above every number and NaNs tie. Values compare
in float32 (float16, float32), float64, int64 or uint64 (:func:`.argmax.value_type`) and are
copied from X unchanged.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import cuda, flat, grid_1d, jit
from plugrt.plugin import Launch, Tactic

from .argmax import value_type
from plugrt_builtin_ops.common.lines import axis_lines, line_start


@functools.lru_cache(maxsize=None)
def ranks_before(largest: bool):
    """``before(v, u)``: value ``v`` ranks strictly before ``u`` (NaN above every number)."""

    if largest:
        @jit(device=True)
        def before(v, u):
            if v != v:
                return u == u
            return v > u
    else:
        @jit(device=True)
        def before(v, u):
            if u != u:
                return v == v
            return v < u

    return before


@functools.lru_cache(maxsize=None)
def topk_kernel(dtype_name: str, largest: bool):
    """``kernel(x, values, indices, n_lines, n, inner, k)``: per line of X (``[outer, n,
    inner]``) the best ``k`` (``k >= 1``) in rank order into ``values``/``indices``
    (``[outer, k, inner]``)."""
    V = value_type(dtype_name)
    before = ranks_before(largest)

    @jit
    def kernel(x, values, indices, n_lines, n, inner, k):
        for line in range(cuda.grid(1), n_lines, cuda.gridsize(1)):
            start = line_start(line, n, inner)
            first = line_start(line, k, inner)
            last = first + (k - 1) * inner
            kept = 0
            for j in range(n):
                v = V(x[start + j * inner])
                if kept < k:
                    slot = kept
                    kept += 1
                elif before(v, V(values[last])):
                    slot = k - 1
                else:
                    continue
                while slot > 0 and before(v, V(values[first + (slot - 1) * inner])):
                    values[first + slot * inner] = values[first + (slot - 1) * inner]
                    indices[first + slot * inner] = indices[first + (slot - 1) * inner]
                    slot -= 1
                values[first + slot * inner] = x[start + j * inner]
                indices[first + slot * inner] = j

    return kernel


def topk_tactics(shape, axis: int, k: int, dtype, largest: bool) -> list[Tactic]:
    """TopK of X (``shape``, ``dtype``) along the resolved ``axis``: one ``thread`` tactic."""
    outer, n, inner = axis_lines(shape, axis)
    n_lines = outer * inner
    name = np.dtype(dtype).name

    def launches(ins, outs, workspace):
        if n_lines == 0 or k == 0:
            return []
        blocks, threads = grid_1d(n_lines)
        args = (flat(ins[0]), flat(outs[0]), flat(outs[1]), np.int64(n_lines), np.int64(n), np.int64(inner),
                np.int64(k))
        return [Launch(topk_kernel(name, largest), blocks, threads, args)]

    return [Tactic("thread", launches, {})]
