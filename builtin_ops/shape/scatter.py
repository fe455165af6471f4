"""CUDA tactics of the scatter ops (ScatterElements, its deprecated form Scatter, and
ScatterND). Each is two launches: a copy of ``data`` into the output
(:func:`.copies.copy_launch`), then the updates applied to it, in one of two ways.

- One thread per update element (tactics ``scatter_elements``, ``scatter_nd``): the thread
  computes its target offset and stores its value (reduction "none", on bits views as in
  :mod:`.copies`: one compiled kernel for every dtype of a size) or applies it with an
  atomic (add, max, min, for the dtypes Numba has atomics for: :data:`ATOMIC_DTYPES`).
  With reduction "none" and duplicate indices, which update lands is unspecified (ONNX
  says indices "should not have duplicate entries"; the reference keeps the last); atomic
  float sums round in arrival order, so they may differ from the reference in the last bits.
- One thread per run of updates that can meet (``scatter_elements_lines``: the updates of
  one line along the axis; ``scatter_nd_slices``: one element position of the update
  slice, over every index tuple): the thread applies its updates in index order, so the
  result is the reference's, bit for bit, duplicates included. This serves what atomics
  cannot: reduction "mul" and the dtypes without atomics (float16, 8- and 16-bit
  integers). It is parallel only over lines or slice elements: a ScatterND whose index
  tuples address single elements runs on one thread (exact, but slow on many updates).

Index tensors keep their dtype (int32 or int64); negative indices wrap, and an index still
out of range is skipped (that update is dropped; the reference raises instead). Shapes
and strides travel as int64 device tables, so one compiled kernel serves every shape.
float16 is computed in float32 and rounded at every update (as NumPy's float16 does);
max and min propagate NaN (as ``np.maximum``): atomics would drop a NaN update, so the
kernel stores it directly.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
from numba import int64

from plugrt.kernels import c_strides, cuda, flat, grid_1d, jit
from plugrt.plugin import Launch, Tactic
from plugrt_builtin_ops.common.scalars import compute_type, maximum, minimum

from .copies import bits, copy_launch, element_count, int64_table

#: The dtypes Numba's ``cuda.atomic.add``/``max``/``min`` take.
ATOMIC_DTYPES = frozenset(np.dtype(t) for t in ("float32", "float64", "int32", "int64", "uint32", "uint64"))
#: The reductions applied with an atomic; "mul" has none.
ATOMIC_REDUCTIONS = ("add", "max", "min")


def per_update(reduction: str, dtype) -> bool:
    """Whether one thread per update element can apply ``reduction`` to ``dtype``."""
    return reduction == "none" or (reduction in ATOMIC_REDUCTIONS and np.dtype(dtype) in ATOMIC_DTYPES)


# --------------------------------------------------------------------------- device functions


@jit(device=True)
def _wrapped(value, dim):
    """An index wrapped into ``[0, dim)``, or -1 when outside ``[-dim, dim)``."""
    ix = int64(value)
    if ix < 0:
        ix += dim
    if ix < 0 or ix >= dim:
        return int64(-1)
    return ix


@jit(device=True)
def off_axis_offset(i, ndim, ushape, dstrides, axis):
    """The data offset of the coordinates of update ``i`` (C order over ``ushape``), its
    coordinate on ``axis`` left out (the index supplies that one)."""
    r = i
    offset = int64(0)
    for d in range(ndim - 1, -1, -1):
        c = r % ushape[d]
        r //= ushape[d]
        if d != axis:
            offset += c * dstrides[d]
    return offset


@jit(device=True)
def tuple_offset(u, idx, k, dshape, dstrides):
    """The data offset of ScatterND's index tuple ``u`` (its slice's first element), or -1
    when one of its ``k`` indices is out of range."""
    offset = int64(0)
    for j in range(k):
        c = _wrapped(idx[u * k + j], dshape[j])
        if c < 0:
            return int64(-1)
        offset += c * dstrides[j]
    return offset


@jit(device=True)
def _store(out, t, value):
    out[t] = value


@jit(device=True)
def _atomic_add(out, t, value):
    cuda.atomic.add(out, t, value)


@jit(device=True)
def _atomic_max(out, t, value):
    if value != value:  # NaN propagates; the atomic would drop it
        out[t] = value
    else:
        cuda.atomic.max(out, t, value)


@jit(device=True)
def _atomic_min(out, t, value):
    if value != value:
        out[t] = value
    else:
        cuda.atomic.min(out, t, value)


@jit(device=True)
def _add(old, new):
    return old + new


@jit(device=True)
def _mul(old, new):
    return old * new


#: ``apply(out, t, value)`` of one thread per update, by reduction.
APPLY = {"none": _store, "add": _atomic_add, "max": _atomic_max, "min": _atomic_min}
#: ``combine(old, new)`` of the in-order kernels, by reduction.
COMBINE = {"add": _add, "mul": _mul, "max": maximum, "min": minimum}


# --------------------------------------------------------------------------- kernels


@functools.lru_cache(maxsize=None)
def elements_kernel(reduction: str):
    """ScatterElements, one thread per update ``i``: ``apply`` ``updates[i]`` at the data
    coordinates of ``i`` with ``idx[i]`` on ``axis``."""
    apply = APPLY[reduction]

    @jit
    def kernel(out, updates, idx, n, ndim, ushape, dstrides, axis, dim):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            c = _wrapped(idx[i], dim)
            if c >= 0:
                apply(out, off_axis_offset(i, ndim, ushape, dstrides, axis) + c * dstrides[axis], updates[i])

    return kernel


@functools.lru_cache(maxsize=None)
def elements_lines_kernel(reduction: str, dtype: str):
    """ScatterElements, one thread per line along ``axis`` of the updates (viewed as
    ``(outer, count, inner)``), combining its ``count`` updates in order."""
    combine = COMBINE[reduction]
    _, _, load = compute_type(dtype)

    @jit
    def kernel(out, updates, idx, lines, count, inner, ndim, ushape, dstrides, axis, dim):
        step = dstrides[axis]
        for line in range(cuda.grid(1), lines, cuda.gridsize(1)):
            o = line // inner
            first = o * count * inner + (line - o * inner)
            base = off_axis_offset(first, ndim, ushape, dstrides, axis)
            for k in range(count):
                i = first + k * inner
                c = _wrapped(idx[i], dim)
                if c >= 0:
                    t = base + c * step
                    out[t] = combine(load(out, t), load(updates, i))

    return kernel


@functools.lru_cache(maxsize=None)
def nd_kernel(reduction: str):
    """ScatterND, one thread per update element ``i`` (element ``e`` of slice ``u``):
    ``apply`` ``updates[i]`` at the offset of index tuple ``u`` plus ``e``."""
    apply = APPLY[reduction]

    @jit
    def kernel(out, updates, idx, n, slice_size, k, dshape, dstrides):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            u = i // slice_size
            offset = tuple_offset(u, idx, k, dshape, dstrides)
            if offset >= 0:
                apply(out, offset + i - u * slice_size, updates[i])

    return kernel


@functools.lru_cache(maxsize=None)
def nd_slices_kernel(reduction: str, dtype: str):
    """ScatterND, one thread per element ``e`` of the update slice, combining element ``e``
    of every slice into its target, index tuples in order."""
    combine = COMBINE[reduction]
    _, _, load = compute_type(dtype)

    @jit
    def kernel(out, updates, idx, slice_size, count, k, dshape, dstrides):
        for e in range(cuda.grid(1), slice_size, cuda.gridsize(1)):
            for u in range(count):
                offset = tuple_offset(u, idx, k, dshape, dstrides)
                if offset >= 0:
                    t = offset + e
                    out[t] = combine(load(out, t), load(updates, u * slice_size + e))

    return kernel


# --------------------------------------------------------------------------- tactics


def _start(ins, outs, size: int, reduction: str):
    """The output and updates views the second launch takes, and the copy launch."""
    view = bits if reduction == "none" else flat
    return view(outs[0]), view(ins[2]), copy_launch(bits(outs[0]), bits(ins[0]), size)


def scatter_elements_tactic(data_shape: Sequence[int], idx_shape: Sequence[int], axis: int, reduction: str,
                            dtype) -> Tactic:
    """ScatterElements (and Scatter) with runtime indices: one thread per update where
    :func:`per_update` allows, else one thread per line along ``axis``."""
    size, n = element_count(data_shape), element_count(idx_shape)
    dim = int(data_shape[axis])
    ndim = len(idx_shape)
    strides = c_strides(data_shape)
    count = int(idx_shape[axis])
    inner = element_count(idx_shape[axis + 1:])
    lines = n // count if count else 0
    threaded = per_update(reduction, dtype)

    def launches(ins, outs, workspace):
        out, updates, result = _start(ins, outs, size, reduction)
        if n == 0 or dim == 0:
            return result
        tables = (np.int64(ndim), int64_table(idx_shape), int64_table(strides), np.int64(axis), np.int64(dim))
        if threaded:
            blocks, threads = grid_1d(n)
            kernel, args = elements_kernel(reduction), (np.int64(n), *tables)
        else:
            blocks, threads = grid_1d(lines)
            kernel = elements_lines_kernel(reduction, np.dtype(dtype).str)
            args = (np.int64(lines), np.int64(count), np.int64(inner), *tables)
        return result + [Launch(kernel, blocks, threads, (out, updates, flat(ins[1]), *args))]

    return Tactic("scatter_elements" if threaded else "scatter_elements_lines", launches)


def scatter_nd_tactic(data_shape: Sequence[int], idx_shape: Sequence[int], reduction: str, dtype) -> Tactic:
    """ScatterND with runtime indices: one thread per update element where
    :func:`per_update` allows, else one thread per element of the update slice."""
    size = element_count(data_shape)
    k = int(idx_shape[-1])
    count = element_count(idx_shape[:-1])
    slice_size = element_count(data_shape[k:])
    n = count * slice_size
    strides = c_strides(data_shape)
    threaded = per_update(reduction, dtype)

    def launches(ins, outs, workspace):
        out, updates, result = _start(ins, outs, size, reduction)
        if n == 0:
            return result
        tables = (np.int64(k), int64_table(data_shape[:k]), int64_table(strides[:k]))
        if threaded:
            blocks, threads = grid_1d(n)
            kernel, args = nd_kernel(reduction), (np.int64(n), np.int64(slice_size), *tables)
        else:
            blocks, threads = grid_1d(slice_size)
            kernel = nd_slices_kernel(reduction, np.dtype(dtype).str)
            args = (np.int64(slice_size), np.int64(count), *tables)
        return result + [Launch(kernel, blocks, threads, (out, updates, flat(ins[1]), *args))]

    return Tactic("scatter_nd" if threaded else "scatter_nd_slices", launches)
