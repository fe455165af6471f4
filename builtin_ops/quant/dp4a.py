"""Four-way byte dot products: ``dp4a`` as inline PTX on the GPU, plain Numba in the simulator.

:func:`dot4` returns ``dot(a, b, c)``: ``c`` plus the sum of the products of the four
bytes packed in ``a`` and ``b`` (each read as int8 or uint8), in wrapping int32 — one
``dp4a.{s32|u32}.{s32|u32}`` instruction on the GPU (sm_61 and later). The CUDA simulator
runs no inline PTX, so there the same function unpacks the bytes (the plain sibling).
:func:`pack4` packs four int8/uint8 values (their low bytes) into one uint32, first in the
lowest byte, as the integer kernels stage their operands.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import jit, simulated

#: Four bytes of 1: ``dot(a, ONES, 0)`` sums ``a``'s bytes.
ONES = np.uint32(0x01010101)


def dp4a_ptx(a_signed: bool, b_signed: bool) -> str:
    """The instruction :func:`dot4` emits for operands of that signedness."""
    return f"dp4a.{'s32' if a_signed else 'u32'}.{'s32' if b_signed else 'u32'} $0, $1, $2, $3;"


@jit(device=True)
def pack4(b0, b1, b2, b3):
    """Four values' low bytes as one uint32, ``b0`` lowest."""
    word = ((np.int64(b0) & 0xFF) | ((np.int64(b1) & 0xFF) << 8) | ((np.int64(b2) & 0xFF) << 16)
            | ((np.int64(b3) & 0xFF) << 24))
    return np.uint32(word)


@functools.lru_cache(maxsize=None)
def _byte(signed: bool):
    """Byte ``k`` of a packed word as an int64, sign-extended when ``signed``."""

    @jit(device=True)
    def byte(word, k):
        v = (np.int64(word) >> (8 * k)) & 0xFF
        if signed and v >= 128:
            return v - 256
        return v

    return byte


@functools.lru_cache(maxsize=None)
def dot4(a_signed: bool, b_signed: bool):
    """``dot(a, b, c) -> int32``: ``c + sum_k byte_k(a) * byte_k(b)`` (wrapping), ``a`` and
    ``b`` packed uint32 words of int8 (``*_signed``) or uint8 bytes."""
    if simulated():
        byte_a, byte_b = _byte(a_signed), _byte(b_signed)

        @jit(device=True)
        def dot_plain(a, b, c):
            total = np.int64(c)
            for k in range(4):
                total += byte_a(a, k) * byte_b(b, k)
            return np.int32(((total + 2**31) % 2**32) - 2**31)

        return dot_plain

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32 = ir.IntType(32)
    ptx = dp4a_ptx(a_signed, b_signed)

    @intrinsic
    def dot_ptx(typingctx, a, b, c):
        if not all(isinstance(t, types.Integer) for t in (a, b, c)):
            return None

        def codegen(context, builder, sig, args):
            operands = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:2], sig.args[:2])]
            operands.append(context.cast(builder, args[2], sig.args[2], types.int32))
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32] * 3), ptx, "=r,r,r,r")
            return builder.call(asm, operands)

        return types.int32(a, b, c), codegen

    return dot_ptx
