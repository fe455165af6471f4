"""CUDA tactics of the exponential reductions: Softmax, LogSoftmax and ReduceLogSumExp.

All three find the row maximum, sum ``exp(x - max)`` and finish per element (Softmax,
LogSoftmax, in X's layout) or per row (ReduceLogSumExp). A maximum that is not finite
is replaced by 0, as in the reference, so rows of -inf, +inf or NaN give what NumPy gives.
Rows are the kept axes of an :class:`.reduce.AxesView`; the same ``block``
(a shared-memory tree per row, ``by`` rows per block) and ``thread`` forms as the other
reductions. float16 and float32 compute in float32, float64 in float64.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import from_dtype

from plugrt.kernels import cuda, jit
from plugrt.plugin import Tactic

from .reduce import AxesView, log_of, make_tree, offset_of, prefers_thread, view_tactics

# Modes (ints: kernels compare them as compile-time constants).
SOFTMAX, LOG_SOFTMAX, LOG_SUM_EXP = 0, 1, 2


def compute_type(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


@jit(device=True)
def _max_nan(a, b):
    if a != a or a > b:  # NaN propagates, as np.max
        return a
    return b


@jit(device=True)
def _add(a, b):
    return a + b


@jit(device=True)
def _index(r, rs, rsizes, rstrides, nr):
    """``offset_of`` with the single-axis stride ``rs`` hoisted out of the row loops."""
    if nr == 1:
        return r * rs
    return offset_of(r, rsizes, rstrides, nr)


@functools.lru_cache(maxsize=None)
def finisher(A, mode: int):
    """``finish(v, peak, c)``: Softmax ``exp(v - peak) * c`` (c = 1/sum), LogSoftmax
    ``v - c`` (c = peak + log(sum))."""
    if mode == SOFTMAX:
        @jit(device=True)
        def finish(v, peak, c):
            return math.exp(v - peak) * c
    else:
        @jit(device=True)
        def finish(v, peak, c):
            return v - c
    return finish


@functools.lru_cache(maxsize=None)
def exp_block_kernel(dtype_name: str, mode: int, bx: int, by: int):
    """``bx`` threads per row, ``by`` rows per block. Each thread keeps its first four
    elements of the row in registers for the three passes (X is read once when the row
    has at most ``4 * bx`` elements, as :func:`block_shape` arranges up to 4096); the
    rest of a longer row is read again in each pass."""
    A = compute_type(dtype_name)
    shared_type = from_dtype(np.dtype(A))
    threads = bx * by
    tree_max = make_tree(_max_nan, bx)
    tree_sum = make_tree(_add, bx)
    zero, one, lowest = A(0), A(1), A(-np.inf)
    log = log_of(A)
    finish = finisher(A, mode)
    span = 4 * bx

    @jit
    def kernel(x, out, n_out, n_red, ksizes, kstrides, nk, rsizes, rstrides, nr):
        tx = cuda.threadIdx.x
        lead = cuda.threadIdx.y * bx
        sm = cuda.shared.array(threads, shared_type)
        rs = rstrides[0]
        r1 = tx + bx
        r2 = r1 + bx
        r3 = r2 + bx
        for first in range(cuda.blockIdx.x * by, n_out, cuda.gridDim.x * by):
            o = first + cuda.threadIdx.y
            valid = o < n_out
            base = 0
            v0 = lowest
            v1 = lowest
            v2 = lowest
            v3 = lowest
            if valid:
                base = offset_of(o, ksizes, kstrides, nk)
                if tx < n_red:
                    v0 = A(x[base + _index(tx, rs, rsizes, rstrides, nr)])
                if r1 < n_red:
                    v1 = A(x[base + _index(r1, rs, rsizes, rstrides, nr)])
                if r2 < n_red:
                    v2 = A(x[base + _index(r2, rs, rsizes, rstrides, nr)])
                if r3 < n_red:
                    v3 = A(x[base + _index(r3, rs, rsizes, rstrides, nr)])
            m = _max_nan(_max_nan(v0, v1), _max_nan(v2, v3))
            if valid:
                for r in range(tx + span, n_red, bx):
                    m = _max_nan(m, A(x[base + _index(r, rs, rsizes, rstrides, nr)]))
            peak = tree_max(sm, lead, tx, m)
            if math.isinf(peak) or math.isnan(peak):
                peak = zero
            # lanes past the row hold -inf: exp(-inf - peak) adds 0
            s = math.exp(v0 - peak) + math.exp(v1 - peak) + math.exp(v2 - peak) + math.exp(v3 - peak)
            if valid:
                for r in range(tx + span, n_red, bx):
                    s += math.exp(A(x[base + _index(r, rs, rsizes, rstrides, nr)]) - peak)
            total = tree_sum(sm, lead, tx, s)
            if valid:
                if mode == LOG_SUM_EXP:
                    if tx == 0:
                        out[o] = log(total) + peak
                else:
                    c = one / total if mode == SOFTMAX else peak + log(total)
                    if tx < n_red:
                        out[base + _index(tx, rs, rsizes, rstrides, nr)] = finish(v0, peak, c)
                    if r1 < n_red:
                        out[base + _index(r1, rs, rsizes, rstrides, nr)] = finish(v1, peak, c)
                    if r2 < n_red:
                        out[base + _index(r2, rs, rsizes, rstrides, nr)] = finish(v2, peak, c)
                    if r3 < n_red:
                        out[base + _index(r3, rs, rsizes, rstrides, nr)] = finish(v3, peak, c)
                    for r in range(tx + span, n_red, bx):
                        i = base + _index(r, rs, rsizes, rstrides, nr)
                        out[i] = finish(A(x[i]), peak, c)

    return kernel


@functools.lru_cache(maxsize=None)
def exp_thread_kernel(dtype_name: str, mode: int):
    A = compute_type(dtype_name)
    zero, one, lowest = A(0), A(1), A(-np.inf)
    log = log_of(A)
    finish = finisher(A, mode)

    @jit
    def kernel(x, out, n_out, n_red, ksizes, kstrides, nk, rsizes, rstrides, nr):
        for o in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            base = offset_of(o, ksizes, kstrides, nk)
            peak = lowest
            for r in range(n_red):
                peak = _max_nan(peak, A(x[base + offset_of(r, rsizes, rstrides, nr)]))
            if math.isinf(peak) or math.isnan(peak):
                peak = zero
            total = zero
            for r in range(n_red):
                total += math.exp(A(x[base + offset_of(r, rsizes, rstrides, nr)]) - peak)
            if mode == LOG_SUM_EXP:
                out[o] = log(total) + peak
            else:
                c = one / total if mode == SOFTMAX else peak + log(total)
                for r in range(n_red):
                    i = base + offset_of(r, rsizes, rstrides, nr)
                    out[i] = finish(A(x[i]), peak, c)

    return kernel


def exp_tactics(mode: int, shape, axes, dtype) -> list[Tactic]:
    """Softmax/LogSoftmax over ``axes`` (X's layout out), or ReduceLogSumExp (reduced out)."""
    view = AxesView(tuple(int(d) for d in shape), tuple(axes))
    name = np.dtype(dtype).name
    return view_tactics(view, lambda bx, by: exp_block_kernel(name, mode, bx, by),
                        lambda: exp_thread_kernel(name, mode), prefers_thread(view))
