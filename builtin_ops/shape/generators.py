"""CUDA tactics of the generator ops: tensors made rather than moved (Shape, Size,
Constant, ConstantOfShape write values known at build time; Range, OneHot and Trilu
compute from their inputs, which may be runtime tensors; EyeLike from its input's shape; NonZero lists the indices of
its input's nonzero elements, its output's size that input's data).

Scalars an op reads from an input (Range's start and delta, Trilu's k, OneHot's values)
stay on the device: the kernel reads element 0 of a one-element array, which is a copy
made at build time when the value is known and the runtime tensor otherwise, so the
launch list never depends on tensor contents.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
from numba import float32, float64, int32, int64

from plugrt.kernels import cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic

from .copies import UINT, bits, element_count, fill_launch, host_bits, int64_table, table_launch


def scalar_source(info, device_array, dtype=None):
    """A one-element device array holding an input scalar: a build-time copy when
    ``info`` carries a value, else a flat view of the runtime ``device_array``."""
    if info is not None and info.value is not None:
        return to_device(np.asarray(info.value, dtype=dtype or info.dtype).reshape(-1))
    return flat(device_array)


@jit(device=True)
def _widen_half(v):
    return float32(v)


@jit(device=True)
def _same(v):
    return v


# --------------------------------------------------------------------------- known values


def table_tactic(value: np.ndarray) -> Tactic:
    """Write a value known at build time (Shape, Size, Constant)."""
    value = np.array(value)

    def launches(ins, outs, workspace):
        return table_launch(outs[0], value)

    return Tactic("table", launches)


def fill_tactic(value: np.ndarray) -> Tactic:
    """Fill the output with one known scalar (ConstantOfShape)."""
    value = np.array(value).reshape(-1)[:1]

    def launches(ins, outs, workspace):
        return fill_launch(outs[0], value)

    return Tactic("fill", launches)


# --------------------------------------------------------------------------- Range


@jit
def range_int_kernel(out, start, delta, n):
    s = int64(start[0])
    d = int64(delta[0])
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        out[i] = s + i * d


@functools.lru_cache(maxsize=None)
def range_float_kernel(half: bool, stash32: bool):
    """Range as NumPy's ``arange`` fills it: ``start``, ``start + delta``, then
    ``start + i * ((start + delta) - start)``, in float64 (float32 for stash_type=1)."""
    compute = float32 if stash32 else float64
    widen = _widen_half if half else _same
    narrow = _widen_half if half else _same

    @jit
    def kernel(out, start, delta, n):
        s = compute(widen(start[0]))
        second = s + compute(widen(delta[0]))
        step = second - s
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            if i == 0:
                v = s
            elif i == 1:
                v = second
            else:
                v = s + compute(i) * step
            out[i] = narrow(v)

    return kernel


def range_tactic(dtype, stash32: bool, start_info, delta_info) -> Tactic:
    """Range of the output's (concrete) length from known or runtime start and delta."""
    dtype = np.dtype(dtype)
    kernel = range_int_kernel if dtype.kind == "i" else range_float_kernel(dtype == np.float16, stash32)

    def launches(ins, outs, workspace):
        n = element_count(outs[0].shape)
        if n == 0:
            return []
        start = scalar_source(start_info, ins[0])
        delta = scalar_source(delta_info, ins[2])
        blocks, threads = grid_1d(n)
        return [Launch(kernel, blocks, threads, (outs[0], start, delta, np.int64(n)))]

    return Tactic("range", launches, {"stash32": stash32})


# --------------------------------------------------------------------------- OneHot


@functools.lru_cache(maxsize=None)
def one_hot_kernel(half_indices: bool):
    """``out[o, c, j] = values[1] if indices[o, j] == c else values[0]`` (bits views)."""
    widen = _widen_half if half_indices else _same

    @jit
    def kernel(out, indices, values, n, inner, depth, wrap):
        off = values[0]
        on = values[1]
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            j = i % inner
            t = i // inner
            c = t % depth
            o = t // depth
            ix = int64(widen(indices[o * inner + j]))
            if wrap != 0 and ix < 0:
                ix += depth
            if ix == c:
                out[i] = on
            else:
                out[i] = off

    return kernel


def one_hot_tactic(indices_info, values_info, axis: int, depth: int, wrap_negative: bool) -> Tactic:
    """OneHot with runtime indices; ``depth`` is the output's (concrete) axis size."""
    inner = element_count(indices_info.shape[axis:])
    kernel = one_hot_kernel(indices_info.dtype == np.float16)

    def launches(ins, outs, workspace):
        n = element_count(outs[0].shape)
        if n == 0:
            return []
        values = bits(scalar_source(values_info, ins[2]))
        blocks, threads = grid_1d(n)
        args = (bits(outs[0]), flat(ins[0]), values, np.int64(n), np.int64(inner), np.int64(depth),
                np.int64(wrap_negative))
        return [Launch(kernel, blocks, threads, args)]

    return Tactic("one_hot", launches)


# --------------------------------------------------------------------------- Trilu


@jit
def trilu_kernel(out, x, n, rows, cols, k, upper):
    """Keep ``x[..., r, c]`` where ``c - r >= k`` (upper) or ``c - r <= k`` (lower), else 0."""
    kk = k[0]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        c = i % cols
        r = (i // cols) % rows
        diff = c - r
        if (upper != 0 and diff >= kk) or (upper == 0 and diff <= kk):
            out[i] = x[i]
        else:
            out[i] = 0


def trilu_tactic(shape: Sequence[int], upper: bool, k_info) -> Tactic:
    """Trilu with ``k`` known (0 when omitted) or read at run time from its input."""
    rows, cols = int(shape[-2]), int(shape[-1])
    n = element_count(shape)

    def launches(ins, outs, workspace):
        if n == 0:
            return []
        if k_info is None:
            k = to_device(np.zeros(1, np.int64))
        else:
            k = scalar_source(k_info, ins[1], np.int64)
        blocks, threads = grid_1d(n)
        args = (bits(outs[0]), bits(ins[0]), np.int64(n), np.int64(rows), np.int64(cols), k, np.int64(upper))
        return [Launch(trilu_kernel, blocks, threads, args)]

    return Tactic("trilu", launches)


# --------------------------------------------------------------------------- EyeLike


@jit
def eye_kernel(out, n, cols, k, one):
    """``out[r, c] = one`` where ``c - r == k``, else 0 (bits views)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        c = i % cols
        r = i // cols
        if c - r == k:
            out[i] = one
        else:
            out[i] = 0


def eye_tactic(shape: Sequence[int], k: int, dtype) -> Tactic:
    """EyeLike: ones on diagonal ``k`` of a 2-D output of ``dtype``; the input is not read."""
    n = element_count(shape)
    one = UINT[np.dtype(dtype).itemsize](host_bits(np.ones(1, dtype))[0])

    def launches(ins, outs, workspace):
        if n == 0:
            return []
        blocks, threads = grid_1d(n)
        return [Launch(eye_kernel, blocks, threads, (bits(outs[0]), np.int64(n), np.int64(shape[1]), np.int64(k), one))]

    return Tactic("eye", launches)


# --------------------------------------------------------------------------- NonZero

#: Most threads a NonZero block runs (its shared scan array).
NONZERO_THREADS = 256


@jit
def nonzero_count_kernel(x, mask, n, counts, chunks):
    """``counts[c]``: the nonzero elements (``x & mask``, bits views) of chunk ``c``, a
    block's worth of elements."""
    t = cuda.threadIdx.x
    width = cuda.blockDim.x
    for c in range(cuda.blockIdx.x, chunks, cuda.gridDim.x):
        i = c * width + t
        flag = 0
        if i < n and (x[i] & mask) != 0:
            flag = 1
        total = cuda.syncthreads_count(flag)
        if t == 0:
            counts[c] = total


@jit
def nonzero_offsets_kernel(counts, chunks, shape, rank):
    """Each chunk's count becomes its first index's position; ``shape`` gets the output's
    shape, ``(rank, total)``."""
    if cuda.grid(1) == 0:
        total = int64(0)
        for c in range(chunks):
            here = counts[c]
            counts[c] = total
            total += here
        shape[0] = rank
        shape[1] = total


@jit
def nonzero_write_kernel(x, mask, n, counts, chunks, shape, out, dims, rank):
    """Each nonzero element's index, one row per axis: ``out[d, position]``, the position
    its chunk's offset plus its rank in the chunk (an inclusive scan in shared memory)."""
    flags = cuda.shared.array(NONZERO_THREADS, int32)
    t = cuda.threadIdx.x
    width = cuda.blockDim.x
    total = shape[1]
    for c in range(cuda.blockIdx.x, chunks, cuda.gridDim.x):
        i = c * width + t
        flag = 0
        if i < n and (x[i] & mask) != 0:
            flag = 1
        flags[t] = flag
        cuda.syncthreads()
        step = 1
        while step < width:
            before = 0
            if t >= step:
                before = flags[t - step]
            cuda.syncthreads()
            flags[t] += before
            cuda.syncthreads()
            step *= 2
        if flag != 0:
            position = counts[c] + flags[t] - 1
            rest = int64(i)
            for d in range(rank - 1, -1, -1):
                size = dims[d]
                out[d * total + position] = rest % size
                rest //= size
        cuda.syncthreads()


def nonzero_tactic(shape: Sequence[int], dtype) -> Tactic:
    """NonZero of a runtime input: count per chunk, offsets (and the output's shape, which
    the engine reads), then the indices, in row-major order. A float's sign bit is left
    out of the test, so -0.0 counts as zero and NaN as nonzero, as in NumPy."""
    dtype = np.dtype(dtype)
    n, rank = element_count(shape), len(shape)
    _, threads = grid_1d(n, NONZERO_THREADS)
    chunks = -(-n // threads)
    width = 8 * dtype.itemsize
    mask = UINT[dtype.itemsize]((1 << (width - 1)) - 1 if dtype.kind == "f" else (1 << width) - 1)

    def launches(ins, outs, workspace):
        counts = workspace.view(np.int64)[:chunks]
        x, found = bits(ins[0]), outs[-1]
        blocks = max(1, min(chunks, grid_1d(n, NONZERO_THREADS)[0]))
        args = (x, mask, np.int64(n), counts, np.int64(chunks))
        return [Launch(nonzero_count_kernel, blocks, threads, args),
                Launch(nonzero_offsets_kernel, 1, 1, (counts, np.int64(chunks), found, np.int64(rank))),
                Launch(nonzero_write_kernel, blocks, threads,
                       args + (found, flat(outs[0]), int64_table(shape), np.int64(rank)))]

    return Tactic("nonzero_scan", launches, workspace_bytes=8 * chunks)
