"""The warp steps and tile copies of the FP16 tensor-core attention kernel
(:mod:`.tensor_cores_f16`), each in two forms with the same signatures.

- On a GPU: ``mma.sync`` m16n8k16, ``ldmatrix`` (``.trans`` for V), ``cvt.rn.f16x2.f32``
  and ``cp.async`` (:mod:`plugrt.kernels`' inline PTX), quad reductions by ``shfl.xor``.
- In the simulator, which runs neither inline PTX nor warp shuffles: the same register
  traffic through shared memory. Each lane publishes what the instruction would take
  from it (its fragment registers, unpacked to float32; its ``ldmatrix`` row address; its
  partial maximum) in its warp's exchange area (``scr[me : me + EXCHANGE_WORDS]``, float32
  words past the kernel's tiles), the block synchronizes, and each lane computes its own
  results from what the others published: its accumulator elements by scalar FMAs on the
  same FP16 operands, its ``ldmatrix`` halves from the published rows. So the simulator
  checks the kernel's fragment bookkeeping (which lane holds which element, the S
  accumulators reused as P's A fragments), not just its arithmetic. Every emulated step
  synchronizes the block: the kernel calls them the same number of times in every thread.

The exchanging steps (the product, ``ldmatrix``, the quad reductions) take ``(scr, me,
lane)`` (the exchange area and this lane), which the GPU form ignores. Shared memory is addressed by bytes from ``base(smem)``: the 32-bit shared window
on a GPU, 0 in the simulator (where a half's index is its address over 2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import float32, types, uint32

from plugrt.kernels import async_copy16, cuda, f16_mma, jit, ldmatrix, shared_address

#: float32 words of one warp's exchange area in the simulator: 32 lanes x 12 fragment halves.
EXCHANGE_WORDS = 32 * 12
#: Every lane of the warp takes part in a shuffle.
FULL_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class WarpSteps:
    """The steps (device functions), see the module doc:

    - ``pack(lo, hi)``: two float32 rounded to FP16 in one uint32 (``lo`` the low half);
    - ``mma(scr, me, lane, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)``: the m16n8k16 product
      plus the accumulators, returning the four new ones;
    - ``base(smem)``: the address of ``smem[0]`` (float16 shared memory);
    - ``ldsm(smem, address, scr, me, lane)`` / ``ldsm_t``: ``ldmatrix`` x4 (``.trans``),
      this lane's row at ``address``;
    - ``quad_max(scr, me, lane, x)`` / ``quad_sum``: over the four lanes ``4g .. 4g + 3``;
    - ``copy16(smem, address, src, j, ok)``, ``commit()``, ``wait()``: ``src[j : j + 8]``
      (global) to ``address`` (zeros where not ``ok``), asynchronous on a GPU;
    - ``store2(out, i, lo, hi)``: ``out[i], out[i + 1] = lo, hi`` (float16 ``out``; one
      4-byte store on a GPU, ``i`` even and the data 4-byte aligned).
    """

    base: Callable
    pack: Callable
    mma: Callable
    ldsm: Callable
    ldsm_t: Callable
    quad_max: Callable
    quad_sum: Callable
    copy16: Callable
    commit: Callable
    wait: Callable
    store2: Callable


@functools.lru_cache(maxsize=None)
def warp_steps(emulated: bool) -> WarpSteps:
    """The GPU's steps, or (``emulated``) the simulator's."""
    return _emulated_steps() if emulated else _gpu_steps()


def _gpu_steps() -> WarpSteps:
    pack, mma16816 = f16_mma()
    load_x4, load_x4_t = ldmatrix(4, False), ldmatrix(4, True)
    copy_async, commit, wait = async_copy16(0)
    store_pair = _pair_store()
    base = shared_address()

    @jit(device=True)
    def mma(scr, me, lane, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return mma16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

    @jit(device=True)
    def ldsm(smem, address, scr, me, lane):
        return load_x4(address)

    @jit(device=True)
    def ldsm_t(smem, address, scr, me, lane):
        return load_x4_t(address)

    @jit(device=True)
    def copy16(smem, address, src, j, ok):
        copy_async(address, src, j, ok)

    @jit(device=True)
    def quad_max(scr, me, lane, x):
        x = max(x, cuda.shfl_xor_sync(FULL_MASK, x, 1))
        return max(x, cuda.shfl_xor_sync(FULL_MASK, x, 2))

    @jit(device=True)
    def quad_sum(scr, me, lane, x):
        x += cuda.shfl_xor_sync(FULL_MASK, x, 1)
        return x + cuda.shfl_xor_sync(FULL_MASK, x, 2)

    @jit(device=True)
    def store2(out, i, lo, hi):
        store_pair(out, i, pack(lo, hi))

    return WarpSteps(base, pack, mma, ldsm, ldsm_t, quad_max, quad_sum, copy16, commit, wait, store2)


def _pair_store():
    """``store(out, i, packed)``: the uint32 ``packed`` to the 4 bytes at ``out[i]`` (one
    ``st.b32``; plain LLVM, no inline PTX)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def store(typingctx, out, i, packed):
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            offset = context.cast(builder, args[1], sig.args[1], types.int64)
            pointer = builder.bitcast(builder.gep(data, [offset]), ir.PointerType(ir.IntType(32)))
            builder.store(context.cast(builder, args[2], sig.args[2], types.uint32), pointer, align=4)
            return context.get_dummy_value()
        return types.void(out, i, packed), codegen

    return store


def _emulated_steps() -> WarpSteps:
    zero = float32(0.0)

    @jit(device=True)
    def pack(lo, hi):
        box = cuda.local.array(2, types.float16)
        box[0] = lo
        box[1] = hi
        return box.view(np.uint32)[0]

    @jit(device=True)
    def unpack(word):
        box = cuda.local.array(1, uint32)
        box[0] = word
        halves = box.view(np.float16)
        return float32(halves[0]), float32(halves[1])

    @jit(device=True)
    def mma(scr, me, lane, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        own = me + lane * 12
        registers = (a0, a1, a2, a3, b0, b1)
        for r in range(6):
            scr[own + 2 * r], scr[own + 2 * r + 1] = unpack(registers[r])
        cuda.syncthreads()
        g = lane // 4
        t = lane % 4
        d0, d1, d2, d3 = c0, c1, c2, c3
        for k in range(16):
            # A(row, k) sits with lane 4 (row % 8) + (k % 8) / 2, register 2 (k / 8) + row / 8;
            # B(k, n) with lane 4 n + (k % 8) / 2, register 4 + k / 8; k % 2 the half.
            a = me + (g * 4 + (k % 8) // 2) * 12 + 4 * (k // 8) + k % 2
            b = me + (8 * t + (k % 8) // 2) * 12 + 8 + 2 * (k // 8) + k % 2
            top, bottom, left, right = scr[a], scr[a + 2], scr[b], scr[b + 48]
            d0 += top * left
            d1 += top * right
            d2 += bottom * left
            d3 += bottom * right
        cuda.syncthreads()
        return d0, d1, d2, d3

    @jit(device=True)
    def base(smem):
        return 0

    def loader(trans: bool):
        @jit(device=True)
        def ldsm(smem, address, scr, me, lane):
            scr[me + lane] = float32(address // 2)  # exact: shared indices are far below 2**24
            cuda.syncthreads()
            g = lane // 4
            t = lane % 4
            words = cuda.local.array(4, uint32)
            for m in range(4):
                if trans:  # column g of the rows 2t, 2t + 1
                    first, second = int(scr[me + 8 * m + 2 * t]), int(scr[me + 8 * m + 2 * t + 1])
                    words[m] = pack(smem[first + g], smem[second + g])
                else:      # elements 2t, 2t + 1 of row g
                    row = int(scr[me + 8 * m + g])
                    words[m] = pack(smem[row + 2 * t], smem[row + 2 * t + 1])
            cuda.syncthreads()
            return words[0], words[1], words[2], words[3]
        return ldsm

    @jit(device=True)
    def quad_max(scr, me, lane, x):
        scr[me + lane] = x
        cuda.syncthreads()
        first = me + (lane // 4) * 4
        peak = max(max(scr[first], scr[first + 1]), max(scr[first + 2], scr[first + 3]))
        cuda.syncthreads()
        return peak

    @jit(device=True)
    def quad_sum(scr, me, lane, x):
        scr[me + lane] = x
        cuda.syncthreads()
        first = me + (lane // 4) * 4
        total = (scr[first] + scr[first + 1]) + (scr[first + 2] + scr[first + 3])
        cuda.syncthreads()
        return total

    @jit(device=True)
    def copy16(smem, address, src, j, ok):
        for e in range(8):
            smem[address // 2 + e] = src[j + e] if ok else zero

    @jit(device=True)
    def nothing():
        pass

    @jit(device=True)
    def store2(out, i, lo, hi):
        out[i] = lo
        out[i + 1] = hi

    return WarpSteps(base, pack, mma, loader(False), loader(True), quad_max, quad_sum, copy16, nothing, nothing,
                     store2)


# --------------------------------------------------------------------------- tile copies


@functools.lru_cache(maxsize=None)
def tile_copier(rows: int, cols: int, width: int, pitch: int, threads: int, vector: bool, steps: WarpSteps):
    """``copy(smem, sbase, src, base, stride, count, at, tid)``: ``rows`` rows of ``cols``
    halves of ``src`` (``stride`` apart from ``base``; rows from ``count`` on read as zeros)
    to ``smem[at + r * pitch + c]`` (``sbase``: ``steps.base(smem)``). ``vector``: 16-byte
    copies (asynchronous on a GPU: commit and wait with ``steps``; ``cols`` a multiple of
    8), the pad columns ``cols .. width`` left alone (see :func:`pad_zeroer`); else element
    copies that zero the pad columns too. Consecutive threads take consecutive chunks of a
    row (coalesced reads); where the chunks of a row divide the block, each thread keeps its
    column and steps over rows (one address to advance)."""
    zero = float32(0.0)
    copy16 = steps.copy16
    if vector and threads % (cols // 8) == 0:
        chunks = cols // 8
        step = threads // chunks
        per_thread = -(-rows // step)
        ragged = rows % step != 0

        @jit(device=True)
        def copy(smem, sbase, src, base, stride, count, at, tid):
            r = tid // chunks
            c = (tid % chunks) * 8
            address = sbase + 2 * (at + r * pitch + c)
            source = base + r * stride + c
            for u in range(per_thread):
                row = r + u * step
                if not ragged or row < rows:
                    ok = row < count
                    copy16(smem, address + 2 * u * step * pitch, src, source + u * step * stride if ok else base, ok)

        return copy

    if vector:
        chunks = cols // 8
        total = rows * chunks
        per_thread = -(-total // threads)
        ragged = total % threads != 0

        @jit(device=True)
        def copy(smem, sbase, src, base, stride, count, at, tid):
            for u in range(per_thread):
                e = tid + u * threads
                if not ragged or e < total:
                    r = e // chunks
                    c = (e - r * chunks) * 8
                    ok = r < count
                    copy16(smem, sbase + 2 * (at + r * pitch + c), src, base + r * stride + c if ok else base, ok)

        return copy

    @jit(device=True)
    def copy(smem, sbase, src, base, stride, count, at, tid):
        for e in range(tid, rows * width, threads):
            r = e // width
            c = e - r * width
            value = zero
            if c < cols and r < count:
                value = float32(src[base + r * stride + c])
            smem[at + r * pitch + c] = value

    return copy


@functools.lru_cache(maxsize=None)
def pad_zeroer(rows: int, first: int, width: int, pitch: int, threads: int):
    """``zero(smem, at, tid)``: columns ``first .. width`` of ``rows`` rows at ``smem[at]``
    set to zero (once per kernel: the vector copies never write them)."""
    pad = width - first
    zero = float32(0.0)

    @jit(device=True)
    def zero_pads(smem, at, tid):
        for e in range(tid, rows * pad, threads):
            r = e // pad
            smem[at + r * pitch + first + e - r * pad] = zero

    return zero_pads


@functools.lru_cache(maxsize=None)
def q_fragments(in_registers: bool, steps: WarpSteps):
    """``load(smem, qf, f, address, scr, me, lane)``: Q's A fragment for one (m-tile,
    k-step): ``qf[f : f + 4]`` (filled before the key loop) or an ``ldmatrix`` at ``address``."""
    ldsm = steps.ldsm
    if in_registers:
        @jit(device=True)
        def load(smem, qf, f, address, scr, me, lane):
            return qf[f], qf[f + 1], qf[f + 2], qf[f + 3]
    else:
        @jit(device=True)
        def load(smem, qf, f, address, scr, me, lane):
            return ldsm(smem, address, scr, me, lane)
    return load
