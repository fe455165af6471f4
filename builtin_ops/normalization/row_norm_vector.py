"""The vector row kernel: a row normalization whose rows are held in registers, read and
written in 16-byte vectors; and :func:`row_tactics`, which orders the row tactics.

Where the reduced axes are X's trailing ones (row ``r`` is ``X[r * cols:(r + 1) * cols]``),
``cols`` is a multiple of 8 up to :data:`MAX_COLS`, X and Y are float16 or float32 and
scale and bias are per column, per row or absent (LayerNorm, RMSNorm, and InstanceNorm,
GroupNorm or MVN over trailing axes), one warp, or a few for long rows, owns a row: each
lane loads up to :data:`MAX_VECTORS` vectors of 8 elements (:func:`plugrt.kernels.vector8`)
and keeps them in registers, so X is read once. The mean and then the sum of squared
deviations from it (two passes over the registers: no cancellation however large the
mean) are summed in float32 by warp shuffles, across the row's warps through shared
memory. Several rows share a 256-thread block. A transformer's LayerNorm (hidden 768,
float16) is one warp a row, three vectors a lane.

The simulator runs the same kernel body with warps of :data:`SIM_WARP` lanes whose
shuffles are emulated through shared memory (it has no ``shfl``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import float32

from plugrt.kernels import VECTOR, aligned, cuda, flat, jit, simulated, to_device, vector8
from plugrt.plugin import Launch, Tactic

from .row_norm import ABSENT, NO_STAT, PER_COL, PER_ROW, RowNorm, _present, stats_writer

#: Lanes of a warp on the GPU, and of the emulated warp in the simulator.
WARP = 32
SIM_WARP = 2
#: Vectors of :data:`VECTOR` elements a lane holds at most (32 float32 registers).
MAX_VECTORS = 4
#: Warps sharing a row at most: one 256-thread block a row.
MAX_WARPS = 8
#: Threads of a block; rows are stacked until it is full.
BLOCK_THREADS = 256
#: The widest row the kernel holds in registers (8192 columns).
MAX_COLS = VECTOR * MAX_VECTORS * WARP * MAX_WARPS
#: Blocks wanted before rows are stacked (two per SM of an H200's 132): few rows still
#: spread over the GPU.
FILL_BLOCKS = 264
#: Dtypes the 16-byte vector accesses move (``vector8``).
VECTOR_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))
FULL_MASK = 0xFFFFFFFF


def applies(norm: RowNorm) -> bool:
    """Whether the vector kernel computes ``norm`` (else only the generic row kernel does)."""
    view = norm.view
    y_dtype = norm.dtype if norm.y_dtype is None else norm.y_dtype
    return (view.contiguous and view.rows > 0 and 0 < view.cols <= MAX_COLS and view.cols % VECTOR == 0
            and np.dtype(norm.dtype) in VECTOR_DTYPES and np.dtype(y_dtype) in VECTOR_DTYPES
            and norm.scale_index.mode in (ABSENT, PER_COL, PER_ROW)
            and norm.bias_index.mode in (ABSENT, PER_COL, PER_ROW))


def vector_geometry(rows: int, cols: int) -> tuple[int, int]:
    """``(warps, rows_per_block)`` on the GPU: the fewest warps a row whose lanes hold the
    row in :data:`MAX_VECTORS` vectors each, then rows stacked to a 256-thread block while
    the grid keeps :data:`FILL_BLOCKS` blocks."""
    vectors = cols // VECTOR
    warps = 1
    while warps * WARP * MAX_VECTORS < vectors:
        warps *= 2
    rows_per_block = BLOCK_THREADS // (warps * WARP)
    while rows_per_block > 1 and -(-rows // rows_per_block) < FILL_BLOCKS:
        rows_per_block //= 2
    return warps, rows_per_block


@functools.lru_cache(maxsize=None)
def warp_sum_fn(warp: int):
    """``warp_sum(value, exchange, tid)``: the sum of ``value`` over the ``warp`` lanes of
    thread ``tid``'s warp, in every lane (an xor butterfly: each lane adds the same pairs,
    so all get the same bits). GPU: ``shfl.sync.bfly``, ``exchange`` unused; simulator:
    the butterfly through ``exchange`` (a float32 shared array, one slot a thread), every
    thread of the block calling it together."""
    if not simulated():
        @jit(device=True)
        def warp_sum(value, exchange, tid):
            offset = warp // 2
            while offset > 0:
                value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
                offset //= 2
            return value

        return warp_sum

    @jit(device=True)
    def emulated_warp_sum(value, exchange, tid):
        offset = warp // 2
        while offset > 0:
            exchange[tid] = value
            cuda.syncthreads()
            value += exchange[tid ^ offset]
            cuda.syncthreads()
            offset //= 2
        return value

    return emulated_warp_sum


@functools.lru_cache(maxsize=None)
def vector_row_kernel(warp: int, warps: int, rows_per_block: int, per_lane: int, scale_mode: int,
                      bias_mode: int, write_mean: bool, second_stat: int, centered: bool = True):
    """:func:`~.row_norm.row_norm_kernel`'s computation (same arguments less the offset
    tables) for contiguous rows of ``cols % 8 == 0``, float32 arithmetic.

    A block of ``(warp * warps, rows_per_block)`` threads works on rows ``blockIdx.x *
    rows_per_block + threadIdx.y``, stepping by ``gridDim.x * rows_per_block``; lane
    ``threadIdx.x`` holds the row's vectors ``lane + k * warp * warps`` for ``k <
    per_lane``. Every thread runs every step (the barriers of multi-warp rows and of the
    simulator's shuffles), threads past the last row with zeros.
    """
    load8, store8 = vector8()
    warp_sum = warp_sum_fn(warp)
    lanes = warp * warps
    held_size = per_lane * VECTOR
    exchange_size = lanes * rows_per_block if simulated() else 1
    partial_size = warps * rows_per_block
    zero, one = float32(0), float32(1)

    @jit(device=True)
    def row_sum(value, exchange, partial, tid, lane, ty):
        """The sum of ``value`` over the row's lanes, in each of them."""
        value = warp_sum(value, exchange, tid)
        if warps > 1:
            if lane % warp == 0:
                partial[ty * warps + lane // warp] = value
            cuda.syncthreads()
            value = zero
            for w in range(warps):
                value += partial[ty * warps + w]
            cuda.syncthreads()  # the next sum overwrites the partials
        return value

    write_stats = stats_writer(write_mean, second_stat)

    @jit
    def kernel(x, y, rows, cols, eps_in, eps_out, scale, s_period, bias, b_period, st1, st2):
        lane = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * lanes + lane
        exchange = cuda.shared.array(exchange_size, float32)
        partial = cuda.shared.array(partial_size, float32)
        held = cuda.local.array(held_size, float32)
        vectors = cols // VECTOR
        n = float32(cols)
        for first in range(cuda.blockIdx.x * rows_per_block, rows, cuda.gridDim.x * rows_per_block):
            r = first + ty
            valid = r < rows
            base = r * cols
            s1 = zero
            for k in range(per_lane):
                v = lane + k * lanes
                if valid and v < vectors:
                    t = load8(x, base + v * VECTOR)
                    for e in range(VECTOR):
                        held[k * VECTOR + e] = t[e]
                        s1 += t[e] if centered else t[e] * t[e]
            s1 = row_sum(s1, exchange, partial, tid, lane, ty)
            if centered:
                mean = s1 / n
                s2 = zero
                for k in range(per_lane):
                    if valid and lane + k * lanes < vectors:
                        for e in range(VECTOR):
                            d = held[k * VECTOR + e] - mean
                            s2 += d * d
                var = row_sum(s2, exchange, partial, tid, lane, ty) / n
            else:
                mean = zero
                var = s1 / n
            inv = one / (math.sqrt(var + eps_in) + eps_out)
            if valid:
                s_row = one
                b_row = zero
                if scale_mode == PER_ROW:
                    s_row = float32(scale[r % s_period])
                if bias_mode == PER_ROW:
                    b_row = float32(bias[r % b_period])
                for k in range(per_lane):
                    v = lane + k * lanes
                    if v < vectors:
                        h = k * VECTOR
                        c = v * VECTOR
                        for e in range(VECTOR):
                            held[h + e] = (held[h + e] - mean) * inv * s_row
                        if scale_mode == PER_COL:
                            sv = load8(scale, c)
                            for e in range(VECTOR):
                                held[h + e] *= sv[e]
                        if bias_mode == PER_COL:
                            bv = load8(bias, c)
                            for e in range(VECTOR):
                                held[h + e] += bv[e]
                        elif bias_mode == PER_ROW:
                            for e in range(VECTOR):
                                held[h + e] += b_row
                        store8(y, base + c, (held[h], held[h + 1], held[h + 2], held[h + 3],
                                             held[h + 4], held[h + 5], held[h + 6], held[h + 7]))
                if lane == 0:
                    write_stats(st1, st2, r, mean, inv, var)

    return kernel


def _launch_shape(rows: int, warps: int, rows_per_block: int) -> tuple[int, int, int, int]:
    """(grid, warp, warps, rows_per_block) actually launched: under the simulator two
    blocks of two rows, warps of :data:`SIM_WARP` lanes, two a row where the GPU has more
    than one (so that stacked rows, the grid-stride loop and the sum across warps run)."""
    if simulated():
        return min(-(-rows // 2), 2), SIM_WARP, min(warps, 2), 2
    return min(-(-rows // rows_per_block), 65535), WARP, warps, rows_per_block


def vector_tactic(norm: RowNorm, fallback: Tactic) -> Tactic:
    """The vector kernel's tactic for ``norm`` (:func:`applies` must hold). Arrays it moves
    by vectors that are not 16-byte aligned, or of a dtype other than float16 and float32,
    run ``fallback`` instead."""
    view = norm.view
    rows, cols = view.rows, view.cols
    warps, rows_per_block = vector_geometry(rows, cols)

    def launches(ins, outs, workspace):
        x, y = ins[norm.x], outs[0]
        by_vectors = [x, y] + [ins[p] for p, index in ((norm.scale, norm.scale_index), (norm.bias, norm.bias_index))
                               if index.mode == PER_COL]
        if not all(np.dtype(a.dtype) in VECTOR_DTYPES and aligned(a) for a in by_vectors):
            return fallback.launches(ins, outs, workspace)
        st1, st2 = _present(outs, norm.mean_out), _present(outs, norm.stat_out)
        grid, warp, lwarps, lrows = _launch_shape(rows, warps, rows_per_block)
        per_lane = -(-(cols // VECTOR) // (warp * lwarps))
        kernel = vector_row_kernel(warp, lwarps, lrows, per_lane, norm.scale_index.mode, norm.bias_index.mode,
                                   st1 is not None, norm.second_stat if st2 is not None else NO_STAT, norm.centered)
        dummy = to_device(np.zeros(1, dtype=np.float32))
        args = (flat(x), flat(y), np.int64(rows), np.int64(cols), np.float32(norm.eps_in), np.float32(norm.eps_out),
                *_param(ins, norm.scale, norm.scale_index, dummy), *_param(ins, norm.bias, norm.bias_index, dummy),
                flat(st1) if st1 is not None else dummy, flat(st2) if st2 is not None else dummy)
        return [Launch(kernel, grid, (warp * lwarps, lrows), args)]

    lanes = WARP * warps
    return Tactic(f"rows_vec{VECTOR}_{lanes}x{rows_per_block}", launches,
                  {"block": [lanes, rows_per_block], "vector": VECTOR})


def _param(ins, position, index, dummy) -> tuple:
    array = _present(ins, position)
    if array is None or index.mode == ABSENT:
        return dummy, np.int64(1)
    return flat(array), np.int64(max(index.period, 1))


def row_tactics(norm: RowNorm) -> list[Tactic]:
    """A row normalization's tactics, best first: the vector kernel where it
    :func:`applies` (the generic kernel's first geometry its fallback), then the generic
    row kernel's geometries."""
    generic = norm.tactics()
    if not applies(norm):
        return generic
    return [vector_tactic(norm, generic[0])] + generic
