"""Matrix-vector products (M = 1 or N = 1): the classifier head at batch 1, a GEMV.

A GEMM tile wastes all but one of its rows on such a product, and one thread per output
(``direct``) reads its operand row with a stride of K between neighbouring threads. Here
a block of 256 threads shares the K loop of few outputs, so the weight, the only large
operand, is read once, coalesced, by the whole GPU:

- ``kdot``: a warp per output, its lanes striding K (coalesced when both operands are
  K-contiguous: Gemm with ``transB``, or N = 1 with A row-major);
- ``columns``: a block per 32 consecutive outputs of one row, lane ``c`` on column
  ``n0 + c`` and the block's 8 warps on interleaved K slices (coalesced when B is
  N-contiguous: a MatMul weight ``[K, N]``).

Partial sums meet in shared memory in a fixed order, so results are the same on every run.
The store is the family's (:func:`.plan.store_value_fn`: alpha, C, beta), then the fused
epilogue. Arguments are :func:`.tiled.tiled_kernel`'s.
"""

from __future__ import annotations

import functools

import numpy as np
from plugrt.kernels import cuda, jit

from .plan import (
    FLOAT_EP,
    K_,
    M_,
    N_,
    NB,
    OFFS_W,
    SAK,
    SAM,
    SBK,
    SBN,
    SCM,
    SCN,
    USE_C,
    load_type,
    store_value_fn,
)

#: Threads of a block: 8 warps.
THREADS = 256
WARPS = THREADS // 32


@functools.cache
def gemv_kernel(a_dtype, b_dtype, out_dtype, columns: bool, epilogue_fn):
    """``kdot`` (``columns`` false) or ``columns`` (see the module doc)."""
    LA, LB = load_type(a_dtype), load_type(b_dtype)
    ACC = load_type(out_dtype)
    I64 = np.int64
    store_value = store_value_fn(out_dtype)
    ZACC = ACC(0)
    COLUMNS = bool(columns)

    def kernel(out, a, b, c, azp, bzp, meta, offs, alpha, beta, operands):
        part = cuda.shared.array((WARPS, 32), ACC)
        nb, m, n, k = meta[NB], meta[M_], meta[N_], meta[K_]
        sam, sak, sbk, sbn = meta[SAM], meta[SAK], meta[SBK], meta[SBN]
        scm, scn, use_c, float_ep = meta[SCM], meta[SCN], meta[USE_C], meta[FLOAT_EP]
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        mn = m * n
        if COLUMNS:
            strips = (n + 31) // 32
            for job in range(cuda.blockIdx.x, nb * m * strips, cuda.gridDim.x):
                row = job // strips  # (batch item, m)
                bi = row // m
                gm = row - bi * m
                gn = (job - row * strips) * 32 + lane
                total = ZACC
                if gn < n:
                    pa = offs[bi * OFFS_W] + gm * sam
                    pb = offs[bi * OFFS_W + 1] + gn * sbn
                    for kk in range(warp, k, WARPS):
                        total += ACC(LA(a[pa + kk * sak])) * ACC(LB(b[pb + kk * sbk]))
                part[warp, lane] = total
                cuda.syncthreads()
                if warp == 0 and gn < n:
                    total = part[0, lane]
                    for w in range(1, WARPS):
                        total += part[w, lane]
                    o = I64(bi * mn + gm * n + gn)
                    out[o] = epilogue_fn(store_value(total, c, gm * scm + gn * scn, use_c, float_ep, alpha, beta),
                                         o, operands)
                cuda.syncthreads()
        else:
            for first in range(cuda.blockIdx.x * WARPS, nb * mn, cuda.gridDim.x * WARPS):
                o = first + warp
                total = ZACC
                bi = o // mn
                rest = o - bi * mn
                gm = rest // n
                gn = rest - gm * n
                if o < nb * mn:
                    pa = offs[bi * OFFS_W] + gm * sam
                    pb = offs[bi * OFFS_W + 1] + gn * sbn
                    for kk in range(lane, k, 32):
                        total += ACC(LA(a[pa + kk * sak])) * ACC(LB(b[pb + kk * sbk]))
                part[warp, lane] = total
                cuda.syncthreads()
                if lane == 0 and o < nb * mn:
                    total = part[warp, 0]
                    for i in range(1, 32):
                        total += part[warp, i]
                    out[I64(o)] = epilogue_fn(store_value(total, c, gm * scm + gn * scn, use_c, float_ep, alpha,
                                                          beta), I64(o), operands)
                cuda.syncthreads()

    kernel.__name__ = f"matmul_gemv_{'columns' if COLUMNS else 'kdot'}"
    return jit(kernel, launch_bounds=(THREADS, 1))


def gemv_grid(meta: np.ndarray, columns: bool, cap: int) -> int:
    """Blocks of a launch: one per job (a warp's 8 outputs, or a 32-column strip), at most ``cap``."""
    nb, m, n = int(meta[NB]), int(meta[M_]), int(meta[N_])
    jobs = nb * m * -(-n // 32) if columns else -(-(nb * m * n) // WARPS)
    return max(1, min(jobs, cap))


def suits(meta: np.ndarray) -> bool:
    """A matrix-vector product: M or N is 1 (and K is worth sharing)."""
    return (int(meta[M_]) == 1 or int(meta[N_]) == 1) and int(meta[K_]) >= 32
