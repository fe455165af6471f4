"""The SIMT attention kernel: one launch, shared-memory tiles, online softmax, CUDA cores.

Each block owns ``bq`` query rows of one (batch, head) and walks the keys in tiles of
``bk`` (flash-attention style). It stages its Q tile once (pre-multiplied by
``scale``), then per key tile stages K and V in shared memory, computes the
``bq x bk`` scores into registers, adds the mask, updates each row's running maximum
``m`` and rescales the output accumulator by ``exp(m_old - m_new)``, writes
``P = exp(s - m_new)`` to shared memory (over K's words) and accumulates ``O += P V``. The
Sq x Sk score matrix never exists beyond one tile; one launch does it all.

Threads form a ``ty x tx`` grid and hold register tiles: thread ``(y, x)`` owns query
rows ``y + ty * i``, keys ``x + tx * j`` of each tile, and output columns in strips of
four. Both products read shared memory four words at a time along their contraction
axis (16-byte vector loads in the ``vector`` tactics), so a warp's reads are broadcasts
or conflict-free. A row's maximum is combined across its ``tx`` threads through a small
shared table; its running sum stays a per-thread partial (all partials are rescaled by
the same factors) and is combined once at the end.

A causal kernel scores the keys past a row's diagonal with the op's fill (before the mask
is added) and, where that weighs nothing, never stages the key tiles wholly past the
block's last row's diagonal. Rows whose scores are all ``-inf``
give NaN, as the reference softmax does. Compute is float32 for float16 and float32
tensors. Q, K, V and the output are strided (:mod:`plugrt_contrib_attention.problem`),
the mask is C-contiguous and broadcastable to ``[B, H, Sq, Sk]``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import float32, from_dtype

from plugrt.kernels import cuda, jit
from plugrt.plugin import Tactic

from plugrt_contrib_attention.problem import (MAX_BLOCKS, MAX_SHARED_BYTES, AttentionShapes, as_is,
                                              block_origin, shared_vector_load, tile_stager)

@dataclass(frozen=True)
class FlashConfig:
    """A block of ``bq`` query rows, key tiles of ``bk``, a ``ty x tx`` thread grid, and
    whether shared-memory operands are read 16 bytes at a time (``vector``) or as four
    scalars (the same kernel otherwise; the simulator runs only the scalar form)."""

    bq: int
    bk: int
    ty: int
    tx: int
    vector: bool = True
    #: Ask ptxas for registers enough for this many resident blocks per SM (0: no bound).
    min_blocks: int = 0

    @property
    def threads(self) -> int:
        return self.ty * self.tx

    @property
    def rows(self) -> int:
        """Query rows per thread."""
        return self.bq // self.ty

    @property
    def cols(self) -> int:
        """Score columns per thread."""
        return self.bk // self.tx

    @property
    def name(self) -> str:
        bound = f"_b{self.min_blocks}" if self.min_blocks else ""
        return f"flash{self.bq}x{self.bk}_t{self.ty}x{self.tx}{'' if self.vector else '_scalar'}{bound}"

    def params(self) -> dict:
        return {"bq": self.bq, "bk": self.bk, "ty": self.ty, "tx": self.tx, "vector": self.vector,
                "min_blocks": self.min_blocks}

    def check(self) -> None:
        if not (self.bq % self.ty == 0 and self.bk % self.tx == 0 and self.bk % 4 == 0
                and self.tx in (4, 8, 16, 32) and self.threads <= 1024):
            raise ValueError(f"attention tile {self}: bq must divide by ty, bk by tx and by 4, tx be 4, 8, 16 "
                             "or 32, and a block at most 1024 threads")

    def layout(self, d: int, dv: int) -> "SharedLayout":
        return SharedLayout.of(self, d, dv)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class SharedLayout:
    """Offsets and leading dimensions (float32 words) of the block's shared memory, all
    row-major: ``Qs[r * ldq + d]``, ``Ks[c * ldk + d]`` (its words reused for
    ``Ps[r * ldp + c]`` once the scores are in registers), ``Vs[c * ldv + dv]``, and
    ``Red[x * ldr + r]`` (per-thread-column row partials). Head dims are padded with zeros
    to whole 4-word vectors (``dv`` to whole thread strips); every vector read is 16-byte
    aligned. ``ldk`` (an odd number of vectors) spreads a quarter warp's K rows over all
    banks; ``ldp`` and ``ldr`` make a warp's scalar P and partial stores conflict-free.
    """

    d4: int
    ldq: int
    ldk: int
    ldp: int
    ldv: int
    ldr: int
    q_at: int
    kp_at: int
    v_at: int
    red_at: int
    words: int

    @classmethod
    def of(cls, config: FlashConfig, d: int, dv: int) -> "SharedLayout":
        d4 = _round_up(max(d, 1), 4)
        ldq = d4
        ldk = d4 + 4 if (d4 // 4) % 2 == 0 else d4
        ldp = _round_up(config.bk, 32) + config.tx % 32
        ldv = _round_up(max(dv, 1), 4 * config.tx)
        ldr = _round_up(config.bq, 32) + 32 // config.tx
        q_words = config.bq * ldq
        kp_words = max(config.bk * ldk, config.bq * ldp)
        v_words = config.bk * ldv
        q_at = 0
        kp_at = q_at + q_words
        v_at = kp_at + kp_words
        red_at = v_at + v_words
        return cls(d4, ldq, ldk, ldp, ldv, ldr, q_at, kp_at, v_at, red_at, red_at + config.tx * ldr)

    @property
    def nbytes(self) -> int:
        return 4 * self.words


@functools.lru_cache(maxsize=None)
def flash_kernel(config: FlashConfig, d: int, dv: int, dtype_name: str, has_mask: bool, even_q: bool, even_k: bool,
                 guard_nan: bool = False, causal: int = 0, causal_fill: float = float("-inf"),
                 skip_keys: bool = True):
    """The SIMT kernel for one tile configuration, head sizes, dtype and shape class;
    ``guard_nan``: a row whose softmax is NaN (its sum not positive: every score ``-inf``,
    or a NaN or ``+inf`` one) stores zeros (the op's ``guard_nan``); ``causal``: the op's
    (1: row ``i`` sees keys ``j <= i``; 2: ``j <= i + Sk - Sq``): the scores of the other
    keys are ``causal_fill`` before the mask is added, and with ``skip_keys``
    (:attr:`AttentionShapes.skips_keys`) the key tiles wholly past the diagonal are left out.

    Arguments and grid: :mod:`plugrt_contrib_attention.problem`; dynamic shared memory
    ``layout.nbytes``.
    ``even_q``/``even_k``: Sq (Sk) is a multiple of ``bq`` (``bk``), so no bounds checks.

    Thread ``(y, x)`` owns query rows ``y + ty * i``, score columns (keys) ``x + tx * j``
    and output columns in strips of 4: ``4 * x + (j % 4) + 4 * tx * (j // 4)``. Scores read
    Q and K rows four head dims at a time; ``O += P V`` reads P rows and V rows four keys
    at a time.
    """
    config.check()
    GUARD = bool(guard_nan)
    CAUSAL, LOWER_RIGHT = int(causal) != 0, int(causal) == 2
    SKIP, FILL = CAUSAL and bool(skip_keys), float32(causal_fill)
    BQ, BK, TY, TX = config.bq, config.bk, config.ty, config.tx
    RM, RN = config.rows, config.cols
    lay = config.layout(d, dv)
    RD = lay.ldv // TX                      # output columns per thread, whole strips of 4
    NT = config.threads
    DV = dv
    LDQ, LDK, LDV = lay.ldq, lay.ldk, lay.ldv
    stage_q = tile_stager(BQ, d, lay.d4, lay.q_at, LDQ, NT, as_is)
    stage_k = tile_stager(BK, d, lay.d4, lay.kp_at, LDK, NT, as_is)
    stage_v = tile_stager(BK, dv, LDV, lay.v_at, LDV, NT, as_is)
    SCORES, OUTS, KVEC, VVEC = RM * RN, RM * RD, 4 * RN, 4 * RD   # register tiles (constant sizes)
    out_type = from_dtype(np.dtype(dtype_name))
    load4 = shared_vector_load(4, config.vector)
    U = np.uint64
    # Unsigned shared-memory indices: no negative-index wraparound code in the hot loops.
    U4, UTX, URD, URM, URN = U(4), U(TX), U(RD), U(RM), U(RN)
    ULDQ, ULDK, ULDP, ULDV, ULDR = U(lay.ldq), U(lay.ldk), U(lay.ldp), U(lay.ldv), U(lay.ldr)
    UQ_AT, UKP_AT, UV_AT, URED_AT = U(lay.q_at), U(lay.kp_at), U(lay.v_at), U(lay.red_at)
    UD_STEPS, UK_STEPS, USTRIPS = U(lay.d4 // 4), U(BK // 4), U(RD // 4)
    UROW_STEP, UCOL_STEP, USTRIP_STEP = U(TY), U(TX), U(4 * TX)
    minus_inf = float32(-np.inf)
    zero = float32(0.0)
    one = float32(1.0)

    def kernel(out, q, k, v, mask, sq, sk, heads, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, k_group, v_sb, v_sh, v_ss,
               v_group, o_sb, o_sh, o_ss, m_sb, m_sh, m_sq, m_sk, m_period, qscale):
        smem = cuda.shared.array(0, float32)
        s = cuda.local.array(SCORES, float32)     # this tile's scores, then exponents
        acc = cuda.local.array(OUTS, float32)     # output rows, unnormalized
        m = cuda.local.array(RM, float32)         # running row maxima
        lsum = cuda.local.array(RM, float32)      # running partial row sums
        kv = cuda.local.array(KVEC, float32)      # 4 head dims of this thread's keys
        vv = cuda.local.array(VVEC, float32)      # this thread's strips of 4 V rows
        tid = cuda.threadIdx.x
        tx = tid % TX
        ty = tid // TX
        utx = U(tx)
        uty = U(ty)
        q0, b, h, q_base, k_base, v_base, m_base = block_origin(
            cuda.blockIdx.x, sq, BQ, heads, q_sb, q_sh, q_ss, k_sb, k_sh, k_group, v_sb, v_sh, v_group, m_sb, m_sh,
            m_period)
        diag = sk - sq if LOWER_RIGHT else 0  # a causal row i sees keys up to i + diag

        stage_q(smem, q, q_base, q_ss, sq - q0, qscale, tid)  # the Q tile, pre-scaled, head dims zero-padded
        for i in range(RM):
            m[i] = minus_inf
            lsum[i] = zero
            for j in range(RD):
                acc[i * RD + j] = zero

        ktiles = (sk + BK - 1) // BK
        if SKIP:  # no tile wholly past the block's last row's diagonal
            last = min(q0 + BQ, sq) - 1 + diag
            ktiles = min(ktiles, last // BK + 1) if last >= 0 else 0
        for kt in range(ktiles):
            k0 = kt * BK
            stage_k(smem, k, k_base + k0 * k_ss, k_ss, sk - k0, one, tid)
            stage_v(smem, v, v_base + k0 * v_ss, v_ss, sk - k0, one, tid)
            cuda.syncthreads()

            for i in range(SCORES):
                s[i] = zero
            for step in range(UD_STEPS):  # S = Q K^T, 4 head dims per step
                dd = step * U4
                for j in range(URN):
                    k_at = UKP_AT + (utx + j * UCOL_STEP) * ULDK + dd
                    kv[j * U4], kv[j * U4 + U(1)], kv[j * U4 + U(2)], kv[j * U4 + U(3)] = load4(smem, k_at)
                for i in range(URM):
                    a0, a1, a2, a3 = load4(smem, UQ_AT + (uty + i * UROW_STEP) * ULDQ + dd)
                    for j in range(URN):
                        x = s[i * URN + j]
                        x += a0 * kv[j * U4]
                        x += a1 * kv[j * U4 + U(1)]
                        x += a2 * kv[j * U4 + U(2)]
                        x += a3 * kv[j * U4 + U(3)]
                        s[i * URN + j] = x

            for i in range(RM):  # mask, bounds, this thread's part of the tile row maxima
                row = q0 + ty + TY * i
                peak = minus_inf
                for j in range(RN):
                    c = k0 + tx + TX * j
                    value = s[i * RN + j]
                    if even_k or c < sk:
                        if CAUSAL and c > row + diag:
                            value = FILL
                        if has_mask and (even_q or row < sq):
                            value += float32(mask[m_base + row * m_sq + c * m_sk])
                    else:
                        value = minus_inf
                    s[i * RN + j] = value
                    if value > peak:
                        peak = value
                smem[URED_AT + utx * ULDR + uty + U(i) * UROW_STEP] = peak
            cuda.syncthreads()  # K is dead from here: its words hold P

            for i in range(RM):  # new maxima, rescale, exponents into P
                r = uty + U(i) * UROW_STEP
                peak = m[i]
                for t in range(UTX):
                    value = smem[URED_AT + t * ULDR + r]
                    if value > peak:
                        peak = value
                shift = peak if peak != minus_inf else zero  # a row with no finite score yet
                alpha = math.exp(m[i] - shift)
                m[i] = peak
                total = lsum[i] * alpha
                for j in range(RD):
                    acc[i * RD + j] *= alpha
                for j in range(RN):
                    p = math.exp(s[i * RN + j] - shift)
                    total += p
                    smem[UKP_AT + r * ULDP + utx + U(j) * UCOL_STEP] = p
                lsum[i] = total
            cuda.syncthreads()

            for step in range(UK_STEPS):  # O += P V, 4 keys per step
                cc = step * U4
                for u in range(U4):
                    v_at = UV_AT + (cc + u) * ULDV + utx * U4
                    for j4 in range(USTRIPS):
                        at = u * URD + j4 * U4
                        vv[at], vv[at + U(1)], vv[at + U(2)], vv[at + U(3)] = load4(smem, v_at + j4 * USTRIP_STEP)
                for i in range(URM):
                    p0, p1, p2, p3 = load4(smem, UKP_AT + (uty + i * UROW_STEP) * ULDP + cc)
                    for j in range(URD):
                        x = acc[i * URD + j]
                        x += p0 * vv[j]
                        x += p1 * vv[URD + j]
                        x += p2 * vv[U(2) * URD + j]
                        x += p3 * vv[U(3) * URD + j]
                        acc[i * URD + j] = x
            cuda.syncthreads()  # the next tile overwrites K, P and V

        for i in range(RM):  # combine the partial row sums, normalize, store
            smem[URED_AT + utx * ULDR + uty + U(i) * UROW_STEP] = lsum[i]
        cuda.syncthreads()
        for i in range(RM):
            r = uty + U(i) * UROW_STEP
            total = zero
            for t in range(UTX):
                total += smem[URED_AT + t * ULDR + r]
            inv = one / total
            zeroed = GUARD and not total > zero
            row = q0 + ty + TY * i
            if even_q or row < sq:
                o_base = b * o_sb + h * o_sh + row * o_ss
                for j in range(RD):
                    col = 4 * tx + (j % 4) + 4 * TX * (j // 4)
                    if col < DV:
                        out[o_base + col] = out_type(zero if zeroed else acc[i * RD + j] * inv)

    kernel.__name__ = (f"attention_{config.name}_d{d}_dv{dv}_{dtype_name}{'_mask' if has_mask else ''}"
                       f"{'_evenq' if even_q else ''}{'_evenk' if even_k else ''}{'_guard' if GUARD else ''}"
                       f"{f'_causal{int(causal)}' if CAUSAL else ''}{'_skip' if SKIP else ''}"
                       f"{'_fill' if CAUSAL and causal_fill != float('-inf') else ''}")
    if config.min_blocks:
        return jit(kernel, launch_bounds=(NT, config.min_blocks))
    return jit(kernel)


# --------------------------------------------------------------------------- tactics


#: GPU configurations, safest first (the plain-Numba scalar loads), then the ones expected
#: fastest at BERT-like sizes (head size 64, a few hundred tokens).
#: After the reference, fastest first as measured on the H200 (B8 H12 S512 D64 fp32):
#: 128x64 0.293 ms, 64x64 t8x16 0.314, t16x16 0.339, 32x64 0.540.
GPU_CONFIGS: tuple[FlashConfig, ...] = (
    FlashConfig(64, 64, 8, 16, vector=False),   # scalar shared loads: the plain-Numba reference
    FlashConfig(128, 64, 16, 16),               # 256 threads, 8 x 4 scores, 8 x 4 outputs
    FlashConfig(64, 64, 8, 16),                 # 128 threads, 8 x 4 scores, 8 x 4 outputs (Dv 64)
    FlashConfig(64, 64, 16, 16, min_blocks=2),  # 256 threads, 4 x 4 scores, 4 x 4 outputs
    FlashConfig(32, 64, 4, 16),                 # 64 threads, 8 x 4 scores, 8 x 4 outputs
)
#: The simulator runs every thread as a Python thread: tiny tiles, few threads, the same code.
SIM_CONFIGS: tuple[FlashConfig, ...] = (
    FlashConfig(4, 4, 2, 4, vector=False),
    FlashConfig(8, 8, 2, 4),
)


def flash_tactic(config: FlashConfig, shapes: AttentionShapes, dtype, scale: float,
                 guard_nan: bool = False, ragged: bool = False) -> Tactic | None:
    """One tactic of the SIMT kernel, or ``None`` when the tile does not fit the problem;
    ``ragged``: bounds-checked even where the sequences fill whole tiles (``params["even"]``
    says which checks are left out: a kernel for every shape has none left out)."""
    config.check()
    lay = config.layout(shapes.d, shapes.dv)
    if lay.nbytes > MAX_SHARED_BYTES or shapes.blocks(config.bq) > MAX_BLOCKS:
        return None
    even_q, even_k = (False, False) if ragged else (shapes.sq % config.bq == 0, shapes.sk % config.bk == 0)
    kernel = flash_kernel(config, shapes.d, shapes.dv, np.dtype(dtype).name, shapes.has_mask, even_q, even_k,
                          bool(guard_nan), shapes.causal, shapes.causal_fill, shapes.skips_keys)
    launches = shapes.launch_list(kernel, config.bq, config.threads, lay.nbytes, dtype, scale)
    return Tactic(config.name + ("_ragged" if ragged else ""), launches, {**config.params(), "even": [even_q, even_k]})
