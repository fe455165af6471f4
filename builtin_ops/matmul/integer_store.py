"""The store side of the integer GEMM kernels (int32 accumulators: MatMulInteger's ``wgmma``
tactic, :mod:`.wgmma_int8`): the zero-point correction, the fused epilogue, the split-K
reduction of int32 partial sums, and the row sums the correction reads.

The tensor cores multiply the raw 8-bit operands; zero points ``za`` (per row of A or per
tensor) and ``zb`` (per column of B or per tensor) are subtracted afterwards, per output:

    sum_k (a - za)(b - zb) = sum_k ab - zb * rowsum(a) - za * colsum(b) + K * za * zb

in wrapping int32 arithmetic, which equals the reference's int64 product cast to int32.
The store hands that int32 to the epilogue as ``value`` (MatMulInteger's contract: a fused
chain starts with a Cast) and stores what the epilogue returns, whatever the output's
dtype. There is no vector form: the epilogue's vector contract is float32.

The correction's arrays travel as one kernel argument, ``zp = (a_zero_point,
b_zero_point, row_sums, col_sums, offs)``: the zero points read through ``meta``'s strides
and ``offs``' per-batch offsets as :mod:`.plan` describes them, ``row_sums[bi * M + m]``
and ``col_sums[bi * N + n]`` (int32) over the whole K.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from numba import int32, int64

from plugrt.kernels import cuda, jit

from .plan import K_, M_, N_, NB, OFFS_W, SZAM, SZBN


@dataclass(frozen=True)
class Int8Operands:
    """What an INT8 GEMM kernel multiplies and how its store finishes: ``types``, the
    ``wgmma`` operand types, A's then B's (``"s8.s8"``, ``"u8.s8"``, ``"s8.u8"``,
    ``"u8.u8"``); ``corrected``: zero points may be nonzero, so the store subtracts them
    through row and column sums (else the operands are symmetric and the sum is final)."""

    types: str
    corrected: bool

    @property
    def label(self) -> str:
        return self.types.replace(".", "")


@jit(device=True)
def corrected_value(total, zp, meta, bi, gm, gn):
    """``total`` (the raw int32 sum of products of output ``(bi, gm, gn)``) less the zero
    points' terms (see the module doc), as int32."""
    azp, bzp, row_sums, col_sums, offs = zp
    za = int64(azp[offs[bi * OFFS_W + 2] + gm * meta[SZAM]])
    zb = int64(bzp[offs[bi * OFFS_W + 3] + gn * meta[SZBN]])
    rows = int64(row_sums[bi * meta[M_] + gm])
    cols = int64(col_sums[bi * meta[N_] + gn])
    return int32(int64(total) - zb * rows - za * cols + meta[K_] * za * zb)


@functools.lru_cache(maxsize=None)
def integer_tile_store(bm: int, bn: int, threads: int, even: bool, split: bool, epilogue_fn, ld: int,
                       corrected: bool):
    """``store(stage, m0, n0, bi, z, out, partial, zp, meta, alpha, beta, operands, tid)``
    (:func:`.store.tile_store`'s signature; ``alpha`` and ``beta`` unused): the block
    stores its ``bm x bn`` int32 tile, staged row-major in ``stage`` (row stride ``ld``).
    Without ``split``: ``out[o] = epilogue(value)``, ``value`` corrected for the zero
    points where ``corrected``; with it the raw sum goes to ``partial`` (int32) for
    :func:`integer_split_reduce_kernel`.

    A thread keeps its columns (consecutive threads, consecutive columns: coalesced) and
    walks down the rows, so a column's index, bounds check and zero-point terms are
    computed once, not per element."""
    CORRECTED = bool(corrected)
    CSTEP = min(threads, bn)  # columns the block covers at once
    RSTEP = max(1, threads // bn)  # rows it covers at once
    BUSY = CSTEP * RSTEP  # threads that store (all where bn divides threads or threads bn)

    @jit(device=True)
    def store_tile(stage, m0, n0, bi, z, out, partial, zp, meta, alpha, beta, operands, tid):
        if tid >= BUSY:
            return
        nb, m, n = meta[NB], meta[M_], meta[N_]
        mn = m * n
        azp, bzp, row_sums, col_sums, offs = zp
        for col in range(tid % CSTEP, bn, CSTEP):
            gn = n0 + col
            if even or gn < n:
                zb, cols = int64(0), int64(0)
                if CORRECTED:  # sum ab - zb * rowsum(a) - za * (colsum(b) - K * zb)
                    zb = int64(bzp[offs[bi * OFFS_W + 3] + gn * meta[SZBN]])
                    cols = int64(col_sums[bi * n + gn]) - meta[K_] * zb
                for r in range(tid // CSTEP, bm, RSTEP):
                    gm = m0 + r
                    if even or gm < m:
                        value = stage[r * ld + col]
                        if split:
                            partial[(z * nb + bi) * mn + gm * n + gn] = value
                        else:
                            if CORRECTED:
                                za = int64(azp[offs[bi * OFFS_W + 2] + gm * meta[SZAM]])
                                value = int32(int64(value) - zb * int64(row_sums[bi * m + gm]) - za * cols)
                            o = int64(bi * mn + gm * n + gn)
                            out[o] = epilogue_fn(value, o, operands)

    return store_tile


@functools.lru_cache(maxsize=None)
def integer_split_reduce_kernel(epilogue_fn, corrected: bool):
    """``out[o] = epilogue(correct(sum_z partial[z * total + o]))``: the final reduction
    of a split integer product (int32 partial sums, wrapping as the whole sum would).

    Arguments: ``(out, partial, zp, meta, splits, operands)``."""
    CORRECTED = bool(corrected)

    @jit
    def split_reduce(out, partial, zp, meta, splits, operands):
        m, n = meta[M_], meta[N_]
        mn = m * n
        total_size = meta[NB] * mn
        for o in range(cuda.grid(1), total_size, cuda.gridsize(1)):
            total = partial[o]
            for z in range(1, splits):
                total = int32(total + partial[z * total_size + o])
            if CORRECTED:
                bi = o // mn
                rest = o - bi * mn
                gm = rest // n
                total = corrected_value(total, zp, meta, bi, gm, rest - gm * n)
            out[o] = epilogue_fn(total, int64(o), operands)

    return split_reduce


@functools.lru_cache(maxsize=None)
def row_sums_kernel():
    """``sums[bi * rows + r] = sum_k src[offs[bi * OFFS_W + column] + r * srow + k]`` (int32,
    wrapping) for ``nb`` batch items of a K-contiguous 8-bit operand: A's row sums, or B's
    column sums when B is read as ``[N, K]``. One thread a row.

    Arguments: ``(sums, src, offs, column, srow, rows, k, nb)``."""

    @jit
    def row_sums(sums, src, offs, column, srow, rows, k, nb):
        for i in range(cuda.grid(1), nb * rows, cuda.gridsize(1)):
            bi = i // rows
            at = offs[bi * OFFS_W + column] + (i - bi * rows) * srow
            total = int64(0)
            for kk in range(k):
                total += src[at + kk]
            sums[i] = int32(total)

    return row_sums
