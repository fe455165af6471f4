"""The TF32 tensor-core tactic of MatMul and Gemm (float32 in and out, ``math="tf32"``).

A block of ``wm x wn`` warps computes a ``bm x bn`` output tile, ``bm = wm * mi * 16`` and
``bn = wn * ni * 8``: each warp owns ``mi x ni`` tiles of ``mma.sync.aligned.m16n8k8``
(``.row.col.f32.tf32.tf32.f32``), 4 float32 accumulators per tile and thread. Operand
tiles are staged k-major in two shared buffers exactly as the SIMT SGEMM stages them
(:func:`plugrt_builtin_ops.gemm_simt.tile_loader`: the next tile's global loads overlap the
current tile's math), padded by 8 words so the fragment reads are conflict-free; the output
tile goes through shared memory to the fused epilogue (:func:`~plugrt_builtin_ops.gemm_simt.tile_store`).

The kernel body is the same everywhere; only the warp-level step
``warp_mma(smem, a_off, b_off, lane, acc)`` (one k8 slice of the warp's tile) differs:

- on a GPU, :func:`mma_tensor_core`: fragments loaded from shared memory (the operands
  were rounded with ``cvt.rna.tf32.f32`` once, when staged) and multiplied by ``mma.sync``
  (both inline PTX through ``@intrinsic``, ``research/NUMBA_CUDA.md`` section 4);
- in the simulator (which runs no inline PTX or warp-collective code), :func:`mma_emulated`:
  each thread computes the same accumulator elements (same fragment layout) with scalar
  FMAs on the same shared tiles, operands rounded to TF32 the same way (nearest, ties away).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
from numba import float32

from plugrt.device import simulated
from plugrt.kernels import (
    Epilogue, aligned, cuda, element_address, jit, literal_unroll, ptx_statement, round_tf32, tf32_mma,
)
from plugrt.tactic import Tactic
from plugrt_builtin_ops.gemm_simt import (
    choose_splits, fits, gemm_launches, is_even, is_float32, loads_per_thread, staging_bytes,
    tile_loader, tile_store,
)
from plugrt_builtin_ops.matmul_kernels import K_, M_, N_, OFFS_W, SAK, SAM, SBK, SBN

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


# --------------------------------------------------------------------------- inline PTX


#: One 16-byte ``cp.async`` from global to shared memory; operands are generic addresses.
CP_ASYNC_PTX = ("{ .reg .u64 sh64; .reg .u32 sh32; cvta.to.shared.u64 sh64, $0; cvt.u32.u64 sh32, sh64; "
                "cp.async.cg.shared.global [sh32], [$1], 16; }")


@functools.lru_cache(maxsize=None)
def async_copy(emulated: bool, pending: int):
    """``(copy16, commit, wait)``: ``copy16(dst, i, src, j)`` starts copying ``src[j:j + 4]``
    to the shared ``dst[i:i + 4]`` (16 bytes, both aligned); ``commit()`` closes this
    thread's group of copies; ``wait()`` returns once at most ``pending`` groups are still
    in flight. The simulator copies at once (its ``commit`` and ``wait`` do nothing)."""
    if emulated:
        @jit(device=True)
        def copy16(dst, i, src, j):
            for e in range(4):
                dst[i + e] = src[j + e]

        @jit(device=True)
        def nothing():
            pass

        return copy16, nothing, nothing

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i64 = ir.IntType(64)

    @intrinsic
    def copy16(typingctx, dst, i, src, j):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64, i64]), CP_ASYNC_PTX, "l,l,~{memory}",
                               side_effect=True)
            builder.call(asm, [element_address(context, builder, sig.args[0], args[0], sig.args[1], args[1]),
                               element_address(context, builder, sig.args[2], args[2], sig.args[3], args[3])])
            return context.get_dummy_value()
        return types.void(dst, i, src, j), codegen

    return copy16, ptx_statement("cp.async.commit_group;"), ptx_statement(f"cp.async.wait_group {pending};")


def _ldmatrix_ptx(count: int) -> str:
    outs = ", ".join(f"${k}" for k in range(count))
    return ("{ .reg .u64 sh64; .reg .u32 sh32; "
            f"cvta.to.shared.u64 sh64, ${count}; cvt.u32.u64 sh32, sh64; "
            f"ldmatrix.sync.aligned.m8n8.x{count}.shared.b16 {{{outs}}}, [sh32]; }}")


#: ``ldmatrix`` of four (two) 8x8 b16 matrices, i.e. 8 rows x 4 float32 each: every lane
#: gives the generic address of one row and receives its (lane / 4, lane % 4) element of
#: each matrix, exactly the m16n8k8 TF32 fragment layout for operands stored K-contiguous.
LDMATRIX_X4_PTX = _ldmatrix_ptx(4)
LDMATRIX_X2_PTX = _ldmatrix_ptx(2)


@functools.lru_cache(maxsize=None)
def _ldmatrix():
    """``(ldmatrix_x4, ldmatrix_x2)``: ``ldmatrix_xN(smem, index)`` with this lane's row at
    ``smem[index]`` (16-byte aligned); returns N float32 (GPU target only)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)

    def make(count, ptx):
        @intrinsic
        def ldmatrix(typingctx, array, index):
            def codegen(context, builder, sig, args):
                address = element_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * count), [i64]), ptx,
                                   ",".join(["=r"] * count) + ",l,~{memory}", side_effect=True)
                result = builder.call(asm, [address])
                items = [builder.bitcast(builder.extract_value(result, k), f32) for k in range(count)]
                return context.make_tuple(builder, sig.return_type, items)
            return types.UniTuple(types.float32, count)(array, index), codegen
        return ldmatrix

    return make(4, LDMATRIX_X4_PTX), make(2, LDMATRIX_X2_PTX)


@functools.lru_cache(maxsize=None)
def async_tile_copy(rows: int, bk: int, k_contiguous: bool, rs: int, ks: int, threads: int, emulated: bool):
    """``copy(src, base, srow, sk, row0, k0, smem, offset, tid)``: start this thread's
    16-byte copies of one operand's ``rows x bk`` tile into ``smem[offset + row * rs + k * ks]``.

    A chunk is 4 elements along the operand's contiguous axis (K when ``k_contiguous``,
    else the rows), which is also the unit-stride axis of its shared layout; consecutive
    threads take consecutive chunks, so the global reads coalesce.
    """
    copy16, _, _ = async_copy(emulated, 0)
    chunks = rows * bk // 4
    per_thread = -(-chunks // threads)
    ragged = chunks % threads != 0
    across = bk // 4 if k_contiguous else rows // 4  # chunks along the contiguous axis

    @jit(device=True)
    def copy(src, base, srow, sk, row0, k0, smem, offset, tid):
        for c in range(per_thread):
            e = tid + c * threads
            if not ragged or e < chunks:
                outer = e // across
                inner = (e - outer * across) * 4
                if k_contiguous:
                    copy16(smem, offset + outer * rs + inner, src, base + (row0 + outer) * srow + k0 + inner)
                else:
                    copy16(smem, offset + inner + outer * ks, src, base + row0 + inner + (k0 + outer) * sk)

    return copy


# --------------------------------------------------------------------------- warp MMA steps
#
# Fragment layout of m16n8k8 (g = lane / 4, t = lane % 4): A holds (g, t), (g + 8, t),
# (g, t + 4), (g + 8, t + 4); B holds (k t, n g), (k t + 4, n g); the accumulators are
# (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). Tile (i, j) keeps its four at
# acc[(i * ni + j) * 4 + 0..3]. Shared tiles are k-major: A at a_off + k * lda + row.


@functools.lru_cache(maxsize=None)
def mma_tensor_core(mi: int, ni: int, ars: int, aks: int, brs: int, bks: int, round_loads: bool):
    """The GPU warp step: load fragments, round them to TF32 when ``round_loads`` (else they
    were rounded when staged), ``mma.sync`` per tile. A's element (row, k) of the warp's
    slice is ``smem[a_off + row * ars + k * aks]``, B's (col, k) ``smem[b_off + col * brs + k * bks]``."""
    to_tf32, mma = tf32_mma()
    fa_len, fb_len = 4 * mi, 2 * ni
    # Unsigned shared-memory indices: no negative-index wraparound code per fragment load.
    U = np.uint64
    UARS, UAKS, UBRS, UBKS = U(ars), U(aks), U(brs), U(bks)
    A_ROW8, A_K4, B_K4 = U(8 * ars), U(4 * aks), U(4 * bks)

    @jit(device=True)
    def load(smem, p):
        return to_tf32(smem[p]) if round_loads else smem[p]

    # K-contiguous operands (k stride 1) are read with ldmatrix: lane l addresses row
    # l % 8 (+ 8 for A's matrices 1 and 3) at k offset 4 * (matrix // 2) (A) or 4 * matrix (B).
    A_MATRIX, B_MATRIX = aks == 1, bks == 1
    ldmatrix_x4, ldmatrix_x2 = _ldmatrix() if A_MATRIX or B_MATRIX else (None, None)

    @jit(device=True)
    def warp_mma(smem, a_off, b_off, lane, acc):
        fa = cuda.local.array(fa_len, float32)
        fb = cuda.local.array(fb_len, float32)
        g = U(lane >> 2)
        t = U(lane & 3)
        r8 = U(lane & 7)
        matrix = U(lane >> 3)
        if A_MATRIX:
            a_lane = U(a_off) + (r8 + (matrix & U(1)) * U(8)) * UARS + (matrix >> U(1)) * U(4)
            for i in range(mi):
                v = ldmatrix_x4(smem, a_lane + U(i * 16 * ars))
                fa[4 * i] = to_tf32(v[0])
                fa[4 * i + 1] = to_tf32(v[1])
                fa[4 * i + 2] = to_tf32(v[2])
                fa[4 * i + 3] = to_tf32(v[3])
        else:
            a_lane = U(a_off) + g * UARS + t * UAKS
            for i in range(mi):
                p = a_lane + U(i * 16 * ars)
                fa[4 * i] = load(smem, p)
                fa[4 * i + 1] = load(smem, p + A_ROW8)
                fa[4 * i + 2] = load(smem, p + A_K4)
                fa[4 * i + 3] = load(smem, p + A_ROW8 + A_K4)
        if B_MATRIX:
            b_lane = U(b_off) + r8 * UBRS + (matrix & U(1)) * U(4)
            for j in range(ni):
                w = ldmatrix_x2(smem, b_lane + U(j * 8 * brs))
                fb[2 * j] = to_tf32(w[0])
                fb[2 * j + 1] = to_tf32(w[1])
        else:
            b_lane = U(b_off) + g * UBRS + t * UBKS
            for j in range(ni):
                q = b_lane + U(j * 8 * brs)
                fb[2 * j] = load(smem, q)
                fb[2 * j + 1] = load(smem, q + B_K4)
        for i in range(mi):
            for j in range(ni):
                base = (i * ni + j) * 4
                d = mma(fa[4 * i], fa[4 * i + 1], fa[4 * i + 2], fa[4 * i + 3], fb[2 * j], fb[2 * j + 1],
                        acc[base], acc[base + 1], acc[base + 2], acc[base + 3])
                acc[base] = d[0]
                acc[base + 1] = d[1]
                acc[base + 2] = d[2]
                acc[base + 3] = d[3]

    return warp_mma


@functools.lru_cache(maxsize=None)
def mma_emulated(mi: int, ni: int, ars: int, aks: int, brs: int, bks: int, round_loads: bool = True):
    """The simulator's warp step: this thread's accumulators of every tile, by scalar FMAs
    on TF32-rounded operands (no cross-lane data needed); layouts as :func:`mma_tensor_core`.

    The thread's operand rows and columns of the k8 slice are read (and rounded, unless
    they were rounded when staged) once into local arrays: in the simulator every device
    function call takes a lock shared by all threads, and a call per FMA made 256-thread
    blocks crawl."""
    RA, RB = 2 * mi, 2 * ni

    @jit(device=True)
    def warp_mma(smem, a_off, b_off, lane, acc):
        fa = cuda.local.array((RA, 8), float32)  # row i * 16 + g + 8 * half at [2 i + half]
        fb = cuda.local.array((RB, 8), float32)  # column j * 8 + 2 t + e at [2 j + e]
        g = lane >> 2
        t = lane & 3
        for r in range(RA):
            row = a_off + ((r >> 1) * 16 + g + 8 * (r & 1)) * ars
            for kk in range(8):
                v = smem[row + kk * aks]
                fa[r, kk] = round_tf32(v) if round_loads else v
        for c in range(RB):
            col = b_off + ((c >> 1) * 8 + 2 * t + (c & 1)) * brs
            for kk in range(8):
                v = smem[col + kk * bks]
                fb[c, kk] = round_tf32(v) if round_loads else v
        for i in range(mi):
            for j in range(ni):
                base = (i * ni + j) * 4
                for half in range(2):
                    for e in range(2):
                        s = acc[base + 2 * half + e]
                        for kk in range(8):
                            s += fa[2 * i + half, kk] * fb[2 * j + e, kk]
                        acc[base + 2 * half + e] = s

    return warp_mma


@functools.lru_cache(maxsize=None)
def tf32_rounder(emulated: bool, count: int):
    """``round_all(regs)``: round ``count`` staged operands to TF32 in place, once per
    block before they go to shared memory (``cvt.rna`` on a GPU), rather than once per
    fragment read."""
    to_tf32 = round_tf32 if emulated else tf32_mma()[0]

    @jit(device=True)
    def round_all(regs):
        for r in range(count):
            regs[r] = to_tf32(regs[r])

    return round_all


def warp_mma_for(mi: int, ni: int, a_strides: tuple[int, int], b_strides: tuple[int, int], round_loads: bool,
                 emulated: bool | None = None):
    """The warp step for this backend: tensor cores on a GPU, scalar FMAs in the simulator.
    ``a_strides``/``b_strides``: the shared layout's (row, k) strides of each operand."""
    emulated = simulated() if emulated is None else emulated
    if emulated:
        return mma_emulated(mi, ni, *a_strides, *b_strides, bool(round_loads))
    return mma_tensor_core(mi, ni, *a_strides, *b_strides, round_loads)


@functools.lru_cache(maxsize=None)
def accumulator_stager(mi: int, ni: int, bn: int):
    """``stage(smem, acc, wrow, wcol, lane)``: a warp's ``mi x ni`` m16n8 accumulator tiles
    into the row-major ``bn``-column output tile in ``smem`` (accumulator ``a`` of tile
    ``(i, j)`` holds row ``g`` (+ 8 for ``a >= 2``), column ``2 t`` (+ 1 for odd ``a``));
    the loops unroll, so ``acc``'s indices stay constant and it stays in registers."""

    @jit(device=True)
    def stage(smem, acc, wrow, wcol, lane):
        g = lane >> 2
        t4 = lane & 3
        for i in range(mi):
            for j in range(ni):
                base = (i * ni + j) * 4
                row = wrow + i * 16 + g
                col = wcol + j * 8 + 2 * t4
                smem[row * bn + col] = acc[base]
                smem[row * bn + col + 1] = acc[base + 1]
                smem[(row + 8) * bn + col] = acc[base + 2]
                smem[(row + 8) * bn + col + 1] = acc[base + 3]

    return stage


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
                epilogue_fn, emulated: bool | None = None):
    """The TF32 GEMM kernel; arguments, grid and split-K as
    :func:`plugrt_builtin_ops.gemm_simt.simt_kernel`, ``config.threads`` threads."""
    config.check()
    BM, BN, MI, NI, WN, NT = config.bm, config.bn, config.mi, config.ni, config.wn, config.threads
    ACC = MI * NI * 4
    mainloop, _ = mainloop_for(config, a_k_contiguous, b_k_contiguous, even, emulated)
    store_tile = tile_store(BM, BN, NT, bool(even), bool(split), epilogue_fn)
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

    def kernel_for(split):
        return tf32_kernel(config, a_kc, b_kc, even, split, epilogue.fn, emulated)

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
