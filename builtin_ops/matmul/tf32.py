"""The TF32 tensor-core tactic of MatMul and Gemm (float32 in and out, ``math="tf32"``).

A block of ``wm x wn`` warps computes a ``bm x bn`` output tile, ``bm = wm * mi * 16`` and
``bn = wn * ni * 8``: each warp owns ``mi x ni`` tiles of ``mma.sync.aligned.m16n8k8``
(``.row.col.f32.tf32.tf32.f32``), 4 float32 accumulators per tile and thread. Operand
tiles are staged k-major in two shared buffers exactly as the SIMT SGEMM stages them
(:func:`.simt.tile_loader`: the next tile's global loads overlap the current tile's
math), padded by 8 words so the fragment reads are conflict-free; the output tile goes
through shared memory to the fused epilogue (:func:`.simt.tile_store`).

The kernel body is the same everywhere; only the warp-level step
``warp_mma(smem, a_off, b_off, lane, acc)`` (one k8 slice of the warp's tile) differs: tensor
cores on a GPU, scalar FMAs in the simulator (:mod:`.mma_sync`, with the ``cp.async``
copies of the pipelined main loop). Operands staged through registers are rounded to TF32
once, when staged; the pipelined main loop rounds fragments as they are read.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
from numba import float32

from plugrt.kernels import Epilogue, aligned, cuda, jit, literal_unroll, simulated
from plugrt.plugin import Tactic

from .mma_sync import accumulator_stager, async_copy, async_tile_copy, tf32_rounder, warp_mma_for
from .plan import K_, M_, N_, OFFS_W, SAK, SAM, SBK, SBN
from .simt import choose_splits, fits, is_even, is_float32, loads_per_thread, tile_loader
from .store import gemm_launches, staging_bytes, tile_store

#: Shared-memory row padding (words): fragment reads of 8 rows x 4 k hit 32 banks.
PAD = 8

@dataclass(frozen=True)
class Tf32Config:
    """``wm x wn`` warps, each ``mi x ni`` m16n8k8 tiles; K step ``bk`` (a multiple of 8).

    ``stages``: 0 stages operand tiles through registers into two shared buffers (any
    shape); ``>= 2`` copies them straight into a ring of that many shared buffers with
    ``cp.async`` (``stages - 1`` tiles in flight while one is multiplied; whole tiles of
    16-byte aligned operands only, see :func:`pipelined_fits`).
    """

    wm: int
    wn: int
    mi: int
    ni: int
    bk: int
    stages: int = 0

    @property
    def bm(self) -> int:
        return self.wm * self.mi * 16

    @property
    def bn(self) -> int:
        return self.wn * self.ni * 8

    @property
    def threads(self) -> int:
        return self.wm * self.wn * 32

    def check(self) -> None:
        nt = self.threads
        if self.bk % 8 or (self.bm * self.bk) % nt or (self.bn * self.bk) % nt or self.stages == 1:
            raise ValueError(f"TF32 GEMM: tile {self} does not divide evenly among its {nt} threads")

    def params(self) -> dict:
        return {"bm": self.bm, "bn": self.bn, "bk": self.bk, "wm": self.wm, "wn": self.wn, "mi": self.mi,
                "ni": self.ni, "stages": self.stages}

    @property
    def name(self) -> str:
        return f"tf32_{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}" + (f"_s{self.stages}" if self.stages else "")


#: Configurations offered, best first (tests swap in a one-warp one). A pipelined one is
#: offered only where :func:`pipelined_fits`.
#: Measured on the H200 at 4096^3 (gemm_diag): 256x128 (8 warps of 64x64, 3 stages of K 32)
#: 94.5 TFLOP/s; 128x128 with 4 stages of K 16 67.5; the register-staged 128x128 40.4.
TF32_CONFIGS: tuple[Tf32Config, ...] = (Tf32Config(4, 2, 4, 8, 32, stages=3), Tf32Config(2, 4, 4, 4, 16, stages=4),
                                        Tf32Config(2, 4, 4, 4, 16))


# --------------------------------------------------------------------------- kernel


def _emulated(emulated: bool | None) -> bool:
    return simulated() if emulated is None else bool(emulated)


@functools.lru_cache(maxsize=None)
def register_mainloop(config: Tf32Config, a_k_contiguous: bool, b_k_contiguous: bool, even: bool,
                      emulated: bool | None):
    """The main loop staging tiles through registers into two k-major shared buffers
    (``stages == 0``): the next tile's global loads overlap this tile's MMAs."""
    BM, BN, BK, MI, NI, NT = config.bm, config.bn, config.bk, config.mi, config.ni, config.threads
    LDA, LDB = BM + PAD, BN + PAD
    A_SIZE, B_SIZE = BK * LDA, BK * LDB
    B_AT = 2 * A_SIZE
    A_LOADS, B_LOADS = loads_per_thread(BM, BK, NT), loads_per_thread(BN, BK, NT)
    fetch_a, stash_a = tile_loader(BM, BK, LDA, NT, bool(a_k_contiguous), bool(even))
    fetch_b, stash_b = tile_loader(BN, BK, LDB, NT, bool(b_k_contiguous), bool(even))
    warp_mma = warp_mma_for(MI, NI, (1, LDA), (1, LDB), False, emulated)
    round_a = tf32_rounder(_emulated(emulated), A_LOADS)
    round_b = tf32_rounder(_emulated(emulated), B_LOADS)
    SLICES = tuple(range(0, BK, 8))

    @jit(device=True)
    def mainloop(smem, a, b, ao, bo, sam, sak, sbk, sbn, m0, n0, m, n, k_begin, k_end, tid, lane, wrow, wcol, acc):
        ga = cuda.local.array(A_LOADS, float32)
        gb = cuda.local.array(B_LOADS, float32)
        fetch_a(a, ao, sam, sak, m0, k_begin, m, k_end, tid, ga)
        fetch_b(b, bo, sbn, sbk, n0, k_begin, n, k_end, tid, gb)
        round_a(ga)
        round_b(gb)
        stash_a(ga, smem, 0, tid)
        stash_b(gb, smem, B_AT, tid)
        cuda.syncthreads()
        ktiles = (k_end - k_begin + BK - 1) // BK
        for t in range(ktiles):
            cur = t & 1
            more = t + 1 < ktiles
            if more:
                k_next = k_begin + (t + 1) * BK
                fetch_a(a, ao, sam, sak, m0, k_next, m, k_end, tid, ga)
                fetch_b(b, bo, sbn, sbk, n0, k_next, n, k_end, tid, gb)
            a_off = cur * A_SIZE + wrow
            b_off = B_AT + cur * B_SIZE + wcol
            for ks in literal_unroll(SLICES):
                warp_mma(smem, a_off + ks * LDA, b_off + ks * LDB, lane, acc)
            if more:
                other = 1 - cur
                round_a(ga)
                round_b(gb)
                stash_a(ga, smem, other * A_SIZE, tid)
                stash_b(gb, smem, B_AT + other * B_SIZE, tid)
            cuda.syncthreads()

    return mainloop, 2 * (A_SIZE + B_SIZE)


def pipelined_layout(rows: int, bk: int, k_contiguous: bool) -> tuple[int, int, int]:
    """``(row stride, k stride, floats)`` of one operand tile in a pipeline stage: laid out
    along the operand's contiguous axis (so 16-byte chunks copy straight in), padded so a
    warp's fragment reads hit 32 different banks."""
    if k_contiguous:
        return bk + 4, 1, rows * (bk + 4)
    return 1, rows + PAD, bk * (rows + PAD)


@functools.lru_cache(maxsize=None)
def pipelined_mainloop(config: Tf32Config, a_k_contiguous: bool, b_k_contiguous: bool, emulated: bool | None):
    """The main loop copying whole tiles with ``cp.async`` into a ring of ``config.stages``
    shared buffers (``stages - 1`` in flight), rounding fragments to TF32 as they are read."""
    BM, BN, BK, MI, NI, NT, S = config.bm, config.bn, config.bk, config.mi, config.ni, config.threads, config.stages
    ARS, AKS, A_STAGE = pipelined_layout(BM, BK, a_k_contiguous)
    BRS, BKS, B_STAGE = pipelined_layout(BN, BK, b_k_contiguous)
    B_AT = S * A_STAGE
    copy_a = async_tile_copy(BM, BK, bool(a_k_contiguous), ARS, AKS, NT, _emulated(emulated))
    copy_b = async_tile_copy(BN, BK, bool(b_k_contiguous), BRS, BKS, NT, _emulated(emulated))
    _, commit, wait = async_copy(_emulated(emulated), S - 2)
    _, _, wait_all = async_copy(_emulated(emulated), 0)
    warp_mma = warp_mma_for(MI, NI, (ARS, AKS), (BRS, BKS), True, emulated)
    SLICES = tuple(range(0, BK, 8))

    @jit(device=True)
    def mainloop(smem, a, b, ao, bo, sam, sak, sbk, sbn, m0, n0, m, n, k_begin, k_end, tid, lane, wrow, wcol, acc):
        ktiles = (k_end - k_begin) // BK  # whole tiles: pipelined_fits
        for s in range(S - 1):
            if s < ktiles:
                copy_a(a, ao, sam, sak, m0, k_begin + s * BK, smem, s * A_STAGE, tid)
                copy_b(b, bo, sbn, sbk, n0, k_begin + s * BK, smem, B_AT + s * B_STAGE, tid)
            commit()
        for t in range(ktiles):
            wait()  # this thread's copies of tile t have landed ...
            cuda.syncthreads()  # ... everyone's, and tile t - 1's buffer is free again
            ahead = t + S - 1
            if ahead < ktiles:
                slot = ahead % S
                copy_a(a, ao, sam, sak, m0, k_begin + ahead * BK, smem, slot * A_STAGE, tid)
                copy_b(b, bo, sbn, sbk, n0, k_begin + ahead * BK, smem, B_AT + slot * B_STAGE, tid)
            commit()
            cur = t % S
            a_off = cur * A_STAGE + wrow * ARS
            b_off = B_AT + cur * B_STAGE + wcol * BRS
            for ks in literal_unroll(SLICES):  # unrolled: the next slice's loads overlap this one's MMAs
                warp_mma(smem, a_off + ks * AKS, b_off + ks * BKS, lane, acc)
        wait_all()
        cuda.syncthreads()

    return mainloop, S * (A_STAGE + B_STAGE)


def mainloop_for(config: Tf32Config, a_k_contiguous: bool, b_k_contiguous: bool, even: bool,
                 emulated: bool | None = None):
    """``(mainloop, shared floats)`` of a configuration."""
    if config.stages:
        return pipelined_mainloop(config, bool(a_k_contiguous), bool(b_k_contiguous), emulated)
    return register_mainloop(config, bool(a_k_contiguous), bool(b_k_contiguous), bool(even), emulated)


@functools.lru_cache(maxsize=None)
def tf32_kernel(config: Tf32Config, a_k_contiguous: bool, b_k_contiguous: bool, even: bool, split: bool,
                epilogue_fn, emulated: bool | None = None, vector_fn=None):
    """The TF32 GEMM kernel; arguments, grid and split-K as
    :func:`.simt.simt_kernel`, ``config.threads`` threads."""
    config.check()
    BM, BN, MI, NI, WN, NT = config.bm, config.bn, config.mi, config.ni, config.wn, config.threads
    ACC = MI * NI * 4
    mainloop, _ = mainloop_for(config, a_k_contiguous, b_k_contiguous, even, emulated)
    store_tile = tile_store(BM, BN, NT, bool(even), bool(split), epilogue_fn, vector_fn)
    stage = accumulator_stager(MI, NI, BN)

    def kernel(out, a, b, c, partial, meta, offs, alpha, beta, splits, kchunk, operands):
        smem = cuda.shared.array(0, float32)
        acc = cuda.local.array(ACC, float32)
        m, n, k = meta[M_], meta[N_], meta[K_]
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        wrow = (warp // WN) * (MI * 16)
        wcol = (warp % WN) * (NI * 8)
        n0 = cuda.blockIdx.x * BN
        m0 = cuda.blockIdx.y * BM
        bz = cuda.blockIdx.z
        bi = bz // splits
        z = bz - bi * splits
        k_begin = z * kchunk
        k_end = min(k, k_begin + kchunk)
        for i in range(ACC):
            acc[i] = float32(0)
        mainloop(smem, a, b, offs[bi * OFFS_W], offs[bi * OFFS_W + 1], meta[SAM], meta[SAK], meta[SBK], meta[SBN],
                 m0, n0, m, n, k_begin, k_end, tid, lane, wrow, wcol, acc)

        stage(smem, acc, wrow, wcol, lane)
        cuda.syncthreads()
        store_tile(smem, m0, n0, bi, z, out, partial, c, meta, alpha, beta, operands, tid)

    kernel.__name__ = f"gemm_{config.name}_{'even' if even else 'guarded'}{'_splitk' if split else ''}"
    # No register cap: ~240 registers without one; capped at 128 the fragments spill.
    return jit(kernel, launch_bounds=(NT, 1))


# --------------------------------------------------------------------------- tactics


def pipelined_fits(config: Tf32Config, meta: np.ndarray, offs: np.ndarray) -> bool:
    """Whether the ``cp.async`` pipeline can run a product: whole tiles, and every 16-byte
    chunk of A and B starts on a 16-byte boundary (their strides and batch offsets are
    multiples of 4 elements; the arrays' own alignment is checked at launch)."""
    sam, sak, sbk, sbn = (int(meta[i]) for i in (SAM, SAK, SBK, SBN))
    a_ok = (sak == 1 and sam % 4 == 0) or (sam == 1 and sak % 4 == 0)
    b_ok = (sbk == 1 and sbn % 4 == 0) or (sbn == 1 and sbk % 4 == 0)
    return (is_even(meta, config.bm, config.bn, config.bk) and a_ok and b_ok
            and not np.any(np.asarray(offs).reshape(-1, OFFS_W)[:, :2] % 4))


def tf32_tactic(config: Tf32Config, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue, alpha: float = 1.0,
                beta: float = 0.0, c_index: int | None = None, splits: int = 1,
                emulated: bool | None = None) -> Tactic:
    """One TF32 tensor-core tactic for a planned float32 product (``math="tf32"``).

    ``emulated``: force the scalar warp step (``True``) or the tensor cores (``False``);
    by default the backend decides. The name and parameters are the same either way. A
    pipelined configuration needs :func:`pipelined_fits`; given operand arrays that are
    not 16-byte aligned, it launches the same tile staged through registers instead.
    """
    config.check()
    even = is_even(meta, config.bm, config.bn, config.bk)
    a_kc, b_kc = int(meta[SAK]) == 1, int(meta[SBK]) == 1
    if config.stages and not pipelined_fits(config, meta, offs):
        raise ValueError(f"TF32 GEMM: {config.name} needs whole, 16-byte aligned tiles")

    def kernel_for(split, vector):
        return tf32_kernel(config, a_kc, b_kc, even, split, epilogue.fn, emulated, epilogue.vector if vector else None)

    _, mainloop_floats = mainloop_for(config, a_kc, b_kc, even, emulated)
    launches, workspace_bytes, splits = gemm_launches(
        kernel_for, meta, offs, config.bm, config.bn, config.bk, config.threads,
        staging_bytes(config.bm, config.bn, mainloop_floats), splits, epilogue, alpha, beta, c_index)
    if config.stages:
        fallback = tf32_tactic(dataclasses.replace(config, stages=0), meta, offs, epilogue=epilogue, alpha=alpha,
                               beta=beta, c_index=c_index, splits=splits, emulated=emulated)
        pipelined = launches

        def launches(ins, outs, workspace):
            if aligned(ins[0]) and aligned(ins[1]):
                return pipelined(ins, outs, workspace)
            return fallback.launches(ins, outs, workspace)

    name = config.name + (f"_splitk{splits}" if splits > 1 else "")
    return Tactic(name, launches, {**config.params(), "splits": splits}, workspace_bytes, math="tf32")


def tf32_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                 alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None) -> list[Tactic]:
    """The TF32 tactics valid for a planned product (float32 only), split-K first when the
    output tiles alone cannot fill the GPU."""
    if not is_float32(a_dtype, b_dtype, out_dtype):
        return []
    whole, split = [], []
    for config in TF32_CONFIGS:
        if not fits(meta, config.bm, config.bn) or (config.stages and not pipelined_fits(config, meta, offs)):
            continue
        kw = dict(epilogue=epilogue, alpha=alpha, beta=beta, c_index=c_index)
        whole.append(tf32_tactic(config, meta, offs, **kw))
        splits = choose_splits(meta, config.bm, config.bn, config.bk)
        if splits > 1:
            split.append(tf32_tactic(config, meta, offs, splits=splits, **kw))
    return split + whole
