"""The TF32 tensor-core attention kernel (``math="tf32"``): the same one-launch online
softmax as :mod:`.simt`, both products on ``mma.sync.aligned.m16n8k8`` TF32 tensor cores.

A block of ``warps`` warps owns ``bq = 16 * mi * warps`` query rows; each warp owns
``16 * mi`` of them, whole: its scores tile (``16 mi x bk``) and output tile
(``16 mi x Dv``) are ``m16n8`` accumulator fragments in registers. Per key tile: K and V
are staged in shared memory (rounded to TF32 once), ``S = Q K^T`` runs on tensor cores
(Q's fragments read from its shared tile, each reused for every key fragment), the mask
and the online softmax update work on the fragments (a row's maximum and sum are
combined over the four lanes holding it through a small shared table), ``P`` goes to
shared memory (over K's words, rounded to TF32) and ``O += P V`` runs on tensor cores.

Fragment layout of m16n8k8 (``g = lane / 4``, ``t = lane % 4``): A holds (row, k) =
(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); B holds (k, n) = (t, g), (t + 4, g); the
accumulators (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). Within each 8-wide k
slice the kernel maps k = t and k = t + 4 to the columns 2t and 2t + 1 of both operands
(a sum does not care about its order), so a lane reads its A pairs, and K's, with 8-byte
loads. Shared tiles are padded so the fragment reads are conflict-free.

The kernel body is the same everywhere; only the warp step differs: on a GPU ``mma.sync``
and ``cvt.rna.tf32.f32`` (:func:`plugrt.kernels.tf32_mma`, inline PTX); in the simulator, which runs
neither, each lane computes its own accumulator elements from the same shared tiles with
scalar FMAs on the same TF32-rounded operands.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import float32, from_dtype

from plugrt.kernels import cuda, jit, round_tf32, simulated, tf32_mma
from plugrt.plugin import Tactic

from plugrt_contrib_attention.problem import (MAX_BLOCKS, MAX_SHARED_BYTES, AttentionShapes, WarpTiles,
                                              block_origin, shared_vector_load, tile_stager)

class Tf32Config(WarpTiles):
    """TF32 ``mma.m16n8k8`` tiles: key tiles a multiple of 8."""

    PREFIX = "tf32"
    K_STEP = 8


def _padded(n: int, residue: int) -> int:
    """The least width >= ``n`` that is ``residue`` modulo 32 (a conflict-free row pitch)."""
    return n + (residue - n) % 32


@dataclass(frozen=True)
class Tf32Layout:
    """Shared memory in float32 words: ``Qs[r * ldq + d]``, ``Ks[c * ldk + d]`` (reused for
    ``Ps[r * ldp + c]``), ``Vs[c * ldv + dv]``, ``Red[r * 4 + t]`` (a row's four lane partials)."""

    d8: int
    dv8: int
    ldq: int
    ldk: int
    ldp: int
    ldv: int
    q_at: int
    kp_at: int
    v_at: int
    red_at: int
    words: int

    @classmethod
    def of(cls, config: Tf32Config, d: int, dv: int) -> "Tf32Layout":
        d8, dv8 = -(-max(d, 1) // 8) * 8, -(-max(dv, 1) // 8) * 8
        # 8-byte fragment reads of rows g at columns 2t: banks 8g + 2t (a half warp each)
        ldq, ldk, ldp = _padded(d8, 8), _padded(d8, 8), _padded(config.bk, 8)
        ldv = _padded(dv8, 4)  # V's fragment reads rows 2t (and 2t + 1) at column g: banks 8t + g
        q_at = 0
        kp_at = q_at + config.bq * ldq
        v_at = kp_at + max(config.bk * ldk, config.bq * ldp)
        red_at = v_at + config.bk * ldv
        return cls(d8, dv8, ldq, ldk, ldp, ldv, q_at, kp_at, v_at, red_at, red_at + 4 * config.bq)

    @property
    def nbytes(self) -> int:
        return 4 * self.words


# --------------------------------------------------------------------------- warp steps


@functools.lru_cache(maxsize=None)
def warp_steps(ars: int, brs: int, bks: int, emulated: bool):
    """``(to_tf32, load_a, mma_into)`` for products whose A is row-major (``A(row, k) =
    smem[a + row * ars + k]``) and B is ``B(k, n) = smem[b + k * bks + n * brs]``.

    ``load_a(smem, a, g, t, fa, f)`` fills ``fa[f : f + 4]`` with one 16 x 8 A fragment;
    ``mma_into(smem, fa, f, a, b, g, t, acc, c)`` adds that fragment times the 8 x 8 B
    fragment at ``b`` to ``acc[c : c + 4]`` (``a``: where ``load_a`` read, which the
    simulator's form reads again instead of the registers). Indices are uint64 (no
    negative-index wraparound code in the hot loops).
    """
    U = np.uint64
    U1, U2, U3, U8 = U(1), U(2), U(3), U(8)
    UARS, UBRS, UBKS = U(ars), U(brs), U(bks)
    UARS8 = U(8 * ars)
    if emulated:
        @jit(device=True)
        def load_a(smem, a, g, t, fa, f):
            pass

        @jit(device=True)
        def mma_into(smem, fa, f, a, b, g, t, acc, c):
            col = b + U2 * t * UBRS
            for half in range(2):
                row = a + (g + U8 * U(half)) * UARS
                s0 = acc[c + U2 * U(half)]
                s1 = acc[c + U2 * U(half) + U1]
                for kk in range(8):
                    av = smem[row + U(kk)]
                    s0 += av * smem[col + U(kk) * UBKS]
                    s1 += av * smem[col + U(kk) * UBKS + UBRS]
                acc[c + U2 * U(half)] = s0
                acc[c + U2 * U(half) + U1] = s1

        return round_tf32, load_a, mma_into

    to_tf32, mma = tf32_mma()
    load2 = shared_vector_load(2)

    # The k order within each 8-wide slice is permuted, the same way for A and B (so the
    # sum is unchanged): a lane's k = t and k = t + 4 are the columns 2t and 2t + 1, which
    # one 8-byte load fetches.
    @jit(device=True)
    def load_a(smem, a, g, t, fa, f):
        p = a + g * UARS + U2 * t
        fa[f], fa[f + U2] = load2(smem, p)
        fa[f + U1], fa[f + U3] = load2(smem, p + UARS8)

    @jit(device=True)
    def b_fragment(smem, q):
        if bks == 1:
            return load2(smem, q)
        return smem[q], smem[q + UBKS]

    @jit(device=True)
    def mma_into(smem, fa, f, a, b, g, t, acc, c):
        b0, b1 = b_fragment(smem, b + U2 * t * UBKS + g * UBRS)
        d = mma(fa[f], fa[f + U1], fa[f + U2], fa[f + U3], b0, b1,
                acc[c], acc[c + U1], acc[c + U2], acc[c + U3])
        acc[c] = d[0]
        acc[c + U1] = d[1]
        acc[c + U2] = d[2]
        acc[c + U3] = d[3]

    return to_tf32, load_a, mma_into


# --------------------------------------------------------------------------- kernel


@functools.lru_cache(maxsize=None)
def tf32_kernel(config: Tf32Config, d: int, dv: int, dtype_name: str, has_mask: bool, even_q: bool, even_k: bool,
                emulated: bool, guard_nan: bool = False, causal: int = 0, causal_fill: float = float("-inf"),
                skip_keys: bool = True):
    """The tensor-core kernel for one configuration, head sizes, dtype and shape class
    (``guard_nan``, ``causal``, ``causal_fill`` and ``skip_keys`` as
    :func:`plugrt_contrib_attention.simt.flash_kernel`'s).

    Arguments and grid: :mod:`plugrt_contrib_attention.problem`; dynamic shared memory
    ``Tf32Layout.nbytes``. ``even_q``/``even_k``: Sq (Sk) is a multiple of ``bq`` (``bk``).
    """
    config.check()
    GUARD = bool(guard_nan)
    CAUSAL, LOWER_RIGHT = int(causal) != 0, int(causal) == 2
    SKIP, FILL = CAUSAL and bool(skip_keys), float32(causal_fill)
    BQ, BK, MI, NT = config.bq, config.bk, config.mi, config.threads
    lay = Tf32Layout.of(config, d, dv)
    D, DV, D8 = d, dv, lay.d8
    LDQ, LDK, LDP, LDV = lay.ldq, lay.ldk, lay.ldp, lay.ldv
    Q_AT, KP_AT, V_AT, RED_AT = lay.q_at, lay.kp_at, lay.v_at, lay.red_at
    NS, NO = BK // 8, lay.dv8 // 8          # n-tiles of the scores and of the output
    KS, KP = D8 // 8, BK // 8               # k-steps of S = Q K^T and of O += P V
    WROWS = 16 * MI
    SACC, OACC, ROWS, FRAGS = MI * NS * 4, MI * NO * 4, 2 * MI, 4 * MI
    out_type = from_dtype(np.dtype(dtype_name))
    to_tf32, load_q, mma_s = warp_steps(LDQ, LDK, 1, emulated)     # S: A = Qs rows, B(d, key) = Ks[key][d]
    _, load_p, mma_o = warp_steps(LDP, 1, LDV, emulated)           # O: A = Ps rows, B(key, dv) = Vs[key][dv]
    stage_q = tile_stager(BQ, D, D8, Q_AT, LDQ, NT, to_tf32)
    stage_k = tile_stager(BK, D, D8, KP_AT, LDK, NT, to_tf32)
    stage_v = tile_stager(BK, DV, lay.dv8, V_AT, LDV, NT, to_tf32)
    minus_inf = float32(-np.inf)
    zero = float32(0.0)
    one = float32(1.0)
    U = np.uint64
    U4, U8, U16 = U(4), U(8), U(16)
    UMI, UNS, UNO, UKS, UKP = U(MI), U(NS), U(NO), U(KS), U(KP)
    ULDQ, ULDK, ULDP, ULDV = U(LDQ), U(LDK), U(LDP), U(LDV)
    UQ_AT, UKP_AT, UV_AT = U(Q_AT), U(KP_AT), U(V_AT)

    def kernel(out, q, k, v, mask, sq, sk, heads, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, k_group, v_sb, v_sh, v_ss,
               v_group, o_sb, o_sh, o_ss, m_sb, m_sh, m_sq, m_sk, m_period, qscale):
        smem = cuda.shared.array(0, float32)
        sacc = cuda.local.array(SACC, float32)   # scores, fragment order (i, j, 4)
        oacc = cuda.local.array(OACC, float32)   # output, fragment order (i, j, 4)
        m = cuda.local.array(ROWS, float32)      # running maxima of rows g, g + 8 of each m-tile
        lsum = cuda.local.array(ROWS, float32)   # running partial sums (this lane's columns)
        fa = cuda.local.array(FRAGS, float32)
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4
        q0, b, h, q_base, k_base, v_base, m_base = block_origin(
            cuda.blockIdx.x, sq, BQ, heads, q_sb, q_sh, q_ss, k_sb, k_sh, k_group, v_sb, v_sh, v_group, m_sb, m_sh,
            m_period)
        diag = sk - sq if LOWER_RIGHT else 0  # a causal row i sees keys up to i + diag
        w0 = warp * WROWS                        # the warp's first row in the block's tile
        ug, ut, uw0 = U(g), U(t), U(w0)

        stage_q(smem, q, q_base, q_ss, sq - q0, qscale, tid)  # Q tile: pre-scaled, TF32, head dims zero-padded
        for i in range(ROWS):
            m[i] = minus_inf
            lsum[i] = zero
        for i in range(OACC):
            oacc[i] = zero

        ktiles = (sk + BK - 1) // BK
        if SKIP:  # no tile wholly past the block's last row's diagonal
            last = min(q0 + BQ, sq) - 1 + diag
            ktiles = min(ktiles, last // BK + 1) if last >= 0 else 0
        for kt in range(ktiles):
            k0 = kt * BK
            stage_k(smem, k, k_base + k0 * k_ss, k_ss, sk - k0, one, tid)
            stage_v(smem, v, v_base + k0 * v_ss, v_ss, sk - k0, one, tid)
            cuda.syncthreads()

            for i in range(SACC):
                sacc[i] = zero
            for ks in range(UKS):  # S = Q K^T
                for i in range(UMI):
                    load_q(smem, UQ_AT + (uw0 + U16 * i) * ULDQ + U8 * ks, ug, ut, fa, U4 * i)
                for j in range(UNS):
                    for i in range(UMI):
                        mma_s(smem, fa, U4 * i, UQ_AT + (uw0 + U16 * i) * ULDQ + U8 * ks,
                              UKP_AT + U8 * j * ULDK + U8 * ks, ug, ut, sacc, (i * UNS + j) * U4)

            for i in range(MI):  # mask, bounds, this lane's part of the tile row maxima
                for half in range(2):
                    row = q0 + w0 + 16 * i + g + 8 * half
                    peak = minus_inf
                    for j in range(NS):
                        for c in range(2):
                            col = k0 + 8 * j + 2 * t + c
                            at = (i * NS + j) * 4 + 2 * half + c
                            value = sacc[at]
                            if even_k or col < sk:
                                if CAUSAL and col > row + diag:
                                    value = FILL
                                if has_mask and (even_q or row < sq):
                                    value += float32(mask[m_base + row * m_sq + col * m_sk])
                            else:
                                value = minus_inf
                            sacc[at] = value
                            if value > peak:
                                peak = value
                    smem[RED_AT + (w0 + 16 * i + g + 8 * half) * 4 + t] = peak
            cuda.syncthreads()  # every warp is done with K: its words hold P from here

            for i in range(MI):  # new maxima, rescale, exponents into P
                for half in range(2):
                    r = w0 + 16 * i + g + 8 * half
                    slot = 2 * i + half
                    peak = m[slot]
                    for u in range(4):
                        value = smem[RED_AT + r * 4 + u]
                        if value > peak:
                            peak = value
                    shift = peak if peak != minus_inf else zero  # a row with no finite score yet
                    alpha = math.exp(m[slot] - shift)
                    m[slot] = peak
                    total = lsum[slot] * alpha
                    for j in range(NO):
                        oacc[(i * NO + j) * 4 + 2 * half] *= alpha
                        oacc[(i * NO + j) * 4 + 2 * half + 1] *= alpha
                    for j in range(NS):
                        for c in range(2):
                            p = math.exp(sacc[(i * NS + j) * 4 + 2 * half + c] - shift)
                            total += p
                            smem[UKP_AT + U(r) * ULDP + U(8 * j + 2 * t + c)] = to_tf32(p)
                    lsum[slot] = total
            cuda.syncthreads()

            for kp in range(UKP):  # O += P V
                for i in range(UMI):
                    load_p(smem, UKP_AT + (uw0 + U16 * i) * ULDP + U8 * kp, ug, ut, fa, U4 * i)
                for j in range(UNO):
                    for i in range(UMI):
                        mma_o(smem, fa, U4 * i, UKP_AT + (uw0 + U16 * i) * ULDP + U8 * kp,
                              UV_AT + U8 * kp * ULDV + U8 * j, ug, ut, oacc, (i * UNO + j) * U4)
            cuda.syncthreads()  # the next tile overwrites K, P and V

        for i in range(MI):  # combine the rows' partial sums over their four lanes
            for half in range(2):
                smem[RED_AT + (w0 + 16 * i + g + 8 * half) * 4 + t] = lsum[2 * i + half]
        cuda.syncthreads()
        for i in range(MI):
            for half in range(2):
                r = w0 + 16 * i + g + 8 * half
                total = zero
                for u in range(4):
                    total += smem[RED_AT + r * 4 + u]
                inv = one / total
                zeroed = GUARD and not total > zero
                row = q0 + r
                if even_q or row < sq:
                    o_base = b * o_sb + h * o_sh + row * o_ss
                    for j in range(NO):
                        for c in range(2):
                            col = 8 * j + 2 * t + c
                            if col < DV:
                                value = zero if zeroed else oacc[(i * NO + j) * 4 + 2 * half + c] * inv
                                out[o_base + col] = out_type(value)

    kernel.__name__ = (f"attention_{config.name}_d{d}_dv{dv}_{dtype_name}{'_mask' if has_mask else ''}"
                       f"{'_evenq' if even_q else ''}{'_evenk' if even_k else ''}{'_guard' if GUARD else ''}"
                       f"{f'_causal{int(causal)}' if CAUSAL else ''}{'_skip' if SKIP else ''}"
                       f"{'_fill' if CAUSAL and causal_fill != float('-inf') else ''}")
    if config.min_blocks and not emulated:
        return jit(kernel, launch_bounds=(NT, config.min_blocks))
    return jit(kernel)


# --------------------------------------------------------------------------- tactics


#: GPU configurations, the expected fastest first. ptxas gives each about 165 registers
#: unbounded (3 blocks of 4 warps an SM; at head size 64 the 16 x 64 score and output
#: fragments are 64 of them); the 8-warp one is bounded to 2 blocks an SM.
#: Fastest first as measured on the H200 (B8 H12 S512 D64): 8 warps 0.219 ms, 4 warps with
#: 64-key tiles 0.306, with 32-key tiles 0.317.
GPU_CONFIGS: tuple[Tf32Config, ...] = (
    Tf32Config(8, 1, 64, min_blocks=2),
    Tf32Config(4, 1, 64),
    Tf32Config(4, 1, 32),
)
#: One warp of 16 rows and 8-key tiles: the simulator runs 32 threads a block.
SIM_CONFIGS: tuple[Tf32Config, ...] = (Tf32Config(1, 1, 8),)


def tf32_tactic(config: Tf32Config, shapes: AttentionShapes, dtype, scale: float,
                emulated: bool | None = None, guard_nan: bool = False, ragged: bool = False) -> Tactic | None:
    """One tensor-core tactic, or ``None`` when the tile does not fit the problem
    (``ragged``: as :func:`plugrt_contrib_attention.simt.flash_tactic`'s)."""
    config.check()
    lay = Tf32Layout.of(config, shapes.d, shapes.dv)
    if lay.nbytes > MAX_SHARED_BYTES or shapes.blocks(config.bq) > MAX_BLOCKS:
        return None
    emulated = simulated() if emulated is None else bool(emulated)
    even_q, even_k = (False, False) if ragged else (shapes.sq % config.bq == 0, shapes.sk % config.bk == 0)
    kernel = tf32_kernel(config, shapes.d, shapes.dv, np.dtype(dtype).name, shapes.has_mask, even_q, even_k,
                         emulated, bool(guard_nan), shapes.causal, shapes.causal_fill, shapes.skips_keys)
    launches = shapes.launch_list(kernel, config.bq, config.threads, lay.nbytes, dtype, scale)
    return Tactic(config.name + ("_ragged" if ragged else ""), launches, {**config.params(), "even": [even_q, even_k]},
                  math="tf32")
