"""The Hopper TF32 tactic of MatMul and Gemm: warpgroup MMA (``wgmma.mma_async``, sm_90a).

``mma.sync`` (:mod:`gemm_tf32`) stalls near a quarter of cuBLAS TF32 on the H200: every
warp loads its fragments from shared memory into registers before each MMA. ``wgmma``
reads both operands straight from shared memory through 64-bit matrix descriptors, four
warps (a warpgroup) at a time, asynchronously, with 64 x ``bn`` x 8 per instruction.

A block is ``wgs`` warpgroups stacked along M (``bm = 64 * wgs``) over a ``bn``-column
tile; each warpgroup owns 64 rows, ``bn / 2`` float32 accumulators per thread. Operand
tiles of K 32 are copied with ``cp.async`` into a ring of ``stages`` shared buffers in the
layout ``wgmma`` reads with the 128-byte swizzle: K-major (TF32 ``wgmma`` reads both
operands K-major), a row's 32 floats in one 128-byte line, its 16-byte chunk ``c`` stored
at chunk ``c ^ (row % 8)``; eight rows make one 1024-byte atom. K-contiguous operands copy
16-byte chunks (consecutive threads along a row: coalesced, and conflict-free thanks to
the swizzle); row-contiguous ones (B of a plain MatMul is ``[K, N]``) copy 4-byte
elements, a warp taking 8 rows x 4 k, transposing on the way in. Out-of-range chunks
are zero-filled (``cp.async``'s source size 0), so any M, N and K (K a multiple of 4
for 16-byte chunks) run with no special edge kernels.

Per K tile ``t``: wait for tile ``t``'s copies, ``fence.proxy.async`` (the copies were
generic-proxy writes; ``wgmma`` reads through the async proxy), barrier; issue four
``wgmma`` (K 8 each) and commit; start the copies of tile ``t + stages - 2`` into the
buffer of tile ``t - 2``; wait until only this tile's MMAs are in flight (so tile
``t - 2``'s buffer was free: every warpgroup had finished its MMAs before the barrier).
The tensor cores always have the next group queued. The output tile then goes through
shared memory to the fused
epilogue (:func:`~plugrt_builtin_ops.gemm_simt.tile_store`), as the other GEMM kernels do.

Operands are not rounded: the tensor cores read TF32 from the float32 bits (the low 13
mantissa bits are dropped). In the simulator (no inline PTX, no warpgroup collectives)
:func:`wgmma_emulated` computes each thread's accumulators by scalar FMAs on the same
swizzled shared tiles with the operands truncated the same way, so the copies, the layout
and the epilogue are tested there; the descriptors only on a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import float32, uint32

from plugrt.device import simulated
from plugrt.kernels import Epilogue, aligned, cuda, element_address, jit, ptx_statement
from plugrt.tactic import Tactic
from plugrt_builtin_ops import gemm_simt
from plugrt_builtin_ops.gemm_simt import (
    choose_splits, fits, gemm_launches, is_even, is_float32, staging_bytes, tile_store,
)
from plugrt_builtin_ops.matmul_kernels import K_, M_, N_, OFFS_W, SAK, SAM, SBK, SBN

#: K per stage: one 128-byte swizzle line of float32.
BK = 32
#: ``wgmma`` K per instruction (TF32).
WK = 8
#: Shared memory the ring is aligned to (the 128-byte swizzle's 1024-byte atom), in floats.
ATOM_FLOATS = 256


@dataclass(frozen=True)
class WgmmaConfig:
    """``wgs`` warpgroups of 64 rows each over ``bn`` columns (8 to 256, a multiple of 8),
    ``stages`` shared buffers of K 32: ``stages - 2`` tiles copied ahead while one is
    multiplied and the previous one may still be read by MMAs in flight."""

    wgs: int
    bn: int
    stages: int

    @property
    def bm(self) -> int:
        return 64 * self.wgs

    @property
    def bk(self) -> int:
        return BK

    @property
    def threads(self) -> int:
        return 128 * self.wgs

    @property
    def accumulators(self) -> int:
        return self.bn // 2

    def check(self) -> None:
        if self.wgs < 1 or self.bn % 8 or not 8 <= self.bn <= 256 or self.stages < 3:
            raise ValueError(f"wgmma GEMM: tile {self} is not 1+ warpgroups over 8..256 columns with 3+ stages")

    def params(self) -> dict:
        return {"bm": self.bm, "bn": self.bn, "bk": BK, "wgs": self.wgs, "stages": self.stages}

    @property
    def name(self) -> str:
        return f"wgmma_{self.bm}x{self.bn}x{BK}_s{self.stages}"

    def ring_floats(self) -> int:
        """Shared floats of the ring, plus the slack to align it to an atom."""
        return self.stages * (self.bm + self.bn) * BK + ATOM_FLOATS


#: Configurations offered, best first.
WGMMA_CONFIGS: tuple[WgmmaConfig, ...] = (WgmmaConfig(2, 256, 4), WgmmaConfig(2, 128, 5))


def swizzled(row, k):
    """Float offset of element ``(row, k)`` in a K-major tile of 32-float rows, 128-byte
    swizzle: 16-byte chunk ``k // 4`` of the row at chunk ``(k // 4) ^ (row % 8)``."""
    return row * BK + ((((k >> 2) ^ (row & 7)) << 2) | (k & 3))


swizzled_device = jit(device=True)(swizzled)


# --------------------------------------------------------------------------- inline PTX

#: Descriptor bits besides the start address: 128-byte swizzle (bits 62-63 = 1), 1024 bytes
#: between 8-row groups (stride byte offset, bits 32-45, in 16-byte units), leading byte
#: offset 1 (unused for swizzled K-major layouts).
DESC_BITS = (1 << 62) | ((1024 >> 4) << 32) | (1 << 16)


def _descriptor_ptx(reg: str, operand: str) -> str:
    return (f"cvta.to.shared.u64 {reg}, {operand}; shr.u64 {reg}, {reg}, 4; and.b64 {reg}, {reg}, 16383; "
            f"or.b64 {reg}, {reg}, {DESC_BITS};")


def wgmma_ptx(n: int) -> str:
    """``wgmma.mma_async`` m64n``n``k8 TF32 x TF32 + float32, descriptors built from the
    generic addresses of the operand tiles (operands ``$n/2`` ... see :func:`wgmma_ops`)."""
    acc = n // 2
    regs = ", ".join(f"${i}" for i in range(acc))
    a, b = f"${2 * acc}", f"${2 * acc + 1}"
    return ("{ .reg .u64 da, db; .reg .pred p; " + _descriptor_ptx("da", a) + " " + _descriptor_ptx("db", b)
            + " setp.ne.b32 p, 1, 0; "
            + f"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{regs}}}, da, db, p, 1, 1; }}")


CP_ASYNC16_PTX = ("{ .reg .u64 sh64; .reg .u32 sh32; cvta.to.shared.u64 sh64, $0; cvt.u32.u64 sh32, sh64; "
                  "cp.async.cg.shared.global [sh32], [$1], 16, $2; }")
CP_ASYNC4_PTX = ("{ .reg .u64 sh64; .reg .u32 sh32; cvta.to.shared.u64 sh64, $0; cvt.u32.u64 sh32, sh64; "
                 "cp.async.ca.shared.global [sh32], [$1], 4, $2; }")
SHARED_ADDRESS_PTX = "{ .reg .u64 sh64; cvta.to.shared.u64 sh64, $1; cvt.u32.u64 $0, sh64; }"
FENCE_ASYNC_PTX = "fence.proxy.async.shared::cta;"
WGMMA_FENCE_PTX = "wgmma.fence.sync.aligned;"
WGMMA_COMMIT_PTX = "wgmma.commit_group.sync.aligned;"
WGMMA_WAIT_PTX = "wgmma.wait_group.sync.aligned {};"


@functools.lru_cache(maxsize=None)
def wgmma_ops(n: int):
    """GPU intrinsics: ``(mma, wait, fence, commit, commit_copies, wait_copies, fence_async,
    shared_address)`` (the copies: :func:`copy_ops`).

    - ``mma(acc, smem, a, b)``: one ``wgmma`` m64n``n``k8 with the A tile at ``smem[a]``
      and the B tile at ``smem[b]`` (atom-aligned K-major swizzled), accumulating into the
      local array ``acc`` (``n / 2`` floats, kept in registers: the indices are constant);
    - ``wait(acc, pending)``: ``wgmma.wait_group pending`` (a literal), tied to the
      accumulators so nothing else touches them before the MMAs finish; ``fence()``,
      ``commit()``: ``wgmma.fence`` / ``commit_group``;
    - ``commit_copies()``, ``wait_copies(pending)`` (``pending`` a literal);
    - ``fence_async()``: ``fence.proxy.async.shared::cta``;
    - ``shared_address(smem)``: the shared-window address of ``smem[0]`` (uint32).
    """
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    acc_count = n // 2

    def acc_pointers(context, builder, ty, value):
        data = context.make_array(ty)(context, builder, value).data
        return [builder.gep(data, [ir.Constant(i64, r)]) for r in range(acc_count)]

    def tied(ptx, extra_types, extra_constraints):
        out = ir.LiteralStructType([f32] * acc_count)
        constraints = ",".join(["=f"] * acc_count + [str(r) for r in range(acc_count)] + extra_constraints)
        return ir.InlineAsm(ir.FunctionType(out, [f32] * acc_count + extra_types), ptx,
                            constraints + ",~{memory}", side_effect=True)

    def run_tied(builder, asm, pointers, extra):
        values = [builder.load(p) for p in pointers]
        result = builder.call(asm, values + extra)
        for r, p in enumerate(pointers):
            builder.store(builder.extract_value(result, r), p)

    @intrinsic
    def mma(typingctx, acc, smem, a, b):
        def codegen(context, builder, sig, args):
            asm = tied(wgmma_ptx(n), [i64, i64], ["l", "l"])
            run_tied(builder, asm, acc_pointers(context, builder, sig.args[0], args[0]),
                     [element_address(context, builder, sig.args[1], args[1], sig.args[2], args[2]),
                      element_address(context, builder, sig.args[1], args[1], sig.args[3], args[3])])
            return context.get_dummy_value()
        return types.void(acc, smem, a, b), codegen

    @intrinsic
    def wait(typingctx, acc, pending):
        if not isinstance(pending, types.IntegerLiteral):
            return None
        ptx = WGMMA_WAIT_PTX.format(pending.literal_value)

        def codegen(context, builder, sig, args):
            run_tied(builder, tied(ptx, [], []), acc_pointers(context, builder, sig.args[0], args[0]), [])
            return context.get_dummy_value()
        return types.void(acc, pending), codegen

    @intrinsic
    def wait_copies(typingctx, pending):
        if not isinstance(pending, types.IntegerLiteral):
            return None
        ptx = f"cp.async.wait_group {pending.literal_value};"

        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}", side_effect=True), [])
            return context.get_dummy_value()
        return types.void(pending), codegen

    @intrinsic
    def shared_address(typingctx, smem):
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            asm = ir.InlineAsm(ir.FunctionType(i32, [i64]), SHARED_ADDRESS_PTX, "=r,l")
            return builder.call(asm, [builder.ptrtoint(data, i64)])
        return types.uint32(smem), codegen

    return (mma, wait, ptx_statement(WGMMA_FENCE_PTX), ptx_statement(WGMMA_COMMIT_PTX),
            ptx_statement("cp.async.commit_group;"), wait_copies, ptx_statement(FENCE_ASYNC_PTX), shared_address)


@functools.lru_cache(maxsize=None)
def copy_ops(emulated: bool):
    """``(copy16, copy4)``: ``copy16(dst, i, src, j, ok)`` / ``copy4``: ``cp.async`` of 16 /
    4 bytes from ``src[j]`` to the shared ``dst[i]``, zero-filled when ``ok`` is false (the
    simulator copies at once)."""
    if emulated:
        @jit(device=True)
        def copy16(dst, i, src, j, ok):
            for e in range(4):
                dst[i + e] = src[j + e] if ok else float32(0)

        @jit(device=True)
        def copy4(dst, i, src, j, ok):
            dst[i] = src[j] if ok else float32(0)

        return copy16, copy4

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def copier(ptx):
        @intrinsic
        def copy(typingctx, dst, i, src, j, ok):
            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64, i64, i32]), ptx, "l,l,r,~{memory}",
                                   side_effect=True)
                size = builder.select(context.cast(builder, args[4], sig.args[4], types.boolean),
                                      ir.Constant(i32, 16 if "16" in ptx else 4), ir.Constant(i32, 0))
                builder.call(asm, [element_address(context, builder, sig.args[0], args[0], sig.args[1], args[1]),
                                   element_address(context, builder, sig.args[2], args[2], sig.args[3], args[3]), size])
                return context.get_dummy_value()
            return types.void(dst, i, src, j, ok), codegen
        return copy

    return copier(CP_ASYNC16_PTX), copier(CP_ASYNC4_PTX)


def _truncate(x):
    """float32 to TF32 as the tensor cores read it: the low 13 mantissa bits dropped."""
    box = cuda.local.array(1, float32)
    box[0] = x
    bits = box.view(np.uint32)
    bits[0] = bits[0] & uint32(0xFFFFE000)
    return box[0]


@functools.lru_cache(maxsize=None)
def emulated_ops(n: int):
    """The simulator's versions of :func:`wgmma_ops` (same signatures): ``mma`` does this
    thread's share of the warpgroup's m64n``n``k8 with scalar FMAs (accumulator layout of
    the PTX ISA: warp ``w`` of the group owns rows ``16 w ...``, lane ``(g, t)`` rows
    ``g, g + 8`` and columns ``8 j + 2 t + (0, 1)`` at ``acc[4 j + 2 h + e]``); fences and
    waits do nothing."""
    truncate = jit(device=True)(_truncate)
    COLS = n // 4  # this thread's B columns: 2 per 8

    @jit(device=True)
    def mma(acc, smem, a, b):
        # Operand rows of this thread (2 of A, n / 4 of B) read and truncated once per
        # call: in the simulator each device-function call takes a lock all threads share.
        fa = cuda.local.array((2, WK), float32)
        fb = cuda.local.array((COLS, WK), float32)
        lane = cuda.threadIdx.x & 127
        g = (lane & 31) >> 2
        t = lane & 3
        rows = (lane >> 5) * 16 + g
        # a and b address the tiles at K offset k0 (a multiple of 8) inside their lines;
        # the swizzle is a function of the whole offset, so undo it from the line start.
        k0 = a & (BK - 1)
        a_line = a - k0
        b_line = b - (b & (BK - 1))
        for kk in range(WK):
            k = k0 + kk
            for h in range(2):
                row = rows + 8 * h
                fa[h, kk] = truncate(smem[a_line + row * BK + ((((k >> 2) ^ (row & 7)) << 2) | (k & 3))])
            for c in range(COLS):
                col = 8 * (c >> 1) + 2 * t + (c & 1)
                fb[c, kk] = truncate(smem[b_line + col * BK + ((((k >> 2) ^ (col & 7)) << 2) | (k & 3))])
        for j in range(n // 8):
            for h in range(2):
                for e in range(2):
                    s = acc[4 * j + 2 * h + e]
                    for kk in range(WK):
                        s += fa[h, kk] * fb[2 * j + e, kk]
                    acc[4 * j + 2 * h + e] = s

    @jit(device=True)
    def wait(acc, pending):
        pass

    @jit(device=True)
    def nothing():
        pass

    @jit(device=True)
    def wait_copies(pending):
        pass

    @jit(device=True)
    def shared_address(smem):
        return uint32(0)

    return mma, wait, nothing, nothing, nothing, wait_copies, nothing, shared_address


def ops_for(n: int, emulated: bool):
    return emulated_ops(n) if emulated else wgmma_ops(n)


@functools.lru_cache(maxsize=None)
def block_copier(count: int, size: int, dst_step: int, src_step: int | None, emulated: bool):
    """``copy(dst, i, src, j, step)``: ``count`` ``cp.async`` of ``size`` bytes (16 or 4),
    copy ``c`` from ``src[j + c * s]`` to the shared ``dst[i + c * dst_step]`` (indices in
    floats; ``s`` is ``src_step``, or the runtime ``step`` when that is None). On a GPU it
    is one inline-PTX block: the offsets are immediates (or one add per copy), so a
    thread's whole share of a tile costs about one instruction per copy."""
    if emulated:
        per = size // 4

        @jit(device=True)
        def copy(dst, i, src, j, step):
            s = step if src_step is None else src_step
            for c in range(count):
                for e in range(per):
                    dst[i + c * dst_step + e] = src[j + c * s + e]

        return copy

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i64 = ir.IntType(64)
    cache = "cg" if size == 16 else "ca"
    lines = ["{ .reg .u64 g, t; .reg .u32 s; cvta.to.shared.u64 t, $0; cvt.u32.u64 s, t; mov.u64 g, $1;"]
    for c in range(count):
        if src_step is None:
            lines.append(f"cp.async.{cache}.shared.global [s+{4 * c * dst_step}], [g], {size};")
            if c + 1 < count:
                lines.append("add.s64 g, g, $2;")
        else:
            lines.append(f"cp.async.{cache}.shared.global [s+{4 * c * dst_step}], [g+{4 * c * src_step}], {size};")
    ptx = " ".join(lines) + " }"

    @intrinsic
    def copy(typingctx, dst, i, src, j, step):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64, i64, i64]), ptx, "l,l,l,~{memory}",
                               side_effect=True)
            step_bytes = builder.mul(context.cast(builder, args[4], sig.args[4], types.int64), ir.Constant(i64, 4))
            builder.call(asm, [element_address(context, builder, sig.args[0], args[0], sig.args[1], args[1]),
                               element_address(context, builder, sig.args[2], args[2], sig.args[3], args[3]), step_bytes])
            return context.get_dummy_value()
        return types.void(dst, i, src, j, step), codegen

    return copy


# --------------------------------------------------------------------------- copies


@functools.lru_cache(maxsize=None)
def tile_copier(rows: int, k_contiguous: bool, threads: int, even: bool, emulated: bool):
    """``copy(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid)``: start this
    thread's copies of the operand's ``rows x 32`` tile at ``(row0, k0)`` (element
    ``(r, k)`` at ``src[base + r * srow + k * sk]``) into the swizzled shared tile at
    ``smem[tile]``; elements outside ``nrows x k_end`` become zeros (unless ``even``: whole
    tiles only, no bounds checks).

    K-contiguous (``sk == 1``): thread ``tid`` copies 16-byte chunk ``tid % 8`` of rows
    ``tid // 8 + c * threads / 8``. Row-contiguous (``srow == 1``): warp ``w`` copies
    8 rows x 4 k per step, step ``c`` taking block ``q = w + warps * c`` (k block ``q % 8``,
    row block ``q // 8``); a lane's row is ``lane % 8``, its k ``lane // 8``: 32-byte global
    segments per k, and the swizzle spreads the 32 stores over the 32 banks. Per thread
    everything but ``row0``, ``k0`` and ``c`` is fixed, so the addresses are a few adds.
    """
    copy16, copy4 = copy_ops(emulated)
    if k_contiguous:
        chunks = rows * (BK // 4)
        per_thread = -(-chunks // threads)
        ragged = chunks % threads != 0
        step = threads // 8
        if even and not ragged:
            block = block_copier(per_thread, 16, step * BK, None, emulated)

            @jit(device=True)
            def copy_whole(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid):
                r_t = tid >> 3
                chunk = (((tid & 7) ^ (r_t & 7)) << 2)
                block(smem, tile + r_t * BK + chunk, src, base + (row0 + r_t) * srow + k0 + ((tid & 7) << 2),
                      step * srow)

            return copy_whole

        @jit(device=True)
        def copy(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid):
            r_t = tid >> 3
            kc = (tid & 7) << 2
            chunk = (((tid & 7) ^ (r_t & 7)) << 2)  # the swizzled chunk: step is a multiple of 8
            at = base + (row0 + r_t) * srow + k0 + kc
            for c in range(per_thread):
                r = r_t + c * step
                if not ragged or r < rows:
                    ok = even or (row0 + r < nrows and k0 + kc < k_end)
                    copy16(smem, tile + r * BK + chunk, src, at + c * step * srow if ok else base, ok)

        return copy

    warps = threads // 32
    per_thread = -(-rows // warps)
    ragged = rows % warps != 0
    if even and not ragged and warps % 8 == 0:
        # Then a warp's k block is fixed (w % 8) and copy c is c * warps rows further.
        block = block_copier(per_thread, 4, warps * BK, warps, emulated)

        @jit(device=True)
        def copy_rows_whole(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid):
            lane8 = tid & 7
            kin = (tid >> 3) & 3
            w = tid >> 5
            r = ((w >> 3) << 3) + lane8
            block(smem, tile + r * BK + (((((w & 7) ^ lane8)) << 2) | kin), src,
                  base + row0 + r + (k0 + ((w & 7) << 2) + kin) * sk, 0)

        return copy_rows_whole

    @jit(device=True)
    def copy_rows(src, base, srow, sk, row0, nrows, k0, k_end, smem, tile, tid):
        lane8 = tid & 7
        kin = (tid >> 3) & 3
        w = tid >> 5
        at = base + row0 + lane8 + (k0 + kin) * sk
        for c in range(per_thread):
            q = w + warps * c
            if not ragged or q < rows:
                kb4 = (q & 7) << 2
                r = ((q >> 3) << 3) + lane8
                ok = even or (row0 + r < nrows and k0 + kb4 + kin < k_end)
                dst = tile + r * BK + ((((q & 7) ^ lane8) << 2) | kin)
                copy4(smem, dst, src, at + (r - lane8) + kb4 * sk if ok else base, ok)

    return copy_rows


# --------------------------------------------------------------------------- kernel


@functools.lru_cache(maxsize=None)
def wgmma_kernel(config: WgmmaConfig, a_k_contiguous: bool, b_k_contiguous: bool, even: bool, split: bool,
                 epilogue_fn, emulated: bool | None = None):
    """The wgmma GEMM kernel; arguments, grid and split-K as
    :func:`plugrt_builtin_ops.gemm_simt.simt_kernel`, ``config.threads`` threads."""
    config.check()
    emulated = simulated() if emulated is None else bool(emulated)
    BM, BN, S, NT, ACC = config.bm, config.bn, config.stages, config.threads, config.accumulators
    A_STAGE, B_STAGE = BM * BK, BN * BK
    B_RING = S * A_STAGE
    WG_ROWS = 64 * BK  # floats of one warpgroup's 64 rows of A
    mma, wait, fence, commit, commit_copies, wait_copies, fence_async, shared_address = ops_for(BN, emulated)
    copy_a = tile_copier(BM, bool(a_k_contiguous), NT, bool(even), emulated)
    copy_b = tile_copier(BN, bool(b_k_contiguous), NT, bool(even), emulated)
    store_tile = tile_store(BM, BN, NT, bool(even), bool(split), epilogue_fn)
    AHEAD = S - 2  # tiles copied ahead: one buffer is multiplied, one still read by MMAs in flight
    PENDING = AHEAD - 1

    def kernel(out, a, b, c, partial, meta, offs, alpha, beta, splits, kchunk, operands):
        smem = cuda.shared.array(0, float32)
        acc = cuda.local.array(ACC, float32)
        m, n, k = meta[M_], meta[N_], meta[K_]
        sam, sak, sbk, sbn = meta[SAM], meta[SAK], meta[SBK], meta[SBN]
        tid = cuda.threadIdx.x
        n0 = cuda.blockIdx.x * BN
        m0 = cuda.blockIdx.y * BM
        bz = cuda.blockIdx.z
        bi = bz // splits
        z = bz - bi * splits
        k_begin = z * kchunk
        k_end = min(k, k_begin + kchunk)
        ao, bo = offs[bi * OFFS_W], offs[bi * OFFS_W + 1]
        ring = ((ATOM_FLOATS * 4 - (shared_address(smem) & uint32(ATOM_FLOATS * 4 - 1))) & uint32(ATOM_FLOATS * 4 - 1)) >> 2
        a_ring = ring + (tid >> 7) * WG_ROWS
        b_ring = ring + B_RING
        for i in range(ACC):
            acc[i] = float32(0)

        ktiles = (k_end - k_begin + BK - 1) // BK
        for s in range(AHEAD):
            if s < ktiles:
                kt = k_begin + s * BK
                copy_a(a, ao, sam, sak, m0, m, kt, k_end, smem, ring + s * A_STAGE, tid)
                copy_b(b, bo, sbn, sbk, n0, n, kt, k_end, smem, b_ring + s * B_STAGE, tid)
            commit_copies()
        for t in range(ktiles):
            wait_copies(PENDING)  # this thread's copies of tile t have landed ...
            fence_async()  # ... are visible to the async proxy ...
            cuda.syncthreads()  # ... everyone's; and everyone's MMAs of tile t - 2 are done
            slot = t % S
            a_at = a_ring + slot * A_STAGE
            b_at = b_ring + slot * B_STAGE
            fence()
            mma(acc, smem, a_at, b_at)  # K 32 = four K 8 steps, written out: straight-line
            mma(acc, smem, a_at + 8, b_at + 8)  # code keeps the accumulators in place
            mma(acc, smem, a_at + 16, b_at + 16)
            mma(acc, smem, a_at + 24, b_at + 24)
            commit()
            ahead = t + AHEAD
            if ahead < ktiles:  # into tile t - 2's buffer
                free = ahead % S
                kt = k_begin + ahead * BK
                copy_a(a, ao, sam, sak, m0, m, kt, k_end, smem, ring + free * A_STAGE, tid)
                copy_b(b, bo, sbn, sbk, n0, n, kt, k_end, smem, b_ring + free * B_STAGE, tid)
            commit_copies()
            wait(acc, 1)  # tile t - 1's MMAs are done; tile t's stay in flight
        wait(acc, 0)
        wait_copies(0)
        cuda.syncthreads()

        lane = tid & 31
        row = (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2)
        col = 2 * (lane & 3)
        for j in range(BN // 8):  # unrolled: constant accumulator indices
            smem[row * BN + col + 8 * j] = acc[4 * j]
            smem[row * BN + col + 8 * j + 1] = acc[4 * j + 1]
            smem[(row + 8) * BN + col + 8 * j] = acc[4 * j + 2]
            smem[(row + 8) * BN + col + 8 * j + 1] = acc[4 * j + 3]
        cuda.syncthreads()
        store_tile(smem, m0, n0, bi, z, out, partial, c, meta, alpha, beta, operands, tid)

    kernel.__name__ = f"gemm_{config.name}_{'even' if even else 'guarded'}{'_splitk' if split else ''}"
    return jit(kernel, launch_bounds=(NT, 1))


# --------------------------------------------------------------------------- tactics


def operand_layouts(meta: np.ndarray, offs: np.ndarray) -> tuple[bool, bool] | None:
    """``(a_k_contiguous, b_k_contiguous)`` for the copies, or None when the product does
    not suit them: each operand is K-contiguous with 16-byte chunks (row stride, batch
    offsets and K multiples of 4) or row-contiguous (4-byte copies, any strides)."""
    sam, sak, sbk, sbn, k = (int(meta[i]) for i in (SAM, SAK, SBK, SBN, K_))
    offsets = np.asarray(offs).reshape(-1, OFFS_W)

    def layout(row_stride, k_stride, column):
        if k_stride == 1 and row_stride % 4 == 0 and k % 4 == 0 and not np.any(offsets[:, column] % 4):
            return True
        if row_stride == 1:
            return False
        return None

    a, b = layout(sam, sak, 0), layout(sbn, sbk, 1)
    return None if a is None or b is None else (a, b)


def hopper() -> bool:
    """Whether ``wgmma`` runs here: the simulator (emulated) or a GPU of compute capability 9.0."""
    if simulated():
        return True
    return tuple(cuda.get_current_device().compute_capability) == (9, 0)


def wgmma_tactic(config: WgmmaConfig, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                 alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None, splits: int = 1,
                 emulated: bool | None = None, fallback: Tactic | None = None) -> Tactic:
    """One wgmma tactic for a planned float32 product (``math="tf32"``); the layouts must
    suit it (:func:`operand_layouts`). A K-contiguous operand array that is not 16-byte
    aligned at launch runs ``fallback`` instead (another tactic of the same product)."""
    config.check()
    layouts = operand_layouts(meta, offs)
    if layouts is None:
        raise ValueError(f"wgmma GEMM: operands of strides {meta[[SAM, SAK, SBK, SBN]].tolist()} do not suit {config.name}")
    a_kc, b_kc = layouts
    even = is_even(meta, config.bm, config.bn, BK)

    def kernel_for(split):
        return wgmma_kernel(config, a_kc, b_kc, even, split, epilogue.fn, emulated)

    launches, workspace_bytes, splits = gemm_launches(
        kernel_for, meta, offs, config.bm, config.bn, BK, config.threads,
        staging_bytes(config.bm, config.bn, config.ring_floats()), splits, epilogue, alpha, beta, c_index)
    if (a_kc or b_kc) and fallback is not None:
        direct = launches

        def launches(ins, outs, workspace):
            if (not a_kc or aligned(ins[0])) and (not b_kc or aligned(ins[1])):
                return direct(ins, outs, workspace)
            return fallback.launches(ins, outs, workspace)

        workspace_bytes = max(workspace_bytes, fallback.workspace_bytes)
    name = config.name + (f"_splitk{splits}" if splits > 1 else "")
    return Tactic(name, launches, {**config.params(), "splits": splits}, workspace_bytes, math="tf32")


def wgmma_tactics(a_dtype, b_dtype, out_dtype, meta: np.ndarray, offs: np.ndarray, *, epilogue: Epilogue,
                  alpha: float = 1.0, beta: float = 0.0, c_index: int | None = None) -> list[Tactic]:
    """The wgmma tactics valid for a planned float32 product on a Hopper GPU (or the
    simulator), split-K first when the output tiles alone cannot fill the GPU."""
    if not is_float32(a_dtype, b_dtype, out_dtype) or operand_layouts(meta, offs) is None or not hopper():
        return []
    whole, split = [], []
    kw = dict(epilogue=epilogue, alpha=alpha, beta=beta, c_index=c_index)
    for config in WGMMA_CONFIGS:
        if not fits(meta, config.bm, config.bn):
            continue
        splits = choose_splits(meta, config.bm, config.bn, BK)
        for s in ((splits, 1) if splits > 1 else (1,)):
            fallback = gemm_simt.simt_tactic(gemm_simt.SIMT_CONFIGS[0], meta, offs, splits=s, **kw)
            (split if s > 1 else whole).append(wgmma_tactic(config, meta, offs, splits=s, fallback=fallback, **kw))
    return split + whole
