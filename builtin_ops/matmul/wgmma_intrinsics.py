"""The inline PTX of the wgmma GEMM (:mod:`.wgmma`) as Numba intrinsics, each with the
plain-Numba sibling the simulator runs.

- :func:`wgmma_ops`: ``wgmma.mma_async`` m64nNk8 TF32 (m64nNk16 FP16, m64nNk32 s8/u8 with
  int32 accumulators: the same 32 bytes of K) on matrix descriptors built from the
  operand tiles' shared addresses (128-byte swizzle, K-major), its fences, commits and
  waits, ``cp.async`` group commits and waits, ``fence.proxy.async`` and the shared-window
  address of an array; :func:`emulated_ops` is the simulator's version (same signatures):
  scalar multiply-adds on the same swizzled tiles, operands truncated to TF32 as the
  tensor cores read them (FP16 pairs and 8-bit quadruples unpacked from their words);
- :func:`copy_ops`: 16- and 4-byte ``cp.async`` copies, zero-filled when out of range;
  :func:`block_copier`: a thread's whole share of a tile as one inline-PTX block of copies.

The layout constants they share with the kernel: :data:`BK` (K per 128-byte swizzle line)
and :data:`WK` (K per ``wgmma``).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import float32, int32, uint32

from plugrt.kernels import cuda, element_address, jit, ptx_statement, shared_element_address

#: K per stage: one 128-byte swizzle line of float32.
BK = 32
#: ``wgmma`` K per instruction (TF32).
WK = 8


# --------------------------------------------------------------------------- inline PTX

#: Descriptor bits besides the start address: 128-byte swizzle (bits 62-63 = 1), 1024 bytes
#: between 8-row groups (stride byte offset, bits 32-45, in 16-byte units), leading byte
#: offset 1 (unused for swizzled K-major layouts).
DESC_BITS = (1 << 62) | ((1024 >> 4) << 32) | (1 << 16)


def _descriptor_ptx(reg: str, operand: str) -> str:
    """``reg`` (.u64) the descriptor of the tile at shared-window address ``operand``
    (.u32): its 16-byte units in the low 14 bits (a shared address is below 256 KB: no
    mask), :data:`DESC_BITS` besides (the high word in ``hi``)."""
    low = DESC_BITS & 0xFFFFFFFF
    return f"shr.b32 {reg}l, {operand}, 4; or.b32 {reg}l, {reg}l, {low}; mov.b64 {reg}, {{{reg}l, hi}};"


#: ``int8`` operand types of :func:`wgmma_ptx` (A's, then B's): every s8/u8 pair is an instruction.
INT8_TYPES = ("s8.s8", "u8.s8", "s8.u8", "u8.u8")


def int8_columns_ok(n: int) -> bool:
    """Whether ``wgmma`` has an s8/u8 shape m64n``n``k32: N 8, 16, 24, then multiples of 16."""
    return n in (8, 16, 24) or (n % 16 == 0 and 32 <= n <= 256)


def wgmma_ptx(n: int, half: bool = False, int8: str | None = None) -> str:
    """``wgmma.mma_async`` m64n``n``k8 TF32 x TF32 + float32 (``half``: m64n``n``k16
    FP16 x FP16 + float32; ``int8`` ("s8.s8", "u8.s8", ...): m64n``n``k32 8-bit integers
    + int32, wrapping as the reference's int32 does, no ``.satfinite``; both operands
    K-major: 32 bytes of K every way), descriptors built from the shared-window addresses
    of the operand tiles (operands ``$n/2`` ... see :func:`wgmma_ops`)."""
    acc = n // 2
    regs = ", ".join(f"${i}" for i in range(acc))
    a, b = f"${2 * acc}", f"${2 * acc + 1}"
    if int8 is not None:
        if int8 not in INT8_TYPES or not int8_columns_ok(n):
            raise ValueError(f"wgmma: no integer instruction m64n{n}k32.s32.{int8}")
        shape, tail = f"m64n{n}k32.s32.{int8}", "p"  # integer wgmma takes no scales or transposes
    else:
        shape = f"m64n{n}k16.f32.f16.f16" if half else f"m64n{n}k8.f32.tf32.tf32"
        tail = "p, 1, 1, 0, 0" if half else "p, 1, 1"  # FP16 states the (no) transposes
    return ("{ .reg .u64 da, db; .reg .u32 dal, dbl, hi; .reg .pred p; " + f"mov.b32 hi, {DESC_BITS >> 32}; "
            + _descriptor_ptx("da", a) + " " + _descriptor_ptx("db", b)
            + " setp.ne.b32 p, 1, 0; "
            + f"wgmma.mma_async.sync.aligned.{shape} {{{regs}}}, da, db, {tail}; }}")


CP_ASYNC16_PTX = "cp.async.cg.shared.global [$0], [$1], 16, $2;"  # ($0: a shared-window address)
CP_ASYNC4_PTX = "cp.async.ca.shared.global [$0], [$1], 4, $2;"
SHARED_ADDRESS_PTX = "{ .reg .u64 sh64; cvta.to.shared.u64 sh64, $1; cvt.u32.u64 $0, sh64; }"
FENCE_ASYNC_PTX = "fence.proxy.async.shared::cta;"
WGMMA_FENCE_PTX = "wgmma.fence.sync.aligned;"
WGMMA_COMMIT_PTX = "wgmma.commit_group.sync.aligned;"
WGMMA_WAIT_PTX = "wgmma.wait_group.sync.aligned {};"


@functools.lru_cache(maxsize=None)
def wgmma_ops(n: int, half: bool = False, int8: str | None = None):
    """GPU intrinsics: ``(mma, wait, fence, commit, commit_copies, wait_copies, fence_async,
    shared_address)`` (the copies: :func:`copy_ops`).

    - ``mma(acc, smem, a, b)``: one ``wgmma`` (:func:`wgmma_ptx`) with the A tile at
      ``smem[a]`` and the B tile at ``smem[b]`` (atom-aligned K-major swizzled),
      accumulating into the local array ``acc`` (``n / 2`` float32, int32 with ``int8``,
      kept in registers: the indices are constant);
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
    reg, tie = (i32, "=r") if int8 is not None else (f32, "=f")  # the accumulators' registers

    def acc_pointers(context, builder, ty, value):
        data = context.make_array(ty)(context, builder, value).data
        return [builder.gep(data, [ir.Constant(i64, r)]) for r in range(acc_count)]

    def tied(ptx, extra_types, extra_constraints):
        out = ir.LiteralStructType([reg] * acc_count)
        constraints = ",".join([tie] * acc_count + [str(r) for r in range(acc_count)] + extra_constraints)
        return ir.InlineAsm(ir.FunctionType(out, [reg] * acc_count + extra_types), ptx,
                            constraints + ",~{memory}", side_effect=True)

    def run_tied(builder, asm, pointers, extra):
        values = [builder.load(p) for p in pointers]
        result = builder.call(asm, values + extra)
        for r, p in enumerate(pointers):
            builder.store(builder.extract_value(result, r), p)

    @intrinsic
    def mma(typingctx, acc, smem, a, b):
        def codegen(context, builder, sig, args):
            asm = tied(wgmma_ptx(n, half, int8), [i32, i32], ["r", "r"])
            run_tied(builder, asm, acc_pointers(context, builder, sig.args[0], args[0]),
                     [shared_element_address(context, builder, sig.args[1], args[1], sig.args[2], args[2]),
                      shared_element_address(context, builder, sig.args[1], args[1], sig.args[3], args[3])])
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
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]), ptx, "r,l,r,~{memory}",
                                   side_effect=True)
                size = builder.select(context.cast(builder, args[4], sig.args[4], types.boolean),
                                      ir.Constant(i32, 16 if "16" in ptx else 4), ir.Constant(i32, 0))
                builder.call(asm, [shared_element_address(context, builder, sig.args[0], args[0], sig.args[1], args[1]),
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
def _unpacker(dtype):
    """``unpack(word, out, at)``: the values of a 32-bit word holding two float16 or four
    8-bit integers (``dtype``; lower address first) into ``out[at:]``, as the MMA reads them."""
    per = 4 // np.dtype(dtype).itemsize
    kind = np.dtype(dtype).type

    @jit(device=True)
    def unpack(word, out, at):
        box = cuda.local.array(1, float32)
        box[0] = word
        values = box.view(kind)
        for e in range(per):
            out[at + e] = values[e]

    return unpack


@functools.lru_cache(maxsize=None)
def emulated_ops(n: int, half: bool = False, int8: str | None = None):
    """The simulator's versions of :func:`wgmma_ops` (same signatures): ``mma`` does this
    thread's share of the warpgroup's m64n``n``k8 with scalar FMAs (accumulator layout of
    the PTX ISA: warp ``w`` of the group owns rows ``16 w ...``, lane ``(g, t)`` rows
    ``g, g + 8`` and columns ``8 j + 2 t + (0, 1)`` at ``acc[4 j + 2 h + e]``); fences and
    waits do nothing. ``half``: the tiles hold FP16 pairs, one per 32-bit word, and one
    call is m64n``n``k16 (the same 8 words of K); ``int8``: four 8-bit integers a word
    (A's and B's signedness as named), one call m64n``n``k32 with integer multiply-adds
    into int32 accumulators."""
    if int8 is not None:
        a_type, b_type = (np.int8 if t == "s8" else np.uint8 for t in int8.split("."))
        mma = _emulated_packed_mma(n, _unpacker(a_type), _unpacker(b_type), 4, int32)
        return (mma,) + emulated_ops(n)[1:]
    if half:
        unpack = _unpacker(np.float16)
        return (_emulated_packed_mma(n, unpack, unpack, 2, float32),) + emulated_ops(n)[1:]
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


@functools.lru_cache(maxsize=None)
def _emulated_packed_mma(n: int, unpack_a, unpack_b, per_word: int, value_type):
    """The simulator's ``mma`` on packed words (FP16 pairs, 8-bit quadruples; see
    :func:`emulated_ops`): ``per_word * 8`` values of K a call, multiplied and added up in
    ``value_type`` (float32, or int32 for integers)."""
    COLS = n // 4
    KV = per_word * WK  # values of K a call

    @jit(device=True)
    def mma(acc, smem, a, b):
        fa = cuda.local.array(2 * KV, value_type)
        fb = cuda.local.array(COLS * KV, value_type)
        lane = cuda.threadIdx.x & 127
        g = (lane & 31) >> 2
        t = lane & 3
        rows = (lane >> 5) * 16 + g
        k0 = a & (BK - 1)
        a_line = a - k0
        b_line = b - (b & (BK - 1))
        for kk in range(WK):
            k = k0 + kk
            at = per_word * kk
            for h in range(2):
                row = rows + 8 * h
                unpack_a(smem[a_line + row * BK + ((((k >> 2) ^ (row & 7)) << 2) | (k & 3))], fa, h * KV + at)
            for c in range(COLS):
                col = 8 * (c >> 1) + 2 * t + (c & 1)
                unpack_b(smem[b_line + col * BK + ((((k >> 2) ^ (col & 7)) << 2) | (k & 3))], fb, c * KV + at)
        for j in range(n // 8):
            for h in range(2):
                for e in range(2):
                    s = acc[4 * j + 2 * h + e]
                    for kk in range(KV):
                        s += fa[h * KV + kk] * fb[(2 * j + e) * KV + kk]
                    acc[4 * j + 2 * h + e] = s

    return mma


def ops_for(n: int, emulated: bool, half: bool = False, int8: str | None = None):
    return emulated_ops(n, half, int8) if emulated else wgmma_ops(n, half, int8)


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
    lines = ["{ .reg .u64 g; .reg .u32 s; mov.b32 s, $0; mov.u64 g, $1;"]  # ($0: a shared-window address)
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
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(32), i64, i64]), ptx, "r,l,l,~{memory}",
                               side_effect=True)
            step_bytes = builder.mul(context.cast(builder, args[4], sig.args[4], types.int64), ir.Constant(i64, 4))
            builder.call(asm, [shared_element_address(context, builder, sig.args[0], args[0], sig.args[1], args[1]),
                               element_address(context, builder, sig.args[2], args[2], sig.args[3], args[3]), step_bytes])
            return context.get_dummy_value()
        return types.void(dst, i, src, j, step), codegen

    return copy
