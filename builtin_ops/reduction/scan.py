"""CUDA tactics of CumSum and CumProd, over X's lines along the axis
(:mod:`plugrt_builtin_ops.common.lines`).

CumSum and CumProd run one thread per line in a grid-stride loop, each walking its line in
order (from the end with ``reverse``) and storing the running sum or product after taking
the element in (before, with ``exclusive``). Accumulators: float32 for float16 and
float32, float64 for float64, int64 or uint64 for integers (stored, the result wraps as in
the integer type: the low bits of a sum or product depend on the operands' low bits only).
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import cuda, jit
from plugrt.plugin import Tactic

from plugrt_builtin_ops.common.lines import line_start, line_tactic


def scan_accumulator(dtype) -> type:
    """The NumPy type CumSum adds ``dtype`` in."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.float64 if dtype == np.float64 else np.float32
    return np.uint64 if dtype.kind == "u" else np.int64


@functools.lru_cache(maxsize=None)
def narrow_to(dtype_name: str):
    """``narrow(total)``: an accumulator value as stored in ``dtype_name``. Integers wrap by an
    explicit cast (as the GPU's store would; the simulator's store refuses an out-of-range
    value); floats convert in the store."""
    dtype = np.dtype(dtype_name)
    if dtype.kind == "f":
        @jit(device=True)
        def narrow(total):
            return total
    else:
        T = dtype.type

        @jit(device=True)
        def narrow(total):
            return T(total)

    return narrow


@functools.lru_cache(maxsize=None)
def scan_kernel(dtype_name: str, product: bool, exclusive: bool, reverse: bool):
    """``kernel(x, y, n_lines, n, inner)``: the running sums (``product``: products) of each
    line of X into Y."""
    A = scan_accumulator(dtype_name)
    narrow = narrow_to(dtype_name)
    start_value = A(1) if product else A(0)

    @jit
    def kernel(x, y, n_lines, n, inner):
        for line in range(cuda.grid(1), n_lines, cuda.gridsize(1)):
            start = line_start(line, n, inner)
            total = start_value
            for step in range(n):
                if reverse:
                    at = start + (n - 1 - step) * inner
                else:
                    at = start + step * inner
                if exclusive:
                    y[at] = narrow(total)
                if product:
                    total *= A(x[at])
                else:
                    total += A(x[at])
                if not exclusive:
                    y[at] = narrow(total)

    return kernel


def scan_tactics(shape, axis: int, dtype, product: bool, exclusive: bool, reverse: bool) -> list[Tactic]:
    """CumSum (``product``: CumProd) of X (``shape``, ``dtype``) along the resolved ``axis``:
    one ``thread`` tactic."""
    return [line_tactic("thread", scan_kernel(np.dtype(dtype).name, product, exclusive, reverse), shape, axis)]
