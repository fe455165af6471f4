"""CUDA tactics of the data-movement ops: contiguous copies, strided (permuted, sliced,
broadcast, tiled) copies, row-block copies for Concat/Split, and index gathers (the
shared-memory Transpose is in :mod:`.transpose`).

Moving data never looks at values, so every kernel here reads and writes flat views of
its tensors as unsigned ints of the element's size (:func:`bits`): one compiled kernel
serves float16/32/64, every integer type and bool alike. Layouts are computed on the host
by the op (shapes, element strides, a base offset) and travel as int64 device tables, so
one compiled kernel serves every shape. Index tensors (Gather's, GatherElements',
GatherND's) keep their own dtype, int32 or int64; negative indices wrap, and indices
still out of range are clamped so that a bad index reads a wrong element instead of
foreign memory.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import int64

from plugrt.kernels import c_strides, cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(array):
    """A flat view of a C-contiguous device array as unsigned ints of its item size."""
    return flat(array).view(UINT[np.dtype(array.dtype).itemsize])


def host_bits(array: np.ndarray) -> np.ndarray:
    """The same reinterpretation of a host array (1-D, at least one element)."""
    array = np.ascontiguousarray(array).reshape(-1)
    return array.view(UINT[array.dtype.itemsize])


def int64_table(values) -> object:
    """A small int64 device table; never empty (rank-0 layouts pass a dummy entry)."""
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    return to_device(values if values.size else np.zeros(1, np.int64))


def element_count(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


# --------------------------------------------------------------------------- kernels


@jit
def copy_kernel(out, x, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        out[i] = x[i]


@jit
def fill_kernel(out, value, n):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        out[i] = value


@jit
def guarded_copy_kernel(out, x, n, flag, value, value_mask, poison):
    """``out = x``, or ``poison`` everywhere when ``flag[0]`` and ``value[0] & value_mask``."""
    spoil = flag[0] != 0 and (value[0] & value_mask) != 0
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        if spoil:
            out[i] = poison
        else:
            out[i] = x[i]


@jit
def strided_kernel(out, x, n, ndim, oshape, strides, base):
    """``out[i] = x[base + sum_d coord_d(i) * strides[d]]`` (strides may be 0 or negative)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i
        src = base
        for d in range(ndim - 1, -1, -1):
            src += (r % oshape[d]) * strides[d]
            r //= oshape[d]
        out[i] = x[src]


@jit
def tile_kernel(out, x, n, ndim, oshape, ishape, strides):
    """Like :func:`strided_kernel`, reading coordinate ``coord_d(i) % ishape[d]``."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i
        src = int64(0)
        for d in range(ndim - 1, -1, -1):
            src += ((r % oshape[d]) % ishape[d]) * strides[d]
            r //= oshape[d]
        out[i] = x[src]


@jit
def rows_copy_kernel(dst, src, n, row, dst_row, dst_off, src_row, src_off):
    """Copy ``n // row`` rows of ``row`` elements between row-strided blocks."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        o = i // row
        j = i - o * row
        dst[o * dst_row + dst_off + j] = src[o * src_row + src_off + j]


@jit(device=True)
def _wrap_index(value, dim):
    ix = int64(value)
    if ix < 0:
        ix += dim
    return min(max(ix, int64(0)), dim - 1)


@jit
def gather_kernel(out, x, idx, n, inner, count, dim):
    """Gather along an axis: ``x`` as (outer, dim, inner), ``out`` as (outer, count, inner)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        j = i % inner
        t = i // inner
        k = t % count
        o = t // count
        out[i] = x[(o * dim + _wrap_index(idx[k], dim)) * inner + j]


@jit
def gather_elements_kernel(out, x, idx, n, ndim, ishape, xstrides, axis, dim):
    """``out[c] = x[c with c[axis] = idx[c]]`` over the index tensor's coordinates ``c``."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r = i
        src = int64(0)
        for d in range(ndim - 1, -1, -1):
            c = r % ishape[d]
            r //= ishape[d]
            if d == axis:
                c = _wrap_index(idx[i], dim)
            src += c * xstrides[d]
        out[i] = x[src]


@jit
def gather_nd_kernel(out, x, idx, n, slice_size, count, block, k, dims, strides):
    """GatherND: output element ``i`` is element ``i % slice_size`` of the slice that index
    tuple ``t = i // slice_size`` (``k`` entries at ``idx[t * k:]``) picks in batch block
    ``t // count`` (``block`` elements of ``x`` each); ``dims``/``strides`` are the indexed
    axes' sizes and element strides."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        s = i % slice_size
        t = i // slice_size
        src = (t // count) * block + s
        for j in range(k):
            src += _wrap_index(idx[t * k + j], dims[j]) * strides[j]
        out[i] = x[src]


@jit
def reverse_sequence_kernel(out, x, lens, n, inner, d1, batch_axis, max_time):
    """ReverseSequence over ``x`` as ``(d0, d1, inner)`` with the batch and time axes 0 and 1
    (in the order ``batch_axis`` says): the first ``lens[b]`` steps of each batch entry
    reversed, the rest copied; a length is clamped into ``[0, max_time]``."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        j = i % inner
        r = i // inner
        c1 = r % d1
        c0 = r // d1
        if batch_axis == 0:
            b, t = c0, c1
        else:
            b, t = c1, c0
        length = min(max(int64(lens[b]), int64(0)), max_time)
        if t < length:
            t = length - 1 - t
        if batch_axis == 0:
            out[i] = x[(b * d1 + t) * inner + j]
        else:
            out[i] = x[(t * d1 + b) * inner + j]


# --------------------------------------------------------------------------- layouts


def coalesce(shape: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    """Drop size-1 axes and merge neighbours read as one run, so a kernel divides less."""
    sizes: list[int] = []
    steps: list[int] = []
    for size, stride in zip(shape, strides):
        size, stride = int(size), int(stride)
        if size == 1:
            continue
        if sizes and steps[-1] == stride * size:
            sizes[-1] *= size
            steps[-1] = stride
        else:
            sizes.append(size)
            steps.append(stride)
    return sizes, steps


def copy_launch(out, x, n: int) -> list[Launch]:
    """Launches copying ``n`` elements of flat ``x`` into flat ``out`` (bits views)."""
    if n == 0:
        return []
    blocks, threads = grid_1d(n)
    return [Launch(copy_kernel, blocks, threads, (out, x, np.int64(n)))]


def fill_launch(out, value: np.ndarray) -> list[Launch]:
    """Launches filling device array ``out`` with the one-element host array ``value``."""
    n = element_count(out.shape)
    if n == 0:
        return []
    scalar = host_bits(np.asarray(value, dtype=out.dtype))[0]
    blocks, threads = grid_1d(n)
    return [Launch(fill_kernel, blocks, threads, (bits(out), scalar, np.int64(n)))]


def table_launch(out, value: np.ndarray) -> list[Launch]:
    """Launches writing the host array ``value`` (known at build time) into ``out``."""
    if value.size == 0:
        return []
    table = to_device(host_bits(np.asarray(value, dtype=out.dtype)))
    return copy_launch(bits(out), table, int(value.size))


# --------------------------------------------------------------------------- tactics


def copy_tactic() -> Tactic:
    """Output = input in C order (Reshape, Flatten, Squeeze, Unsqueeze, Identity)."""

    def launches(ins, outs, workspace):
        return copy_launch(bits(outs[0]), bits(ins[0]), element_count(outs[0].shape))

    return Tactic("copy", launches)


def dropout_tactic(x_dtype, training_info, ratio_info) -> Tactic:
    """Inference Dropout: ``out = x`` and a mask of ones. When ``training_mode`` may be
    true (known true with a runtime ratio, or itself a runtime tensor) the kernel checks
    it and the ratio on the device, and where the run asks for random dropping (which
    plugrt does not implement) writes NaN, never a plausible undropped result."""
    x_dtype = np.dtype(x_dtype)
    poison = host_bits(np.array([np.nan], x_dtype))[0]

    def launches(ins, outs, workspace):
        n = element_count(outs[0].shape)
        if training_info is None or (training_info.value is not None and not training_info.value.any()):
            result = copy_launch(bits(outs[0]), bits(ins[0]), n)
        elif n == 0:
            result = []
        else:
            if ratio_info is None or ratio_info.value is not None:
                ratio = 0.5 if ratio_info is None else ratio_info.value
                value = to_device(host_bits(np.array(ratio, dtype=x_dtype if ratio_info is None else ratio_info.dtype)))
            else:
                value = bits(ins[1])
            magnitude = np.iinfo(value.dtype).max >> 1  # every bit but the sign: -0.0 is 0
            blocks, threads = grid_1d(n)
            flag = bits(ins[2]) if training_info.value is None else to_device(host_bits(training_info.value))
            args = (bits(outs[0]), bits(ins[0]), np.int64(n), flag, value, value.dtype.type(magnitude), poison)
            result = [Launch(guarded_copy_kernel, blocks, threads, args)]
        if len(outs) > 1 and outs[1] is not None:
            result += fill_launch(outs[1], np.ones(1, outs[1].dtype))
        return result

    return Tactic("copy", launches)


def strided_launch(out, x, sizes: Sequence[int], steps: Sequence[int], base: int = 0) -> list[Launch]:
    """:func:`strided_kernel` over flat ``out`` and ``x`` (their elements: any unsigned
    width), for the coalesced layout ``sizes``/``steps``; nothing for an empty output."""
    n = element_count(sizes)
    if n == 0:
        return []
    blocks, threads = grid_1d(n)
    return [Launch(strided_kernel, blocks, threads, (out, x, np.int64(n), np.int64(len(sizes)), int64_table(sizes),
                                                     int64_table(steps), np.int64(base)))]


def strided_tactic(out_shape: Sequence[int], strides: Sequence[int], base: int = 0) -> Tactic:
    """``out[c] = x_flat[base + c . strides]``: Transpose (permuted strides), Slice (scaled
    strides and a start offset), Expand (zero strides on broadcast axes)."""
    sizes, steps = coalesce(out_shape, strides)
    n = element_count(out_shape)

    def launches(ins, outs, workspace):
        if n and sizes == [n] and steps == [1]:
            return copy_launch(bits(outs[0]), bits(ins[0])[base:base + n], n)
        return strided_launch(bits(outs[0]), bits(ins[0]), sizes, steps, base)

    return Tactic("strided", launches, {"rank": len(sizes)})


def generic_strided_tactic(out_shape: Sequence[int], strides: Sequence[int], base: int = 0) -> Tactic:
    """:func:`strided_tactic` as one kernel at every shape: no copy where the coalesced
    view is contiguous and no rank in its identity (the kernel takes it as an argument),
    so a layer whose size-1 axes come and go over its profile (a Transpose moving the batch
    axis, a Slice of the tokens, at batch 1 and 3) has a generic tactic
    (:mod:`plugrt.engine.generic`)."""
    sizes, steps = coalesce(out_shape, strides)  # (a size-0 axis stays: no launch then)

    def launches(ins, outs, workspace):
        return strided_launch(bits(outs[0]), bits(ins[0]), sizes, steps, base)

    return Tactic("strided_any_rank", launches)


def tile_tactic(in_shape: Sequence[int], out_shape: Sequence[int]) -> Tactic:
    """Tile: output coordinate ``c`` reads input coordinate ``c % in_shape``."""
    n = element_count(out_shape)
    strides = c_strides(in_shape)

    def launches(ins, outs, workspace):
        if n == 0:
            return []
        blocks, threads = grid_1d(n)
        args = (bits(outs[0]), bits(ins[0]), np.int64(n), np.int64(len(out_shape)), int64_table(out_shape),
                int64_table(in_shape), int64_table(strides))
        return [Launch(tile_kernel, blocks, threads, args)]

    return Tactic("tile", launches)


def _rows(shape: Sequence[int], axis: int) -> tuple[int, int]:
    """(outer, inner) element counts around ``axis``."""
    return element_count(shape[:axis]), element_count(shape[axis + 1:])


def concat_tactic(in_shapes: Sequence[Sequence[int]], axis: int, out_shape: Sequence[int]) -> Tactic:
    """One row-block copy per non-empty input into its slab of the output."""
    outer, inner = _rows(out_shape, axis)
    total = int(out_shape[axis]) * inner

    def launches(ins, outs, workspace):
        out = bits(outs[0])
        result, offset = [], 0
        for x, shape in zip(ins, in_shapes):
            row = int(shape[axis]) * inner
            n = outer * row
            if n:
                blocks, threads = grid_1d(n)
                args = (out, bits(x), np.int64(n), np.int64(row), np.int64(total), np.int64(offset),
                        np.int64(row), np.int64(0))
                result.append(Launch(rows_copy_kernel, blocks, threads, args))
            offset += row
        return result

    return Tactic("rows", launches)


def split_tactic(in_shape: Sequence[int], axis: int, sizes: Sequence[int]) -> Tactic:
    """One row-block copy per non-empty output from its slab of the input."""
    outer, inner = _rows(in_shape, axis)
    total = int(in_shape[axis]) * inner

    def launches(ins, outs, workspace):
        x = bits(ins[0])
        result, offset = [], 0
        for out, size in zip(outs, sizes):
            row = int(size) * inner
            n = outer * row
            if n:
                blocks, threads = grid_1d(n)
                args = (bits(out), x, np.int64(n), np.int64(row), np.int64(row), np.int64(0),
                        np.int64(total), np.int64(offset))
                result.append(Launch(rows_copy_kernel, blocks, threads, args))
            offset += row
        return result

    return Tactic("rows", launches)


def gather_tactic(x_shape: Sequence[int], axis: int, count: int) -> Tactic:
    """Gather with runtime indices (``count`` of them) along ``axis`` of ``x``."""
    outer, inner = _rows(x_shape, axis)
    dim = int(x_shape[axis])
    n = outer * count * inner

    def launches(ins, outs, workspace):
        if n == 0 or dim == 0:
            return []
        blocks, threads = grid_1d(n)
        args = (bits(outs[0]), bits(ins[0]), flat(ins[1]), np.int64(n), np.int64(inner), np.int64(count),
                np.int64(dim))
        return [Launch(gather_kernel, blocks, threads, args)]

    return Tactic("gather", launches)


def gather_elements_tactic(x_shape: Sequence[int], idx_shape: Sequence[int], axis: int) -> Tactic:
    """GatherElements with runtime indices (which may be smaller than the data)."""
    n = element_count(idx_shape)
    dim = int(x_shape[axis])

    def launches(ins, outs, workspace):
        if n == 0 or dim == 0:
            return []
        blocks, threads = grid_1d(n)
        args = (bits(outs[0]), bits(ins[0]), flat(ins[1]), np.int64(n), np.int64(len(idx_shape)),
                int64_table(idx_shape), int64_table(c_strides(x_shape)), np.int64(axis), np.int64(dim))
        return [Launch(gather_elements_kernel, blocks, threads, args)]

    return Tactic("gather_elements", launches)


def gather_nd_tactic(x_shape: Sequence[int], idx_shape: Sequence[int], batch_dims: int) -> Tactic:
    """GatherND with runtime index tuples: one thread per output element."""
    k = int(idx_shape[-1])
    indexed = [int(d) for d in x_shape[batch_dims:batch_dims + k]]
    strides = c_strides(x_shape)[batch_dims:batch_dims + k]
    slice_size = element_count(x_shape[batch_dims + k:])
    count = element_count(idx_shape[batch_dims:-1])
    n = element_count(x_shape[:batch_dims]) * count * slice_size

    def launches(ins, outs, workspace):
        if n == 0 or 0 in indexed:  # no index is in range of an empty axis: nothing to read
            return []
        blocks, threads = grid_1d(n)
        args = (bits(outs[0]), bits(ins[0]), flat(ins[1]), np.int64(n), np.int64(slice_size), np.int64(count),
                np.int64(element_count(x_shape[batch_dims:])), np.int64(k), int64_table(indexed),
                int64_table(strides))
        return [Launch(gather_nd_kernel, blocks, threads, args)]

    return Tactic("gather_nd", launches)



def reverse_sequence_tactic(shape: Sequence[int], batch_axis: int) -> Tactic:
    """ReverseSequence with runtime lengths: one thread per output element."""
    n = element_count(shape)
    inner = element_count(shape[2:])

    def launches(ins, outs, workspace):
        if n == 0:
            return []
        blocks, threads = grid_1d(n)
        args = (bits(outs[0]), bits(ins[0]), flat(ins[1]), np.int64(n), np.int64(inner), np.int64(shape[1]),
                np.int64(batch_axis), np.int64(shape[1 - batch_axis]))
        return [Launch(reverse_sequence_kernel, blocks, threads, args)]

    return Tactic("reverse_sequence", launches)
