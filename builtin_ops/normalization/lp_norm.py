"""The CUDA kernel of LpNormalization: X seen along its axis as ``[outer, n, inner]``, one
thread per line of ``n`` elements (``inner`` apart, so neighbouring threads' loads
coalesce when the axis is not the last). Each thread sums ``|x|`` (p=1) or ``x^2`` (p=2)
in float32 (float64 for float64 X), then writes ``x / norm``, or 0 where the norm is 0
(every element of the line 0), as the spec says.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from plugrt.kernels import cuda, jit
from plugrt.plugin import Tactic

from plugrt_builtin_ops.common.lines import line_start, line_tactic
from .row_norm import accumulator


@functools.lru_cache(maxsize=None)
def lp_norm_kernel(dtype_name: str, p: int):
    """``kernel(x, y, n_lines, n, inner)``: each line of X divided by its Lp norm, into Y."""
    A = accumulator(dtype_name).type
    zero = A(0)
    sqrt = math.sqrt

    @jit
    def kernel(x, y, n_lines, n, inner):
        for line in range(cuda.grid(1), n_lines, cuda.gridsize(1)):
            start = line_start(line, n, inner)
            total = zero
            for step in range(n):
                v = A(x[start + step * inner])
                if p == 1:
                    total += abs(v)
                else:
                    total += v * v
            norm = total if p == 1 else A(sqrt(total))
            for step in range(n):
                at = start + step * inner
                if norm == zero:
                    y[at] = zero
                else:
                    y[at] = A(x[at]) / norm

    return kernel


def lp_norm_tactics(shape, axis: int, dtype, p: int) -> list[Tactic]:
    """LpNormalization of X (``shape``, ``dtype``) along the resolved ``axis``: one ``thread``
    tactic."""
    return [line_tactic("thread", lp_norm_kernel(np.dtype(dtype).name, p), shape, axis, {"p": p})]
