"""CUDA tactics of the matrix products: MatMul, Gemm and MatMulInteger.

Every product is described the same way on the host: ``nb`` batch items of an ``M x K``
by ``K x N`` product, each operand read through element strides (``A[m, k]`` at
``a[aoff[b] + m*sam + k*sak]``), so 1-D operands, broadcast batch dims, Gemm's transposes
and zero-point tensors are all strides and per-batch offsets. The shape description travels
as one small int64 ``meta`` array and one ``offs`` table (4 offsets per batch item).

Three kernel families share that description:

- ``tiled``: a shared-memory tile of ``BM x BN`` outputs per block, each thread a ``TM x TN``
  register tile (strided over the block tile so shared reads and global stores are
  conflict-free and coalesced), ``BK`` of K per step; edge tiles are guarded. The store
  applies ``alpha``, reads Gemm's C broadcast through strides, then the fused epilogue
  (:class:`plugrt.kernels.Epilogue`), and casts to the output.
- ``direct``: one thread per output, a plain K loop; the plainly-correct sibling.
- float32 GEMM for big products (:func:`gemm_tactics`): the SIMT SGEMM
  (:mod:`plugrt_builtin_ops.gemm_simt`, with split-K) and the TF32 tensor-core tactic
  (:mod:`plugrt_builtin_ops.gemm_tf32`).

float16 is loaded as float32 and accumulated in float32, float64 in float64, integers in
their own width (wrapping as the reference's fixed-width matmul does); MatMulInteger
subtracts zero points at load time and accumulates in int32. The epilogue's ``value`` is
the float result in the compute type for float outputs and the integer result (after
Gemm's float scaling is truncated, as the store would) for integer ones.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.device import simulated
from plugrt.kernels import Epilogue, broadcast_strides, cuda, flat, grid_1d, jit, to_device
from plugrt.tactic import Launch, Tactic

# Slots of the ``meta`` array.
NB, M_, N_, K_, SAM, SAK, SBK, SBN, SCM, SCN, USE_C, FLOAT_EP, A_KC, B_NC, SZAM, SZAK, SZBK, SZBN = range(18)
META_LEN = 18
#: Offsets per batch item in ``offs``: A, B, A's zero point, B's zero point.
OFFS_W = 4

#: Tiled configurations offered on a GPU: (BM, BN, BK, TM, TN). Tests may swap in tiny ones.
TILE_CONFIGS: tuple[tuple[int, int, int, int, int], ...] = (
    (64, 64, 16, 4, 4),
    (128, 128, 8, 8, 8),
    (32, 32, 16, 2, 2),
)
_DEFAULT_TILE_CONFIGS = TILE_CONFIGS
#: Blocks a tiled launch is capped at in the simulator (each block is a set of Python threads).
SIM_BLOCKS = 2
#: Grid cap for tiled kernels on a GPU (they loop over tiles with a stride of gridDim.x).
MAX_TILE_BLOCKS = 1 << 20
#: Block count under which a GPU is not filled (132 SMs on an H200).
FILL_BLOCKS = 132


# --------------------------------------------------------------------------- dtypes


def _load_type(dtype):
    """The type operands are widened to and accumulated in."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return np.float32
    if dtype.kind in "iu" and dtype.itemsize < 4:
        return np.int32  # MatMulInteger's int8/uint8
    return dtype.type


def _scaling_type(out_dtype):
    """Type of alpha/beta and of the math that applies them (float64 for integer outputs)."""
    return _load_type(out_dtype) if np.dtype(out_dtype).kind == "f" else np.float64


# --------------------------------------------------------------------------- kernels


@functools.lru_cache(maxsize=None)
def _store_value(out_dtype):
    """``value(total, c, ci, use_c, float_ep, alpha, beta)``: one output element as the
    store writes it, before the fused epilogue: ``alpha * total + beta * C`` in the compute
    type (float outputs); for integers the accumulator, plus C, or the float scaling
    truncated back to the accumulator's type (``float_ep``), as the reference's cast does."""
    ACC = _load_type(out_dtype)
    SCALE = _scaling_type(out_dtype)

    if np.dtype(out_dtype).kind == "f":
        @jit(device=True)
        def value(total, c, ci, use_c, float_ep, alpha, beta):
            v = total * alpha
            if use_c:
                v += beta * SCALE(c[ci])
            return v
    else:
        @jit(device=True)
        def value(total, c, ci, use_c, float_ep, alpha, beta):
            if float_ep:
                scaled = SCALE(total) * alpha
                if use_c:
                    scaled += beta * SCALE(c[ci])
                return ACC(scaled)
            if use_c:
                return ACC(total + c[ci])
            return total

    return value


#: The store's value function, for the other product kernels (``gemm_simt``, ``gemm_tf32``).
store_value_fn = _store_value


@functools.lru_cache(maxsize=None)
def tiled_kernel(a_dtype, b_dtype, out_dtype, zero_points: bool, bm: int, bn: int, bk: int, tm: int, tn: int,
                 epilogue_fn):
    """The shared-memory tiled kernel for one dtype combination, tile shape and epilogue.

    Arguments: ``(out, a, b, c, azp, bzp, meta, offs, alpha, beta, operands)``; ``c`` is
    read only when ``meta[USE_C]``, ``azp``/``bzp`` only when compiled with ``zero_points``,
    ``operands`` only by ``epilogue_fn``.
    """
    LA, LB = _load_type(a_dtype), _load_type(b_dtype)
    ACC = _load_type(out_dtype)
    I64 = np.int64
    store_value = _store_value(out_dtype)
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
    LA, LB = _load_type(a_dtype), _load_type(b_dtype)
    ACC = _load_type(out_dtype)
    I64 = np.int64
    store_value = _store_value(out_dtype)
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


# --------------------------------------------------------------------------- host plans


def _batch_offsets(batch: tuple, strides: np.ndarray) -> np.ndarray:
    """Element offset of each batch item (C order over ``batch``) for per-dim ``strides``."""
    if not batch:
        return np.zeros(1, np.int64)
    index = np.indices(batch, dtype=np.int64).reshape(len(batch), -1)
    return (index * np.asarray(strides, np.int64)[:, None]).sum(axis=0)


def _own_strides(shape: tuple) -> np.ndarray:
    """C strides of ``shape``, 0 along size-1 dims (those broadcast in the batch)."""
    return broadcast_strides(shape, shape)


def product_plan(a_shape: tuple, b_shape: tuple, za=None, zb=None) -> tuple[np.ndarray, np.ndarray]:
    """``meta`` and ``offs`` of ``numpy.matmul(a, b)`` on C-contiguous operands.

    ``za``/``zb``: element strides of zero-point tensors broadcast over A's/B's own dims
    (``None``: no zero point, read as 0 through zero strides).
    """
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    a2 = a_shape if len(a_shape) > 1 else (1,) + a_shape
    b2 = b_shape if len(b_shape) > 1 else b_shape + (1,)
    m, k, n = a2[-2], a2[-1], b2[-1]
    za = np.zeros(len(a_shape), np.int64) if za is None else np.asarray(za, np.int64)
    zb = np.zeros(len(b_shape), np.int64) if zb is None else np.asarray(zb, np.int64)
    # B without batch dims: fold A's batch into M (one wide product; A is contiguous).
    fold = len(a_shape) > 2 and len(b_shape) <= 2 and not za.any()
    batch = () if fold else tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    if fold:
        m = int(np.prod(a_shape[:-1]))

    def view(strides, own_rank, front):
        """(batch strides right-aligned to ``batch``, row stride, column stride)."""
        st = np.asarray(strides, np.int64)
        if own_rank == 1:
            st = np.array([0, st[0]] if front else [st[0], 0], np.int64)
        lead = np.zeros(len(batch), np.int64)
        extra = len(st) - 2
        if extra and batch:
            lead[len(batch) - extra:] = st[:-2]
        return lead, int(st[-2]), int(st[-1])

    a_lead, sam, sak = view(_own_strides(a_shape), len(a_shape), True)
    b_lead, sbk, sbn = view(_own_strides(b_shape), len(b_shape), False)
    za_lead, szam, szak = view(za, len(a_shape), True)
    zb_lead, szbk, szbn = view(zb, len(b_shape), False)
    if fold:
        sam, szam = k, 0
    nb = int(np.prod(batch, dtype=np.int64))
    offs = np.stack([_batch_offsets(batch, s) for s in (a_lead, b_lead, za_lead, zb_lead)], axis=1)
    meta = np.zeros(META_LEN, np.int64)
    meta[[NB, M_, N_, K_]] = nb, m, n, k
    meta[[SAM, SAK, SBK, SBN]] = sam, sak, sbk, sbn
    meta[[SZAM, SZAK, SZBK, SZBN]] = szam, szak, szbk, szbn
    meta[A_KC], meta[B_NC] = int(sak == 1), int(sbn == 1)
    return meta, np.ascontiguousarray(offs.reshape(-1))


def gemm_plan(a_shape, b_shape, c_shape, trans_a: bool, trans_b: bool, alpha: float, beta: float, integer: bool):
    """``meta`` and ``offs`` of Gemm (``c_shape`` None when C is omitted)."""
    m, k = (a_shape[1], a_shape[0]) if trans_a else a_shape
    n = b_shape[0] if trans_b else b_shape[1]
    meta = np.zeros(META_LEN, np.int64)
    meta[[NB, M_, N_, K_]] = 1, m, n, k
    meta[SAM], meta[SAK] = (1, m) if trans_a else (k, 1)
    meta[SBK], meta[SBN] = (1, k) if trans_b else (n, 1)
    use_c = c_shape is not None and beta != 0.0
    if use_c:
        meta[SCM], meta[SCN] = broadcast_strides(tuple(c_shape), (m, n))
    meta[USE_C] = int(use_c)
    # The reference leaves integers only when both scalings are identities.
    meta[FLOAT_EP] = int(integer and (alpha != 1.0 or (use_c and beta != 1.0)))
    meta[A_KC], meta[B_NC] = int(meta[SAK] == 1), int(meta[SBN] == 1)
    return meta, np.zeros(OFFS_W, np.int64)


# --------------------------------------------------------------------------- tactics


def _present(ins, index):
    return ins[index] if index < len(ins) else None


def product_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                    alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None,
                    zero_points: bool = False) -> list[Tactic]:
    """The tiled tactics and the direct one for a planned product, best first, each
    applying ``epilogue`` at its store.

    ``c_index``: the input holding Gemm's C (read when ``meta[USE_C]``). With
    ``zero_points`` inputs 2 and 3 are A's and B's zero points (omitted ones read as 0).
    The node's own inputs are ``ins[:epilogue.first]``; the epilogue's tensors follow.
    """
    key = (np.dtype(a_dtype), np.dtype(b_dtype), np.dtype(out_dtype), bool(zero_points))
    nb, m, n = int(meta[NB]), int(meta[M_]), int(meta[N_])
    total = nb * m * n
    ep = _scaling_type(out_dtype)

    def arguments(ins, outs):
        own = ins[:epilogue.first]
        out, a, b = flat(outs[0]), flat(own[0]), flat(own[1])
        c = flat(own[c_index]) if meta[USE_C] else out
        azp, bzp = a, b
        if zero_points:
            given = [_present(own, 2), _present(own, 3)]
            azp, bzp = (flat(z) if z is not None else to_device(np.zeros(1, dt)) for z, dt in zip(given, key[:2]))
        return (out, a, b, c, azp, bzp, to_device(meta), to_device(offs), ep(alpha), ep(beta),
                epilogue.arguments(ins))

    def make(name, params, kernel, geometry):
        def launches(ins, outs, workspace):
            if total == 0:
                return []
            grid, block = geometry()
            return [Launch(kernel, grid, block, arguments(ins, outs))]
        return Tactic(name, launches, params)

    ranked = []
    for bm, bn, bk, tm, tn in TILE_CONFIGS:
        blocks = nb * -(-m // bm) * -(-n // bn)
        fills = blocks >= FILL_BLOCKS
        grid = max(1, min(blocks, SIM_BLOCKS if simulated() else MAX_TILE_BLOCKS))
        block = (bm // tm) * (bn // tn)
        kernel = tiled_kernel(*key, bm, bn, bk, tm, tn, epilogue.fn)
        params = {"bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn}
        tactic = make(f"tiled{bm}x{bn}x{bk}_{tm}x{tn}", params, kernel, lambda g=grid, t=block: (g, t))
        ranked.append(((not fills, -bm * bn if fills else -blocks), tactic))
    tactics = [t for _, t in sorted(ranked, key=lambda pair: pair[0])]
    direct = make("direct", {}, direct_kernel(*key, epilogue.fn), lambda: grid_1d(total))
    tactics.insert(0 if (m == 1 or n == 1) else len(tactics), direct)
    if zero_points:
        return tactics
    fast = gemm_tactics(a_dtype, b_dtype, out_dtype, meta, offs, epilogue=epilogue, alpha=alpha, beta=beta,
                        c_index=c_index)
    if not simulated():
        return fast + tactics
    # In the simulator the first tactic wins untimed: keep the exact, cheap ones first
    # there (the direct tactic stays last when it is).
    cut = len(tactics) - 1 if tactics[-1] is direct else len(tactics)
    return tactics[:cut] + fast + tactics[cut:]


def gemm_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                 alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None) -> list[Tactic]:
    """The float32 GEMM family for big products, best first: TF32 tensor cores
    (``math="tf32"``, dropped by the tuner when TF32 is off; Hopper's ``wgmma`` first, then
    ``mma.sync``), then SIMT SGEMM; each only where its tile suits the product (see
    :func:`plugrt_builtin_ops.gemm_simt.fits`)."""
    from plugrt_builtin_ops import gemm_simt, gemm_tf32, gemm_wgmma  # they import this module

    kw = dict(epilogue=epilogue, alpha=alpha, beta=beta, c_index=c_index)
    return (gemm_wgmma.wgmma_tactics(a_dtype, b_dtype, out_dtype, meta, offs, **kw)
            + gemm_tf32.tf32_tactics(a_dtype, b_dtype, out_dtype, meta, offs, **kw)
            + gemm_simt.simt_tactics(a_dtype, b_dtype, out_dtype, meta, offs, **kw))
