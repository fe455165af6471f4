"""The FP16 tensor-core attention kernel (float16 Q, K, V and output): the one-launch online
softmax of :mod:`.tensor_cores`, both products on ``mma.sync.aligned.m16n8k16`` with FP16
operands and float32 accumulators, FlashAttention-2 style.

A block of ``warps`` warps owns ``bq = 16 * mi * warps`` query rows, each warp ``16 * mi``
of them, whole. The block copies its Q tile to shared memory once, then per key tile of
``bk`` (a multiple of 16) K and V, double-buffered: tile ``kt + 1``'s ``cp.async`` copies
run while tile ``kt`` is computed, one barrier per tile. Shared rows are padded by 8
halves (a row pitch an odd number of 16-byte units), so every ``ldmatrix`` phase reads 8
distinct bank quads.

Per key tile and warp: ``S = Q K^T`` (Q's A fragments loaded once by ``ldmatrix`` and kept
in registers for head sizes up to :data:`Q_REGISTER_DIMS`; K's B fragments by
``ldmatrix`` x4, two key octets per load), then on S's float32 accumulators the scale,
mask, causal fill and bounds, the row maxima (combined over each row's four lanes by
shuffles), the rescaling of O and ``P = exp(S - m)`` with float32 statistics; then ``O +=
P V`` with P never leaving registers: the m16n8k16 accumulators of two key octets, rounded
to FP16 in pairs (``cvt.rn.f16x2.f32``), are exactly the A fragment of the next product
(FlashAttention-2's trick), and V's B fragments come from ``ldmatrix.trans``. O is
normalized once at the end and stored as pairs of halves.

Two variants per shape: ``vector`` (every row of Q, K, V and O starting on 16 bytes: 16-byte
``cp.async`` copies, zero-filled past the sequence ends, and 4-byte output stores), chosen
at launch where the arrays are aligned, else element copies and stores. The warp steps are
:mod:`.warp_f16`'s: PTX on a GPU, an exchange through shared memory in the simulator.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import float32, from_dtype, types, uint32

from plugrt.kernels import aligned, cuda, jit, simulated
from plugrt.plugin import Tactic

from plugrt_contrib_attention.problem import (MAX_BLOCKS, MAX_SHARED_BYTES, AttentionShapes, WarpTiles,
                                              block_origin)
from plugrt_contrib_attention.warp_f16 import EXCHANGE_WORDS, pad_zeroer, q_fragments, tile_copier, warp_steps

#: Head sizes (rounded up to 16) up to which Q's fragments stay in registers for the whole
#: key loop (16 registers at 64); larger ones are loaded from shared memory per key tile.
Q_REGISTER_DIMS = 128
#: Largest head size offered (the O accumulators of one 16-row tile are ``dv / 4`` registers).
MAX_HEAD = 256
LOG2E = 1.4426950408889634


class F16Config(WarpTiles):
    """FP16 ``mma.m16n8k16`` tiles: key tiles a multiple of 16."""

    PREFIX = "f16"
    K_STEP = 16

    def resident_blocks(self, d16: int, dv16: int) -> int:
        """The blocks per SM asked of ptxas at these padded head sizes: ``min_blocks`` up to
        64 (ptxas fits the tile in that many without spilling), at most 2 up to 128 (the Q
        fragments and O accumulators double), 1 beyond."""
        widest = max(d16, dv16)
        if not self.min_blocks or widest <= 64:
            return self.min_blocks
        return max(1, min(self.min_blocks - 1, 2)) if widest <= 128 else 1


@dataclass(frozen=True)
class F16Layout:
    """Shared memory in halves: ``Qs[r * ldq + d]``, two K buffers ``Ks[buf][c * ldk + d]``
    (``k_step`` apart) and two V buffers ``Vs[buf][c * ldv + dv]``; head dims zero-padded to
    16. In the simulator the warps' exchange areas follow, from float32 word ``scr_at``."""

    d16: int
    dv16: int
    ldq: int
    ldk: int
    ldv: int
    q_at: int
    k_at: int
    v_at: int
    k_step: int
    v_step: int
    scr_at: int
    nbytes: int

    @classmethod
    def of(cls, config: F16Config, d: int, dv: int, emulated: bool) -> "F16Layout":
        d16, dv16 = -(-max(d, 1) // 16) * 16, -(-max(dv, 1) // 16) * 16
        ldq, ldk, ldv = d16 + 8, d16 + 8, dv16 + 8
        k_step, v_step = config.bk * ldk, config.bk * ldv
        q_at = 0
        k_at = q_at + config.bq * ldq
        v_at = k_at + 2 * k_step
        halves = v_at + 2 * v_step
        scr_at = -(-halves // 8) * 4  # float32 words, 16-byte aligned
        words = config.warps * EXCHANGE_WORDS if emulated else 0
        return cls(d16, dv16, ldq, ldk, ldv, q_at, k_at, v_at, k_step, v_step, scr_at, 4 * (scr_at + words))


# --------------------------------------------------------------------------- kernel


@functools.lru_cache(maxsize=None)
def f16_kernel(config: F16Config, d: int, dv: int, has_mask: bool, even_q: bool, even_k: bool, vector: bool,
               emulated: bool, guard_nan: bool = False, causal: int = 0, causal_fill: float = float("-inf"),
               skip_keys: bool = True, mask_rows: bool = False):
    """The FP16 kernel for one configuration, head sizes and shape class (``guard_nan``,
    ``causal``, ``causal_fill`` and ``skip_keys`` as :func:`.simt.flash_kernel`'s;
    ``vector``: the 16-byte copies and paired stores, for aligned rows; ``emulated``: the
    simulator's warp steps; ``mask_rows``: the mask is the same for every query row (row
    stride 0: a key-padding mask), read once per key tile for all of a lane's rows).

    Arguments and grid: :mod:`plugrt_contrib_attention.problem` (float16 arrays); dynamic
    shared memory ``F16Layout.nbytes``. ``even_q``/``even_k``: Sq (Sk) is a multiple of
    ``bq`` (``bk``).
    """
    config.check()
    GUARD = bool(guard_nan)
    CAUSAL, LOWER_RIGHT = int(causal) != 0, int(causal) == 2
    SKIP, FILL = CAUSAL and bool(skip_keys), float32(causal_fill)
    BQ, BK, MI, NT = config.bq, config.bk, config.mi, config.threads
    lay = F16Layout.of(config, d, dv, emulated)
    DV, D16, DV16 = dv, lay.d16, lay.dv16
    LDQ, LDK, LDV = lay.ldq, lay.ldk, lay.ldv
    Q_AT, K_AT, V_AT, K_STEP, V_STEP = lay.q_at, lay.k_at, lay.v_at, lay.k_step, lay.v_step
    SCR_AT = lay.scr_at
    KS, NS, KP, NO = D16 // 16, BK // 8, BK // 16, DV16 // 8  # S k-steps and n-tiles, O's
    NS2, NO2 = NS // 2, NO // 2                                # ldmatrix x4 loads two n-tiles
    WROWS = 16 * MI
    Q_REGS = D16 <= Q_REGISTER_DIMS
    SACC, OACC, ROWS, FRAGS, KEYS = MI * NS * 4, MI * NO * 4, 2 * MI, 4 * MI, 2 * NS
    QF = MI * KS * 4 if Q_REGS else 4
    PADS = vector and (D16 > d or DV16 > dv)
    MASK_ROWS = has_mask and bool(mask_rows)
    steps = warp_steps(emulated)
    shared_base, pack, mma, ldsm, ldsm_t = steps.base, steps.pack, steps.mma, steps.ldsm, steps.ldsm_t
    quad_max, quad_sum, commit, wait, store2 = steps.quad_max, steps.quad_sum, steps.commit, steps.wait, steps.store2
    q_fragment = q_fragments(Q_REGS, steps)
    stage_q = tile_copier(BQ, d, D16, LDQ, NT, vector, steps)
    stage_k = tile_copier(BK, d, D16, LDK, NT, vector, steps)
    stage_v = tile_copier(BK, dv, DV16, LDV, NT, vector, steps)
    zero_q = pad_zeroer(BQ, d, D16, LDQ, NT)
    zero_k = pad_zeroer(2 * BK, d, D16, LDK, NT)
    zero_v = pad_zeroer(2 * BK, dv, DV16, LDV, NT)
    out_type = from_dtype(np.dtype(np.float16))
    minus_inf = float32(-np.inf)
    zero = float32(0.0)
    one = float32(1.0)
    log2e = float32(LOG2E)

    def kernel(out, q, k, v, mask, sq, sk, heads, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, k_group, v_sb, v_sh, v_ss,
               v_group, o_sb, o_sh, o_ss, m_sb, m_sh, m_sq, m_sk, m_period, qscale):
        smem = cuda.shared.array(0, types.float16)
        scr = cuda.shared.array(0, float32)      # the simulator's lane exchange (past the tiles)
        sacc = cuda.local.array(SACC, float32)   # scores, then P: fragment order (i, j, 4)
        oacc = cuda.local.array(OACC, float32)   # output, fragment order (i, j, 4)
        m = cuda.local.array(ROWS, float32)      # running maxima of rows g, g + 8 of each m-tile
        lsum = cuda.local.array(ROWS, float32)   # running partial sums (this lane's columns)
        qf = cuda.local.array(QF, uint32)        # Q's A fragments, (i, ks, 4)
        fa = cuda.local.array(FRAGS, uint32)    # this k-step's A fragments (Q's, then P's)
        keys = cuda.local.array(KEYS, float32)   # a row-shared mask at this lane's keys
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        g = lane >> 2
        t = lane & 3
        me = SCR_AT + warp * EXCHANGE_WORDS
        sb = shared_base(smem)
        q0, b, h, q_base, k_base, v_base, m_base = block_origin(
            cuda.blockIdx.x, sq, BQ, heads, q_sb, q_sh, q_ss, k_sb, k_sh, k_group, v_sb, v_sh, v_group, m_sb, m_sh,
            m_period)
        diag = sk - sq if LOWER_RIGHT else 0  # a causal row i sees keys up to i + diag
        w0 = warp * WROWS                        # the warp's first row in the block's tile
        # This lane's ldmatrix rows (byte addresses): Q's A fragments, row lane % 16 of the
        # m-tile at column 8 (lane / 16); a K x4 covers keys 16 jp .. 16 jp + 15 (row lane % 8
        # + 8 (lane / 16)) at columns 8 ((lane / 8) % 2): the B fragments of two key octets; a
        # V x4 (.trans) keys 16 kp + lane % 8 + 8 ((lane / 8) % 2) at columns 8 (lane / 16)
        a_row = sb + 2 * (Q_AT + (w0 + (lane & 15)) * LDQ + 8 * (lane >> 4))
        k_row = sb + 2 * (K_AT + ((lane & 7) + 8 * (lane >> 4)) * LDK + 8 * ((lane >> 3) & 1))
        v_row = sb + 2 * (V_AT + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LDV + 8 * (lane >> 4))

        if PADS:
            zero_q(smem, Q_AT, tid)
            zero_k(smem, K_AT, tid)
            zero_v(smem, V_AT, tid)
        ktiles = (sk + BK - 1) // BK
        if SKIP:  # no tile wholly past the block's last row's diagonal
            last = min(q0 + BQ, sq) - 1 + diag
            ktiles = min(ktiles, last // BK + 1) if last >= 0 else 0
        stage_q(smem, sb, q, q_base, q_ss, sq - q0, Q_AT, tid)
        if ktiles > 0:
            stage_k(smem, sb, k, k_base, k_ss, sk, K_AT, tid)
            stage_v(smem, sb, v, v_base, v_ss, sk, V_AT, tid)
        commit()
        wait()
        cuda.syncthreads()

        if Q_REGS:
            for i in range(MI):
                for ks in range(KS):
                    f = (i * KS + ks) * 4
                    qf[f], qf[f + 1], qf[f + 2], qf[f + 3] = ldsm(smem, a_row + 2 * (16 * i * LDQ + 16 * ks),
                                                                  scr, me, lane)
        for i in range(ROWS):
            m[i] = minus_inf
            lsum[i] = zero
        for i in range(OACC):
            oacc[i] = zero

        for kt in range(ktiles):
            k0 = kt * BK
            odd = kt & 1
            k_at = k_row + 2 * K_STEP * odd
            v_at = v_row + 2 * V_STEP * odd
            if kt + 1 < ktiles:  # the next tile's copies overlap this tile's products
                stage_k(smem, sb, k, k_base + (k0 + BK) * k_ss, k_ss, sk - k0 - BK, K_AT + K_STEP * (1 - odd), tid)
                stage_v(smem, sb, v, v_base + (k0 + BK) * v_ss, v_ss, sk - k0 - BK, V_AT + V_STEP * (1 - odd), tid)
                commit()

            for i in range(SACC):
                sacc[i] = zero
            for ks in range(KS):  # S = Q K^T
                for i in range(MI):
                    f = (i * KS + ks) * 4 if Q_REGS else 0
                    fa[4 * i], fa[4 * i + 1], fa[4 * i + 2], fa[4 * i + 3] = q_fragment(
                        smem, qf, f, a_row + 2 * (16 * i * LDQ + 16 * ks), scr, me, lane)
                for jp in range(NS2):
                    b0, b1, b2, b3 = ldsm(smem, k_at + 2 * (16 * jp * LDK + 16 * ks), scr, me, lane)
                    for i in range(MI):
                        c = (i * NS + 2 * jp) * 4
                        sacc[c], sacc[c + 1], sacc[c + 2], sacc[c + 3] = mma(
                            scr, me, lane, fa[4 * i], fa[4 * i + 1], fa[4 * i + 2], fa[4 * i + 3], b0, b1,
                            sacc[c], sacc[c + 1], sacc[c + 2], sacc[c + 3])
                        sacc[c + 4], sacc[c + 5], sacc[c + 6], sacc[c + 7] = mma(
                            scr, me, lane, fa[4 * i], fa[4 * i + 1], fa[4 * i + 2], fa[4 * i + 3], b2, b3,
                            sacc[c + 4], sacc[c + 5], sacc[c + 6], sacc[c + 7])

            if MASK_ROWS:
                for j in range(NS):
                    for c in range(2):
                        col = k0 + 8 * j + 2 * t + c
                        if even_k or col < sk:
                            keys[2 * j + c] = float32(mask[m_base + col * m_sk])
            for i in range(MI):  # scale, mask, bounds; row maxima; rescale O; P = exp(S - m)
                for half in range(2):
                    slot = 2 * i + half
                    row = q0 + w0 + 16 * i + g + 8 * half
                    peak = minus_inf
                    for j in range(NS):
                        for c in range(2):
                            col = k0 + 8 * j + 2 * t + c
                            at = (i * NS + j) * 4 + 2 * half + c
                            value = sacc[at] * qscale
                            if even_k or col < sk:
                                if CAUSAL and col > row + diag:
                                    value = FILL
                                if MASK_ROWS:
                                    value += keys[2 * j + c]
                                elif has_mask and (even_q or row < sq):
                                    value += float32(mask[m_base + row * m_sq + col * m_sk])
                            else:
                                value = minus_inf
                            sacc[at] = value
                            if value > peak:
                                peak = value
                    peak = quad_max(scr, me, lane, peak)
                    old = m[slot]
                    if old > peak:
                        peak = old
                    shift = peak if peak != minus_inf else zero  # a row with no finite score yet
                    alpha = math.exp2((old - shift) * log2e)
                    m[slot] = peak
                    total = lsum[slot] * alpha
                    for j in range(NO):
                        oacc[(i * NO + j) * 4 + 2 * half] *= alpha
                        oacc[(i * NO + j) * 4 + 2 * half + 1] *= alpha
                    for j in range(NS):
                        for c in range(2):
                            at = (i * NS + j) * 4 + 2 * half + c
                            p = math.exp2((sacc[at] - shift) * log2e)
                            total += p
                            sacc[at] = p
                    lsum[slot] = total

            for kp in range(KP):  # O += P V, P's A fragments packed from the S accumulators
                for i in range(MI):
                    s = (i * NS + 2 * kp) * 4
                    fa[4 * i] = pack(sacc[s], sacc[s + 1])
                    fa[4 * i + 1] = pack(sacc[s + 2], sacc[s + 3])
                    fa[4 * i + 2] = pack(sacc[s + 4], sacc[s + 5])
                    fa[4 * i + 3] = pack(sacc[s + 6], sacc[s + 7])
                for jp in range(NO2):
                    b0, b1, b2, b3 = ldsm_t(smem, v_at + 2 * (16 * kp * LDV + 16 * jp), scr, me, lane)
                    for i in range(MI):
                        c = (i * NO + 2 * jp) * 4
                        oacc[c], oacc[c + 1], oacc[c + 2], oacc[c + 3] = mma(
                            scr, me, lane, fa[4 * i], fa[4 * i + 1], fa[4 * i + 2], fa[4 * i + 3], b0, b1,
                            oacc[c], oacc[c + 1], oacc[c + 2], oacc[c + 3])
                        oacc[c + 4], oacc[c + 5], oacc[c + 6], oacc[c + 7] = mma(
                            scr, me, lane, fa[4 * i], fa[4 * i + 1], fa[4 * i + 2], fa[4 * i + 3], b2, b3,
                            oacc[c + 4], oacc[c + 5], oacc[c + 6], oacc[c + 7])
            wait()               # this thread's copies of the next tile have landed
            cuda.syncthreads()   # everyone's; and this tile's buffers are free for tile kt + 2

        for i in range(MI):  # combine the rows' partial sums over their four lanes, normalize, store
            for half in range(2):
                total = quad_sum(scr, me, lane, lsum[2 * i + half])
                inv = one / total
                zeroed = GUARD and not total > zero
                row = q0 + w0 + 16 * i + g + 8 * half
                if even_q or row < sq:
                    o_base = b * o_sb + h * o_sh + row * o_ss
                    for j in range(NO):
                        col = 8 * j + 2 * t
                        at = (i * NO + j) * 4 + 2 * half
                        first = zero if zeroed else oacc[at] * inv
                        second = zero if zeroed else oacc[at + 1] * inv
                        if vector:
                            if col < DV:
                                store2(out, o_base + col, first, second)
                        else:
                            if col < DV:
                                out[o_base + col] = out_type(first)
                            if col + 1 < DV:
                                out[o_base + col + 1] = out_type(second)

    kernel.__name__ = (f"attention_{config.name}_d{d}_dv{dv}{'_mask' if has_mask else ''}"
                       f"{'_rows' if MASK_ROWS else ''}{'_evenq' if even_q else ''}{'_evenk' if even_k else ''}"
                       f"{'_vector' if vector else ''}{'_guard' if GUARD else ''}"
                       f"{f'_causal{int(causal)}' if CAUSAL else ''}{'_skip' if SKIP else ''}"
                       f"{'_fill' if CAUSAL and causal_fill != float('-inf') else ''}")
    blocks = config.resident_blocks(D16, DV16)
    if blocks and not emulated:
        return jit(kernel, launch_bounds=(NT, blocks))
    return jit(kernel)


# --------------------------------------------------------------------------- tactics


#: GPU configurations, the expected fastest first (not yet measured), each bounded to as
#: many resident blocks per SM as ptxas fits without spilling at head size 64 (with a
#: mask: 165, 125 and 126 registers): 4 warps of 16 rows and 64-key tiles (46 KiB of
#: shared memory), 8 warps with 32-key tiles (K and V read once per 128 queries), 4 warps
#: with 32-key tiles (fewer score registers, 4 blocks an SM).
GPU_CONFIGS: tuple[F16Config, ...] = (
    F16Config(4, 1, 64, min_blocks=3),
    F16Config(8, 1, 32, min_blocks=2),
    F16Config(4, 1, 32, min_blocks=4),
)
#: One warp of 16 rows and 16-key tiles: the simulator runs 32 threads a block.
SIM_CONFIGS: tuple[F16Config, ...] = (F16Config(1, 1, 16),)


def f16_tactic(config: F16Config, shapes: AttentionShapes, dtype, scale: float,
               emulated: bool | None = None, guard_nan: bool = False, ragged: bool = False) -> Tactic | None:
    """One FP16 tensor-core tactic for float16 data, or ``None`` (other dtypes, a tile that
    does not fit). FP16 products on FP16 data need no ``math`` flag: the builder allows
    them wherever the tensors are float16, as for the FP16 GEMMs."""
    config.check()
    if np.dtype(dtype) != np.float16 or max(shapes.d, shapes.dv) > MAX_HEAD:
        return None
    emulated = simulated() if emulated is None else bool(emulated)
    lay = F16Layout.of(config, shapes.d, shapes.dv, emulated)
    if lay.nbytes > MAX_SHARED_BYTES or shapes.blocks(config.bq) > MAX_BLOCKS:
        return None
    even_q, even_k = (False, False) if ragged else (shapes.sq % config.bq == 0, shapes.sk % config.bk == 0)
    params = {**config.params(), "even": [even_q, even_k]}  # (ragged: as simt.flash_tactic's)
    name = config.name + ("_ragged" if ragged else "")
    mask_rows = shapes.has_mask and shapes.mask_strides[2] == 0

    def launch_list(vector: bool):
        kernel = f16_kernel(config, shapes.d, shapes.dv, shapes.has_mask, even_q, even_k, vector, emulated,
                            bool(guard_nan), shapes.causal, shapes.causal_fill, shapes.skips_keys, mask_rows)
        return shapes.launch_list(kernel, config.bq, config.threads, lay.nbytes, dtype, scale)

    plain = launch_list(False)
    if not shapes.aligned(8):
        return Tactic(name, plain, params)
    vector = launch_list(True)

    def launches(ins, outs, workspace):
        if all(aligned(x) for x in ins[:3]) and aligned(outs[0], 4):
            return vector(ins, outs, workspace)
        return plain(ins, outs, workspace)

    return Tactic(name, launches, params)
