"""A tensor as lines along one axis, and the one-thread-per-line tactic over them
(CumSum/CumProd and TopK in reduction, LpNormalization in normalization).

X of ``shape`` seen along ``axis`` is ``[outer, n, inner]`` (the dims before the axis
merged, then the axis, then the dims after it merged): ``outer * inner`` independent
lines of ``n`` elements, ``inner`` apart in memory. Line ``l`` starts at
``(l // inner) * n * inner + l % inner``, so consecutive threads take consecutive inner
indices and their loads and stores coalesce (when ``inner`` is large; an innermost axis
leaves one line per thread and strided access).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from plugrt.kernels import flat, grid_1d, jit
from plugrt.plugin import Launch, Tactic


def axis_lines(shape, axis: int) -> tuple[int, int, int]:
    """``(outer, n, inner)``: X of ``shape`` as lines of ``n`` elements along ``axis``."""
    shape = [int(d) for d in shape]
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, shape[axis], inner


@jit(device=True)
def line_start(line, n, inner):
    """Offset of line ``line``'s first element in an array of ``[outer, n, inner]``."""
    return (line // inner) * n * inner + line % inner


def line_tactic(name: str, kernel, shape, axis: int, params: Mapping | None = None) -> Tactic:
    """A tactic launching ``kernel(x, y, n_lines, n, inner)`` with a thread per line of
    input 0 along ``axis`` (output 0 of the same shape); nothing for an empty one."""
    outer, n, inner = axis_lines(shape, axis)
    n_lines = outer * inner

    def launches(ins, outs, workspace):
        if n_lines == 0 or n == 0:
            return []
        blocks, threads = grid_1d(n_lines)
        args = (flat(ins[0]), flat(outs[0]), np.int64(n_lines), np.int64(n), np.int64(inner))
        return [Launch(kernel, blocks, threads, args)]

    return Tactic(name, launches, dict(params or {}))
