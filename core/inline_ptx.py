"""Hardware primitives as inline PTX, for kernels that reach past what Numba emits.

Each is an ``@intrinsic`` (``llvmlite.ir.InlineAsm``; ``research/NUMBA_CUDA.md`` section
4) for the GPU target only: the simulator runs no inline PTX, so a kernel using them has a
plain-Numba sibling there. :mod:`plugrt.kernels` re-exports everything here; plugins
import it from there.

- addressing: :func:`element_address` (a generic address for an ``l`` operand),
  :func:`shared_element_address` (a shared array's element as a 32-bit shared-window
  address for an ``r`` operand: one add in the kernel, no ``cvta`` a use),
  :func:`ptx_statement` (one statement ordered like a memory access: fences, commits, waits);
- TF32 tensor cores: :func:`tf32_mma` (``cvt.rna.tf32.f32``, ``mma.sync`` m16n8k8);
- FP16 tensor cores: :func:`f16_mma` (``cvt.rn.f16x2.f32`` packing, ``mma.sync`` m16n8k16
  with float32 accumulators), :func:`ldmatrix` (``ldmatrix`` x1/x2/x4, ``.trans``),
  :func:`async_copy16` (16-byte ``cp.async``, zero-filled, with its commit and wait), both
  on 32-bit shared-window addresses (:func:`shared_address`).

Fragment layouts are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating
point type"; ``g = lane / 4``, ``t = lane % 4``): A (16 x 16, row) in four f16x2 registers,
(row, k) = (g, 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..); B (16 x 8, col)
in two, (k, n) = (2t..2t+1, g), (2t + 8.., g); the float32 accumulators (g, 2t), (g, 2t + 1),
(g + 8, 2t), (g + 8, 2t + 1). The lower-indexed element of a pair is the register's low half.
"""

from __future__ import annotations

import functools


def _element_pointer(context, builder, array_type, array, index_type, index):
    """The LLVM pointer to ``array[index]`` (a 1-D array's data plus the index)."""
    from numba import types

    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [context.cast(builder, index, index_type, types.int64)])


def element_address(context, builder, array_type, array, index_type, index):
    """Inside an ``@intrinsic``'s codegen: the generic address of ``array[index]`` as a
    64-bit integer, the operand inline PTX takes (``l`` constraint) for a memory address."""
    from llvmlite import ir

    return builder.ptrtoint(_element_pointer(context, builder, array_type, array, index_type, index), ir.IntType(64))


def shared_element_address(context, builder, array_type, array, index_type, index):
    """Inside an ``@intrinsic``'s codegen: the shared-window address of ``array[index]`` (a
    ``cuda.shared.array``) as a 32-bit integer (``r`` constraint), for the ``.shared``
    state space. The compiler sees the conversion (``addrspacecast``), so it makes it once
    for the array and each use is an add, where a ``cvta.to.shared`` inside the PTX would
    be made again at every use."""
    from llvmlite import ir

    element = _element_pointer(context, builder, array_type, array, index_type, index)
    shared = builder.addrspacecast(element, ir.PointerType(element.type.pointee, addrspace=3))
    return builder.ptrtoint(shared, ir.IntType(32))


@functools.lru_cache(maxsize=None)
def ptx_statement(ptx: str):
    """An ``@intrinsic`` of no arguments running one inline-PTX statement, ordered like a
    memory access (a fence, a commit or wait of asynchronous copies; GPU target only)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def statement(typingctx):
        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}", side_effect=True), [])
            return context.get_dummy_value()
        return types.void(), codegen

    return statement


# --------------------------------------------------------------------------- TF32


#: The PTX of :func:`tf32_mma` (also what ``ptxas`` checks in the tests).
CVT_TF32_PTX = "cvt.rna.tf32.f32 $0, $1;"
MMA_TF32_PTX = ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")


@functools.lru_cache(maxsize=None)
def tf32_mma():
    """``(to_tf32, mma_m16n8k8)``: TF32 tensor-core primitives as ``@intrinsic`` inline PTX
    (GPU target only; the simulator runs no inline PTX: emulate with ``round_tf32``).

    ``to_tf32(x)`` is ``cvt.rna.tf32.f32`` (float32 in, TF32 value as float32 bits out);
    ``mma_m16n8k8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)`` is one warp's
    ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``, operands TF32 values in float32
    registers in the fragment layout of the PTX ISA, returning the four accumulators.
    """
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)

    @intrinsic
    def to_tf32(typingctx, x):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32]), CVT_TF32_PTX, "=r,f")
            return builder.bitcast(builder.call(asm, [args[0]]), f32)
        return types.float32(types.float32), codegen

    @intrinsic
    def mma_m16n8k8(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        def codegen(context, builder, sig, args):
            out = ir.LiteralStructType([f32] * 4)
            asm = ir.InlineAsm(ir.FunctionType(out, [i32] * 6 + [f32] * 4), MMA_TF32_PTX,
                               "=f,=f,=f,=f," + ",".join(["r"] * 6 + ["f"] * 4))
            operands = [builder.bitcast(v, i32) for v in args[:6]] + list(args[6:])
            result = builder.call(asm, operands)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(result, k) for k in range(4)])
        return types.UniTuple(types.float32, 4)(*([types.float32] * 10)), codegen

    return to_tf32, mma_m16n8k8


# --------------------------------------------------------------------------- FP16


#: The PTX of :func:`f16_mma`: two float32 rounded to FP16 and packed (``$1`` the low
#: half, ``$2`` the high one), and the m16n8k16 product with float32 accumulators.
CVT_F16X2_PTX = "cvt.rn.f16x2.f32 $0, $2, $1;"
MMA_F16_PTX = ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")
#: ``cp.async`` of 16 bytes from global ``$1`` to the shared-window address ``$0``, ``$2``
#: (16 or 0) of them read, the rest zeros.
CP_ASYNC_ZFILL_PTX = "cp.async.cg.shared.global [$0], [$1], 16, $2;"


def ldmatrix_ptx(count: int, trans: bool = False) -> str:
    """``ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16`` into ``$0..``, from the
    shared-window address ``$count``."""
    outs = ", ".join(f"${k}" for k in range(count))
    return f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16 {{{outs}}}, [${count}];"


#: The shared-window address of a generic one (``cvta.to.shared``), 32 bits.
SHARED_ADDRESS_PTX = "{ .reg .u64 sh64; cvta.to.shared.u64 sh64, $1; cvt.u32.u64 $0, sh64; }"


@functools.lru_cache(maxsize=None)
def f16_mma():
    """``(pack_f16x2, mma_m16n8k16)``: FP16 tensor-core primitives (GPU target only).

    ``pack_f16x2(lo, hi)`` rounds two float32 to FP16 (nearest even) and returns them as
    one uint32, ``lo`` in the low half (``cvt.rn.f16x2.f32``); ``mma_m16n8k16(a0, a1, a2,
    a3, b0, b1, c0, c1, c2, c3)`` is one warp's
    ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``: A and B as packed uint32
    registers, float32 accumulators in and out (the layouts in the module doc).
    """
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)

    @intrinsic
    def pack_f16x2(typingctx, lo, hi):
        def codegen(context, builder, sig, args):
            values = [context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args)]
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), CVT_F16X2_PTX, "=r,f,f")
            return builder.call(asm, values)
        return types.uint32(lo, hi), codegen

    @intrinsic
    def mma_m16n8k16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        def codegen(context, builder, sig, args):
            out = ir.LiteralStructType([f32] * 4)
            asm = ir.InlineAsm(ir.FunctionType(out, [i32] * 6 + [f32] * 4), MMA_F16_PTX,
                               "=f,=f,=f,=f," + ",".join(["r"] * 6 + ["f"] * 4))
            operands = ([context.cast(builder, v, t, types.uint32) for v, t in zip(args[:6], sig.args[:6])]
                        + [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:], sig.args[6:])])
            result = builder.call(asm, operands)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(result, k) for k in range(4)])
        return types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), codegen

    return pack_f16x2, mma_m16n8k16


@functools.lru_cache(maxsize=None)
def shared_address():
    """``address(array)``: the 32-bit shared-window address of ``array[0]`` (a shared
    array; GPU target only), the base :func:`ldmatrix` and :func:`async_copy16` add byte
    offsets to (32-bit arithmetic, where generic addresses take 64)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def address(typingctx, array):
        if not isinstance(array, types.Array):
            return None

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.IntType(64)]), SHARED_ADDRESS_PTX, "=r,l")
            return builder.call(asm, [builder.ptrtoint(data, ir.IntType(64))])
        return types.uint32(array), codegen

    return address


@functools.lru_cache(maxsize=None)
def ldmatrix(count: int = 4, trans: bool = False):
    """``load(address)``: one warp's ``ldmatrix`` of ``count`` (1, 2 or 4) 8 x 8 matrices
    of 16-bit elements (GPU target only).

    Lanes ``8m .. 8m + 7`` give the rows of matrix ``m``: this lane's row starts at the
    shared-window ``address`` (:func:`shared_address` plus a byte offset; 16-byte aligned,
    8 contiguous elements). Returns ``count`` uint32: lane ``(g, t)`` gets row ``g``'s
    elements ``2t, 2t + 1`` of each matrix, or with ``trans`` column ``g``'s of rows ``2t,
    2t + 1`` (low half first): an A or B fragment of :func:`f16_mma` from a row-major tile,
    or a B fragment from a tile stored K-major (``.trans``).
    """
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32 = ir.IntType(32)
    ptx = ldmatrix_ptx(count, trans)

    @intrinsic
    def load(typingctx, address):
        if not isinstance(address, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * count), [i32]), ptx,
                               ",".join(["=r"] * count) + ",r,~{memory}", side_effect=True)
            result = builder.call(asm, [context.cast(builder, args[0], sig.args[0], types.uint32)])
            values = [builder.extract_value(result, k) for k in range(count)]
            return context.make_tuple(builder, sig.return_type, values)

        return types.UniTuple(types.uint32, count)(address), codegen

    return load


@functools.lru_cache(maxsize=None)
def async_copy16(pending: int = 0):
    """``(copy16, commit, wait)`` (GPU target only): ``copy16(address, src, j, ok)`` starts
    copying the 16 bytes at ``src[j]`` (global) to the shared-window ``address``
    (:func:`shared_address` plus a byte offset), both 16-byte aligned, or zeros where
    ``ok`` is false (nothing is read then); ``commit()`` closes this thread's group of
    copies; ``wait()`` returns once at most ``pending`` of its groups are in flight (their
    bytes visible to this thread; a barrier makes them the block's)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    @intrinsic
    def copy16(typingctx, address, src, j, ok):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]), CP_ASYNC_ZFILL_PTX,
                               "r,l,r,~{memory}", side_effect=True)
            size = builder.select(context.cast(builder, args[3], sig.args[3], types.boolean),
                                  ir.Constant(i32, 16), ir.Constant(i32, 0))
            builder.call(asm, [context.cast(builder, args[0], sig.args[0], types.uint32),
                               element_address(context, builder, sig.args[1], args[1], sig.args[2], args[2]), size])
            return context.get_dummy_value()
        return types.void(address, src, j, ok), codegen

    return copy16, ptx_statement("cp.async.commit_group;"), ptx_statement(f"cp.async.wait_group {int(pending)};")


__all__ = ["element_address", "shared_element_address", "ptx_statement", "tf32_mma", "CVT_TF32_PTX", "MMA_TF32_PTX", "f16_mma", "shared_address",
           "ldmatrix", "ldmatrix_ptx", "async_copy16", "CVT_F16X2_PTX", "MMA_F16_PTX", "CP_ASYNC_ZFILL_PTX",
           "SHARED_ADDRESS_PTX"]
