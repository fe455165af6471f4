"""The product kernels of every dtype: ``tiled`` and its plainly-correct sibling ``direct``.

- ``tiled``: a shared-memory tile of ``BM x BN`` outputs per block, each thread a ``TM x TN``
  register tile (strided over the block tile so shared reads and global stores are
  conflict-free and coalesced), ``BK`` of K per step; edge tiles are guarded. The store
  applies ``alpha``, reads Gemm's C broadcast through strides, then the fused epilogue
  (:class:`plugrt.kernels.Epilogue`), and casts to the output.
- ``direct``: one thread per output, a plain K loop.

Both read the product as :mod:`.plan` describes it (batched, strided, zero points) and
serve float16, float32, float64 and integer products alike; the float32 GEMM kernels for
big products are :mod:`.simt`, :mod:`.tf32` and :mod:`.wgmma`.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import cuda, jit

from .plan import (
    A_KC, B_NC, FLOAT_EP, K_, M_, N_, NB, OFFS_W, SAK, SAM, SBK, SBN, SCM, SCN, SZAK, SZAM, SZBK, SZBN, USE_C,
    load_type, store_value_fn,
)


@functools.lru_cache(maxsize=None)
def tiled_kernel(a_dtype, b_dtype, out_dtype, zero_points: bool, bm: int, bn: int, bk: int, tm: int, tn: int,
                 epilogue_fn):
    """The shared-memory tiled kernel for one dtype combination, tile shape and epilogue.

    Arguments: ``(out, a, b, c, azp, bzp, meta, offs, alpha, beta, operands)``; ``c`` is
    read only when ``meta[USE_C]``, ``azp``/``bzp`` only when compiled with ``zero_points``,
    ``operands`` only by ``epilogue_fn``.
    """
    LA, LB = load_type(a_dtype), load_type(b_dtype)
    ACC = load_type(out_dtype)
    I64 = np.int64
    store_value = store_value_fn(out_dtype)
    HAS_ZP = bool(zero_points)
    ZA, ZB, ZACC = LA(0), LB(0), ACC(0)
    BM, BN, BK, TM, TN = bm, bn, bk, tm, tn
    TX, TY = BN // TN, BM // TM
    NT = TX * TY
    A_LOADS = -(-(BM * BK) // NT)
    B_LOADS = -(-(BN * BK) // NT)
    # One padding column keeps the transposing shared stores free of bank conflicts.
    PA, PB = BM + 1, BN + 1
    U64 = np.uint64
    UBK, UTM, UTN, UTX, UTY = U64(BK), U64(TM), U64(TN), U64(TX), U64(TY)

    def kernel(out, a, b, c, azp, bzp, meta, offs, alpha, beta, operands):
        sa = cuda.shared.array((BK, PA), LA)
        sb = cuda.shared.array((BK, PB), LB)
        acc = cuda.local.array((TM, TN), ACC)
        ra = cuda.local.array(TM, ACC)
        rb = cuda.local.array(TN, ACC)
        nb, m, n, k = meta[NB], meta[M_], meta[N_], meta[K_]
        sam, sak, sbk, sbn = meta[SAM], meta[SAK], meta[SBK], meta[SBN]
        scm, scn, use_c, float_ep = meta[SCM], meta[SCN], meta[USE_C], meta[FLOAT_EP]
        a_kc, b_nc = meta[A_KC], meta[B_NC]
        szam, szak, szbk, szbn = meta[SZAM], meta[SZAK], meta[SZBK], meta[SZBN]
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        utx, uty = U64(tx), U64(ty)
        mt = (m + BM - 1) // BM
        nt = (n + BN - 1) // BN
        per_batch = mt * nt
        for tile in range(cuda.blockIdx.x, nb * per_batch, cuda.gridDim.x):
            bi = tile // per_batch
            rest = tile - bi * per_batch
            m0 = (rest // nt) * BM
            n0 = (rest % nt) * BN
            ao, bo = offs[bi * OFFS_W], offs[bi * OFFS_W + 1]
            zao, zbo = offs[bi * OFFS_W + 2], offs[bi * OFFS_W + 3]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] = ZACC
            for k0 in range(0, k, BK):
                for r in range(A_LOADS):
                    e = tid + r * NT
                    if e < BM * BK:
                        if a_kc:  # consecutive threads along K (A row-major)
                            kk = e % BK
                            mm = e // BK
                        else:
                            mm = e % BM
                            kk = e // BM
                        gm = m0 + mm
                        gk = k0 + kk
                        va = ZA
                        if gm < m and gk < k:
                            va = LA(a[ao + gm * sam + gk * sak])
                            if HAS_ZP:
                                va = LA(va - LA(azp[zao + gm * szam + gk * szak]))
                        sa[kk, mm] = va
                for r in range(B_LOADS):
                    e = tid + r * NT
                    if e < BN * BK:
                        if b_nc:  # consecutive threads along N (B row-major)
                            nn = e % BN
                            kk = e // BN
                        else:
                            kk = e % BK
                            nn = e // BK
                        gn = n0 + nn
                        gk = k0 + kk
                        vb = ZB
                        if gn < n and gk < k:
                            vb = LB(b[bo + gk * sbk + gn * sbn])
                            if HAS_ZP:
                                vb = LB(vb - LB(bzp[zbo + gk * szbk + gn * szbn]))
                        sb[kk, nn] = vb
                cuda.syncthreads()
                # Unsigned indices: no negative-index wraparound code in the hot loop.
                for kk in range(UBK):
                    for i in range(UTM):
                        ra[i] = sa[kk, uty + i * UTY]
                    for j in range(UTN):
                        rb[j] = sb[kk, utx + j * UTX]
                    for i in range(UTM):
                        for j in range(UTN):
                            acc[i, j] += ra[i] * rb[j]
                cuda.syncthreads()
            ob = bi * m * n
            for i in range(TM):
                gm = m0 + ty + i * TY
                if gm < m:
                    for j in range(TN):
                        gn = n0 + tx + j * TX
                        if gn < n:
                            o = I64(ob + gm * n + gn)
                            out[o] = epilogue_fn(store_value(acc[i, j], c, gm * scm + gn * scn, use_c, float_ep,
                                                             alpha, beta), o, operands)

    kernel.__name__ = f"matmul_tiled_{BM}x{BN}x{BK}_{TM}x{TN}"
    return jit(kernel)


@functools.lru_cache(maxsize=None)
def direct_kernel(a_dtype, b_dtype, out_dtype, zero_points: bool, epilogue_fn):
    """One thread per output element; same arguments as :func:`tiled_kernel`."""
    LA, LB = load_type(a_dtype), load_type(b_dtype)
    ACC = load_type(out_dtype)
    I64 = np.int64
    store_value = store_value_fn(out_dtype)
    HAS_ZP = bool(zero_points)
    ZACC = ACC(0)

    def kernel(out, a, b, c, azp, bzp, meta, offs, alpha, beta, operands):
        nb, m, n, k = meta[NB], meta[M_], meta[N_], meta[K_]
        sam, sak, sbk, sbn = meta[SAM], meta[SAK], meta[SBK], meta[SBN]
        scm, scn, use_c, float_ep = meta[SCM], meta[SCN], meta[USE_C], meta[FLOAT_EP]
        szam, szak, szbk, szbn = meta[SZAM], meta[SZAK], meta[SZBK], meta[SZBN]
        mn = m * n
        for o in range(cuda.grid(1), nb * mn, cuda.gridsize(1)):
            bi = o // mn
            rest = o - bi * mn
            gm = rest // n
            gn = rest - gm * n
            pa = offs[bi * OFFS_W] + gm * sam
            pb = offs[bi * OFFS_W + 1] + gn * sbn
            za = offs[bi * OFFS_W + 2] + gm * szam
            zb = offs[bi * OFFS_W + 3] + gn * szbn
            total = ZACC
            for kk in range(k):
                va = LA(a[pa + kk * sak])
                vb = LB(b[pb + kk * sbk])
                if HAS_ZP:
                    va = LA(va - LA(azp[za + kk * szak]))
                    vb = LB(vb - LB(bzp[zb + kk * szbk]))
                total = ACC(total + ACC(va) * ACC(vb))
            out[o] = epilogue_fn(store_value(total, c, gm * scm + gn * scn, use_c, float_ep, alpha, beta),
                                 I64(o), operands)

    kernel.__name__ = "matmul_direct"
    return jit(kernel)
