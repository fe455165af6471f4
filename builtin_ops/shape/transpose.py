"""The Transpose tactics for permutations that move the input's contiguous axis away from
the output's last axis (NCHW <-> NHWC, attention's key transpose), where a strided copy
would read or write with a stride: a batched 2-D transpose through shared memory, and for
a narrow output last axis (an image's 3 colour channels going channels-last) one thread
per output row. Other permutations use :func:`.copies.strided_tactic`, moving 8 or 4 bytes
at a time where whole runs of contiguous elements allow it (:func:`wide_strided_tactic`:
a space-to-depth's blocks, attention's head splits). Every permutation also offers
:func:`.copies.generic_strided_tactic`, one kernel at every shape of a profile (a batch axis
of 1 coalesces away), for the shapes other than the opt one.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
from numba import from_dtype, int64

from plugrt.kernels import aligned, c_strides, cuda, flat, grid_1d, jit, simulated
from plugrt.plugin import Launch, Tactic

from .copies import UINT, bits, coalesce, element_count, int64_table, strided_launch, strided_tactic


@functools.lru_cache(maxsize=None)
def tiled_transpose_kernel(tile: int, rows: int, itemsize: int):
    """A batched 2-D transpose through a shared-memory tile, so that both the reads (along
    input-contiguous axis ``p``) and the writes (along output-contiguous axis ``q``) coalesce.

    Blocks of ``(tile, rows)`` threads loop over ``total`` tiles; the batch coordinates (all
    other axes) give the tile's input and output base offsets through ``rin``/``rout``.
    """
    element = from_dtype(UINT[itemsize])
    width = tile + 1  # a closure int, so the tile's shape is a literal tuple for Numba

    @jit
    def kernel(out, x, total, tiles_p, tiles_q, size_p, size_q, in_q, out_p, nrest, rshape, rin, rout):
        buf = cuda.shared.array((tile, width), element)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        for t in range(cuda.blockIdx.x, total, cuda.gridDim.x):
            tq = t % tiles_q
            r = t // tiles_q
            p0 = (r % tiles_p) * tile
            q0 = tq * tile
            r //= tiles_p
            ib = int64(0)
            ob = int64(0)
            for d in range(nrest - 1, -1, -1):
                c = r % rshape[d]
                r //= rshape[d]
                ib += c * rin[d]
                ob += c * rout[d]
            for j in range(ty, tile, rows):
                if q0 + j < size_q and p0 + tx < size_p:
                    buf[j, tx] = x[ib + (q0 + j) * in_q + p0 + tx]
            cuda.syncthreads()
            for j in range(ty, tile, rows):
                if p0 + j < size_p and q0 + tx < size_q:
                    out[ob + (p0 + j) * out_p + q0 + tx] = buf[tx, j]
            cuda.syncthreads()

    return kernel


def tiled_transpose_tactic(out_shape: Sequence[int], strides: Sequence[int], itemsize: int) -> Tactic | None:
    """Transpose through shared-memory tiles when the input's contiguous axis moves away
    from the output's last axis (``None`` when the strided copy already coalesces)."""
    sizes, steps = coalesce(out_shape, strides)
    if len(sizes) < 2 or 1 not in steps[:-1]:
        return None
    p, q = steps.index(1), len(sizes) - 1
    out_strides = c_strides(sizes)
    rest = [a for a in range(len(sizes)) if a not in (p, q)]
    tile, rows = (4, 2) if simulated() else (32, 8)
    tiles_p, tiles_q = -(-sizes[p] // tile), -(-sizes[q] // tile)
    total = tiles_p * tiles_q * element_count([sizes[a] for a in rest])
    kernel = tiled_transpose_kernel(tile, rows, itemsize)

    def launches(ins, outs, workspace):
        if total == 0:
            return []
        args = (bits(outs[0]), bits(ins[0]), np.int64(total), np.int64(tiles_p), np.int64(tiles_q),
                np.int64(sizes[p]), np.int64(sizes[q]), np.int64(steps[q]), np.int64(out_strides[p]),
                np.int64(len(rest)), int64_table([sizes[a] for a in rest]), int64_table([steps[a] for a in rest]),
                int64_table([out_strides[a] for a in rest]))
        return [Launch(kernel, min(total, 65535), (tile, rows), args)]

    return Tactic("tiled", launches, {"tile": tile, "rows": rows})


#: Output last axes up to this size get :func:`narrow_transpose_tactic` first.
NARROW = 16


@jit
def narrow_transpose_kernel(out, x, rows, width, step, ndim, sizes, steps):
    """``out[r, j] = x[offset(r) + j * step]`` for each output row ``r`` of ``width``
    elements: a row's offset is decoded once (``sizes``/``steps``: the other axes), and
    consecutive threads read consecutive elements of each input run."""
    for r in range(cuda.grid(1), rows, cuda.gridsize(1)):
        rest = r
        offset = 0
        for d in range(ndim - 1, -1, -1):
            c = rest % sizes[d]
            rest //= sizes[d]
            offset += c * steps[d]
        for j in range(width):
            out[r * width + j] = x[offset + j * step]


def narrow_transpose_tactic(out_shape: Sequence[int], strides: Sequence[int], itemsize: int) -> Tactic | None:
    """One thread per output row where the output's last axis is narrow (at most
    :data:`NARROW` elements) and not the input's contiguous one; ``None`` elsewhere."""
    sizes, steps = coalesce(out_shape, strides)
    if len(sizes) < 2 or sizes[-1] > NARROW or steps[-1] == 1:
        return None
    width, step = sizes[-1], steps[-1]
    rows = element_count(sizes[:-1])

    def launches(ins, outs, workspace):
        blocks, threads = grid_1d(rows)
        args = (bits(outs[0]), bits(ins[0]), np.int64(rows), np.int64(width), np.int64(step),
                np.int64(len(sizes) - 1), int64_table(sizes[:-1]), int64_table(steps[:-1]))
        return [Launch(narrow_transpose_kernel, blocks, threads, args)]

    return Tactic("narrow", launches, {"width": width})


#: The units a strided copy may move at once, widest first (bytes; unsigned ints).
WIDE_UNITS = (8, 4)


def wide_strided_tactic(out_shape: Sequence[int], strides: Sequence[int], itemsize: int,
                        in_elements: int) -> Tactic | None:
    """:func:`.copies.strided_tactic` over units of :data:`WIDE_UNITS` bytes where the
    output's last axis reads a contiguous run whose bytes, and every other step's, the unit
    divides (the input of ``in_elements`` too); ``None`` elsewhere. Fewer, wider elements:
    the copy's index arithmetic, not its bytes, bounds it. An array not aligned to the unit
    at launch takes the element-wise copy."""
    sizes, steps = coalesce(out_shape, strides)
    if not sizes or steps[-1] != 1 or len(sizes) < 2:
        return None
    unit = next((u for u in WIDE_UNITS if u > itemsize and u % itemsize == 0 and not (sizes[-1] * itemsize) % u
                 and not any((s * itemsize) % u for s in steps[:-1]) and not (in_elements * itemsize) % u), None)
    if unit is None:
        return None
    f = unit // itemsize
    wide_sizes, wide_steps = sizes[:-1] + [sizes[-1] // f], [s // f for s in steps[:-1]] + [1]
    plain = strided_tactic(out_shape, strides)

    def launches(ins, outs, workspace):
        out, x = flat(outs[0]), flat(ins[0])
        if not (aligned(out, unit) and aligned(x, unit)):
            return plain.launches(ins, outs, workspace)
        return strided_launch(out.view(UINT[unit]), x.view(UINT[unit]), wide_sizes, wide_steps)

    return Tactic(f"strided_u{unit}", launches, {"rank": len(wide_sizes), "unit": unit})
