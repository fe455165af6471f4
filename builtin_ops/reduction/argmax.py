"""CUDA tactics of ArgMax, ArgMin and Hardmax: the index of the extremum per output.

Same :class:`.reduce.AxesView` and ``block``/``thread`` forms as the Reduce*
ops. A candidate is a (value, index) pair, index -1 for none yet; NaN counts as the
extremum and ties go to the first index (the last with ``select_last_index``), as NumPy's
``argmax`` on X (or on X flipped) does. Values compare in float32 (float16, float32),
float64, int64 or uint64.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import from_dtype

from plugrt.kernels import cuda, jit
from plugrt.plugin import Tactic

from .reduce import AxesView, offset_of, prefers_thread, view_tactics



def value_type(dtype):
    """The type extremum searches compare ``dtype`` in."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.float64 if dtype == np.float64 else np.float32
    return np.uint64 if dtype.kind == "u" else np.int64


@functools.lru_cache(maxsize=None)
def arg_better(is_max: bool, last: bool):
    """``better(vb, ib, va, ia)``: candidate b beats a (index -1: none yet). NaN counts as
    the extremum and ties go to the first index (the last with ``last``), as NumPy."""

    @jit(device=True)
    def later(ib, ia):
        if last:
            return ib > ia
        return ib < ia

    @jit(device=True)
    def better(vb, ib, va, ia):
        if ib < 0:
            return False
        if ia < 0:
            return True
        if va != va:
            return vb != vb and later(ib, ia)
        if vb != vb:
            return True
        if vb == va:
            return later(ib, ia)
        if is_max:
            return vb > va
        return vb < va

    return better


@functools.lru_cache(maxsize=None)
def arg_block_kernel(dtype_name: str, is_max: bool, last: bool, hardmax: bool, bx: int, by: int):
    """Index of the extremum per output (``hardmax``: a one-hot row in X's layout)."""
    V = value_type(dtype_name)
    shared_type = from_dtype(np.dtype(V))
    better = arg_better(is_max, last)
    index_type = from_dtype(np.dtype(np.int64))
    threads = bx * by
    one, zero = V(1), V(0)

    @jit
    def kernel(x, out, n_out, n_red, ksizes, kstrides, nk, rsizes, rstrides, nr):
        tx = cuda.threadIdx.x
        lead = cuda.threadIdx.y * bx
        slot = lead + tx
        sv = cuda.shared.array(threads, shared_type)
        si = cuda.shared.array(threads, index_type)
        for first in range(cuda.blockIdx.x * by, n_out, cuda.gridDim.x * by):
            o = first + cuda.threadIdx.y
            best = zero
            index = -1
            base = 0
            if o < n_out:
                base = offset_of(o, ksizes, kstrides, nk)
                for r in range(tx, n_red, bx):
                    v = V(x[base + offset_of(r, rsizes, rstrides, nr)])
                    if better(v, r, best, index):
                        best = v
                        index = r
            sv[slot] = best
            si[slot] = index
            cuda.syncthreads()
            step = bx // 2
            while step > 0:
                if tx < step and better(sv[slot + step], si[slot + step], sv[slot], si[slot]):
                    sv[slot] = sv[slot + step]
                    si[slot] = si[slot + step]
                cuda.syncthreads()
                step //= 2
            found = si[lead]
            cuda.syncthreads()
            if o < n_out:
                if hardmax:
                    for r in range(tx, n_red, bx):
                        out[base + offset_of(r, rsizes, rstrides, nr)] = one if r == found else zero
                elif tx == 0:
                    out[o] = max(found, 0)

    return kernel


@functools.lru_cache(maxsize=None)
def arg_thread_kernel(dtype_name: str, is_max: bool, last: bool, hardmax: bool):
    V = value_type(dtype_name)
    better = arg_better(is_max, last)
    one, zero = V(1), V(0)

    @jit
    def kernel(x, out, n_out, n_red, ksizes, kstrides, nk, rsizes, rstrides, nr):
        for o in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            base = offset_of(o, ksizes, kstrides, nk)
            best = zero
            index = -1
            for r in range(n_red):
                v = V(x[base + offset_of(r, rsizes, rstrides, nr)])
                if better(v, r, best, index):
                    best = v
                    index = r
            if hardmax:
                for r in range(n_red):
                    out[base + offset_of(r, rsizes, rstrides, nr)] = one if r == index else zero
            else:
                out[o] = max(index, 0)

    return kernel


def arg_tactics(shape, axes, dtype, is_max: bool = True, last: bool = False,
                hardmax: bool = False) -> list[Tactic]:
    """ArgMax/ArgMin over ``axes`` (one axis; int64 output), or with ``hardmax`` the one-hot
    rows over ``axes`` in X's layout (first maximum in C order over the axes)."""
    view = AxesView(tuple(int(d) for d in shape), tuple(axes))
    name = np.dtype(dtype).name
    return view_tactics(view, lambda bx, by: arg_block_kernel(name, is_max, last, hardmax, bx, by),
                        lambda: arg_thread_kernel(name, is_max, last, hardmax), prefers_thread(view))
