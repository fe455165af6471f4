"""CUDA tactics of the Reduce* ops, and the axes view all reduction kernels share.

Every reduction (here, in :mod:`.argmax` and :mod:`.softmax`) reduces X over a set
of axes. On the host the shape is split into kept and reduced axes; size-1 axes are
dropped and neighbouring axes of one kind merge, so ReduceSum over axes (1, 2) of NCHW
becomes kept ``[N | HW]`` and reduced ``[C]``. Output element ``o`` (the kept axes in C
order) reads ``x[koff(o) + roff(r)]`` for ``r < n_red``, where ``koff``/``roff`` decode
an index over small ``(sizes, strides)`` device tables (one multiply when a side has a
single merged axis). One compiled kernel thus serves every shape and axes set.

Two kernel forms per op:

- ``block``: ``bx`` threads per output and ``by`` outputs per 2-D block, a shared-memory
  tree reduction over ``bx`` (best when the reduced axis is long or innermost);
- ``thread``: one thread per output with a serial loop (coalesced when the innermost
  axis is kept, and best for short reductions).

Accumulators: float32 for float16/float32, float64 for float64, int64/uint64 for
integers (sums wrap as in the integer type once stored; ReduceMean's integer total is
int64 as in the reference), float64 for ReduceL2 of integers. bool (ReduceMax/Min) runs
as uint8 through a view of the same memory.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import from_dtype

from plugrt.kernels import c_strides, cuda, flat, grid_1d, jit, simulated, to_device
from plugrt.plugin import Launch, Tactic

# --------------------------------------------------------------------------- axes view


@jit(device=True)
def offset_of(i, sizes, strides, nd):
    """Element offset of index ``i`` over merged axes ``sizes``/``strides`` (C order)."""
    if nd == 1:
        return i * strides[0]
    off = 0
    for d in range(nd - 1, -1, -1):
        size = sizes[d]
        off += (i % size) * strides[d]
        i //= size
    return off


def _merge(shape, reduced) -> tuple[list, list]:
    """``(kept, red)`` lists of merged ``[size, stride]`` axes (size-1 axes dropped)."""
    strides = c_strides(shape) if len(shape) else np.zeros(0, np.int64)
    kept, red, last = [], [], None
    for axis, size in enumerate(shape):
        if size == 1:
            continue
        kind = axis in reduced
        group = red if kind else kept
        if kind is last:
            group[-1] = [group[-1][0] * int(size), int(strides[axis])]
        else:
            group.append([int(size), int(strides[axis])])
        last = kind
    return kept, red


@dataclass(frozen=True)
class AxesView:
    """X of ``shape`` reduced over ``reduced`` axes: outputs by reduced elements."""

    shape: tuple
    reduced: tuple

    @functools.cached_property
    def merged(self) -> tuple[list, list]:
        return _merge(tuple(int(d) for d in self.shape), set(self.reduced))

    @property
    def n_out(self) -> int:
        return int(np.prod([s for s, _ in self.merged[0]], dtype=np.int64))

    @property
    def n_red(self) -> int:
        return int(np.prod([s for s, _ in self.merged[1]], dtype=np.int64))

    @property
    def innermost_reduced(self) -> bool:
        """True when the reduced elements of one output are contiguous in memory's last axis."""
        red = self.merged[1]
        return bool(red) and red[-1][1] == 1

    def tables(self) -> tuple:
        """Kernel arguments ``ksizes, kstrides, nk, rsizes, rstrides, nr`` (device arrays)."""
        args = []
        for group in self.merged:
            table = np.asarray(group if group else [[1, 0]], dtype=np.int64)
            args += [to_device(table[:, 0]), to_device(table[:, 1]), np.int64(len(group))]
        return tuple(args)


def _pow2_at_least(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def block_shape(n_out: int, n_red: int) -> tuple[int, int]:
    """GPU block ``(bx, by)``: about four elements per thread, 32 to 256 threads per
    output, outputs stacked until a block has 256 threads. (1024-thread blocks of these
    kernels failed on the H200 with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many registers.)"""
    bx = min(256, max(32, _pow2_at_least(-(-max(n_red, 1) // 4))))
    by = min(max(1, 256 // bx), _pow2_at_least(max(n_out, 1)))
    return bx, by


def launch_shape(n_out: int, bx: int, by: int) -> tuple[int, int, int]:
    """``(grid, bx, by)`` actually launched: a few threads under the simulator."""
    if simulated():
        bx, by = (4, 2) if by > 1 else (8, 1)
        return min(-(-n_out // by), 2), bx, by
    return min(-(-n_out // by), 65535), bx, by


def make_tree(combine, bx: int):
    """A device function reducing ``value`` over the ``bx`` threads of one block row
    (``sm[lead : lead + bx]``) with ``combine``; every thread of the block must call it."""

    @jit(device=True)
    def tree(sm, lead, tx, value):
        sm[lead + tx] = value
        cuda.syncthreads()
        step = bx // 2
        while step > 0:
            if tx < step:
                sm[lead + tx] = combine(sm[lead + tx], sm[lead + tx + step])
            cuda.syncthreads()
            step //= 2
        result = sm[lead]
        cuda.syncthreads()  # the next use overwrites the row
        return result

    return tree


# --------------------------------------------------------------------------- Reduce* math


@functools.lru_cache(maxsize=None)
def log_of(A):
    """``math.log`` for type ``A`` giving -inf at 0 and NaN below, as on the GPU (the
    simulator's ``math.log`` raises there)."""
    lowest, nan, zero = A(-np.inf), A(np.nan), A(0)

    @jit(device=True)
    def log(v):
        if v > zero:  # a typed zero: comparing float32 with a literal 0 widens to float64
            return math.log(v)
        if v == zero:
            return lowest
        return nan

    return log


def accumulator(op: str, dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    if op == "ReduceL2":
        return np.dtype(np.float64)
    return np.dtype(np.uint64) if dtype.kind in "ub" else np.dtype(np.int64)


@functools.lru_cache(maxsize=None)
def reduce_parts(op: str, dtype_name: str):
    """``(acc type, identity, load, combine, post)`` of a Reduce* op on ``dtype_name``.

    ``load(v)`` maps a stored element into the accumulator (square, abs),
    ``combine(a, b)`` folds, ``post(total, n)`` finishes (mean, sqrt, log).
    """
    dtype = np.dtype(dtype_name)
    acc_dtype = accumulator(op, dtype)
    A = acc_dtype.type
    floating = acc_dtype.kind == "f"
    signed = dtype.kind in "fi"
    zero = A(0)

    if op in ("ReduceSumSquare", "ReduceL2"):
        @jit(device=True)
        def load(v):
            a = A(v)
            return a * a
    elif op == "ReduceL1" and signed:
        @jit(device=True)
        def load(v):
            return abs(A(v))
    else:
        @jit(device=True)
        def load(v):
            return A(v)

    if op == "ReduceProd":
        identity = A(1)

        @jit(device=True)
        def combine(a, b):
            return a * b
    elif op in ("ReduceMax", "ReduceMin"):
        if floating:
            identity = A(-np.inf if op == "ReduceMax" else np.inf)
        else:
            low, high = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
            identity = A(low if op == "ReduceMax" else high)
        if op == "ReduceMax":
            @jit(device=True)
            def combine(a, b):
                if a != a or a > b:  # NaN propagates, as np.max
                    return a
                return b
        else:
            @jit(device=True)
            def combine(a, b):
                if a != a or a < b:
                    return a
                return b
    else:
        identity = zero

        @jit(device=True)
        def combine(a, b):
            return a + b

    if op == "ReduceMean" and floating:
        @jit(device=True)
        def post(total, n):
            return total / A(n)
    elif op == "ReduceMean" and signed:
        @jit(device=True)
        def post(total, n):
            if n == 0:
                return zero
            q = abs(total) // n  # truncate toward zero
            if total < 0:
                return -q
            return q
    elif op == "ReduceMean":
        @jit(device=True)
        def post(total, n):
            if n == 0:
                return zero
            return total // A(n)
    elif op == "ReduceL2":
        @jit(device=True)
        def post(total, n):
            return math.sqrt(total)
    elif op == "ReduceLogSum":
        log = log_of(A)

        @jit(device=True)
        def post(total, n):
            return log(total)
    else:
        @jit(device=True)
        def post(total, n):
            return total

    return A, identity, load, combine, post


# --------------------------------------------------------------------------- Reduce* kernels


@functools.lru_cache(maxsize=None)
def reduce_block_kernel(op: str, dtype_name: str, bx: int, by: int):
    A, identity, load, combine, post = reduce_parts(op, dtype_name)
    shared_type = from_dtype(np.dtype(A))
    threads = bx * by
    tree = make_tree(combine, bx)

    @jit
    def kernel(x, out, n_out, n_red, ksizes, kstrides, nk, rsizes, rstrides, nr):
        tx = cuda.threadIdx.x
        lead = cuda.threadIdx.y * bx
        sm = cuda.shared.array(threads, shared_type)
        for first in range(cuda.blockIdx.x * by, n_out, cuda.gridDim.x * by):
            o = first + cuda.threadIdx.y
            acc = identity
            if o < n_out:
                base = offset_of(o, ksizes, kstrides, nk)
                for r in range(tx, n_red, bx):
                    acc = combine(acc, load(x[base + offset_of(r, rsizes, rstrides, nr)]))
            total = tree(sm, lead, tx, acc)
            if o < n_out and tx == 0:
                out[o] = post(total, n_red)

    return kernel


@functools.lru_cache(maxsize=None)
def reduce_thread_kernel(op: str, dtype_name: str):
    A, identity, load, combine, post = reduce_parts(op, dtype_name)

    @jit
    def kernel(x, out, n_out, n_red, ksizes, kstrides, nk, rsizes, rstrides, nr):
        for o in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            base = offset_of(o, ksizes, kstrides, nk)
            acc = identity
            for r in range(n_red):
                acc = combine(acc, load(x[base + offset_of(r, rsizes, rstrides, nr)]))
            out[o] = post(acc, n_red)

    return kernel


def _storage(array, dtype):
    """bool data runs as uint8 through a view of the same memory."""
    array = flat(array)
    return array.view(np.uint8) if np.dtype(dtype) == np.bool_ else array


def block_shapes(n_out: int, n_red: int) -> list[tuple[int, int]]:
    """Block shapes ``(bx, by)`` offered, :func:`block_shape`'s first, then one block of
    256 threads per output, a warp per output (8 outputs a block) and 128 threads per
    output (2 a block); ``by`` never above the outputs, shapes wider than the reduction
    (rounded up to a warp) left out."""
    first = block_shape(n_out, n_red)
    found = [first]
    for bx, by in ((256, 1), (32, 8), (128, 2)):
        shape = (bx, min(by, _pow2_at_least(max(n_out, 1))))
        if shape not in found and bx <= max(32, _pow2_at_least(max(n_red, 1))):
            found.append(shape)
    return found


def view_tactics(view: AxesView, make_block, make_thread, prefer_thread: bool, extra_args=(),
                 dtype=None) -> list[Tactic]:
    """The ``block{bx}x{by}`` tactics (one per :func:`block_shapes` entry) and the
    ``thread`` tactic of a kernel pair over ``view``, ``thread`` first when
    ``prefer_thread``, else last.

    ``make_block(bx, by)`` and ``make_thread()`` return compiled kernels taking
    ``(x, out, n_out, n_red, *tables, *extra_args)``.
    """
    n_out, n_red = view.n_out, view.n_red

    def args(ins, outs):
        return (_storage(ins[0], dtype), _storage(outs[0], dtype), np.int64(n_out), np.int64(n_red),
                *view.tables(), *extra_args)

    def block(ins, outs, workspace, bx, by):
        if n_out == 0:
            return []
        grid, lbx, lby = launch_shape(n_out, bx, by)
        return [Launch(make_block(lbx, lby), grid, (lbx, lby), args(ins, outs))]

    def thread(ins, outs, workspace):
        if n_out == 0:
            return []
        blocks, threads = grid_1d(n_out)
        return [Launch(make_thread(), blocks, threads, args(ins, outs))]

    blocks = [Tactic(f"block{bx}x{by}", functools.partial(block, bx=bx, by=by), {"block": [bx, by]})
              for bx, by in block_shapes(n_out, n_red)]
    single = Tactic("thread", thread, {})
    return [single] + blocks if prefer_thread else blocks + [single]


def prefers_thread(view: AxesView) -> bool:
    """The heuristic order: one thread per output for short reductions, or for many
    outputs whose innermost axis is kept (neighbouring threads read neighbouring data)."""
    return view.n_red <= 8 or (not view.innermost_reduced and view.n_out >= 4096)


def reduce_tactics(op: str, shape, axes, dtype) -> list[Tactic]:
    """Tactics of Reduce* ``op`` (not ReduceLogSumExp) over resolved ``axes``."""
    view = AxesView(tuple(shape), tuple(axes))
    name = np.dtype(dtype).name
    return view_tactics(view, lambda bx, by: reduce_block_kernel(op, name, bx, by),
                        lambda: reduce_thread_kernel(op, name), prefers_thread(view), dtype=dtype)
