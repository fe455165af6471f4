"""The warp-level pieces of the ``mma.sync`` TF32 kernels: the TF32 GEMM (:mod:`.tf32`)
and the TF32 conv (:mod:`plugrt_builtin_ops.conv.tf32`).

The warp step ``warp_mma(smem, a_off, b_off, lane, acc)`` multiplies one k8 slice of a
warp's ``mi x ni`` m16n8k8 tiles (:func:`warp_mma_for` picks it for the backend):

- on a GPU, :func:`mma_tensor_core`: fragments loaded from shared memory (``ldmatrix``
  for K-contiguous tiles; operands rounded with ``cvt.rna.tf32.f32``, once when staged or
  as they are read) and multiplied by ``mma.sync`` (both inline PTX through
  ``@intrinsic``, ``research/NUMBA_CUDA.md`` section 4);
- in the simulator (which runs no inline PTX or warp-collective code), :func:`mma_emulated`:
  each thread computes the same accumulator elements (same fragment layout) with scalar
  FMAs on the same shared tiles, operands rounded to TF32 the same way (nearest, ties away).

Beside it: the ``cp.async`` copies of whole operand tiles (:func:`async_copy`,
:func:`async_tile_copy`, copying at once in the simulator), the TF32 rounding of staged
operands (:func:`tf32_rounder`) and the stager of a warp's accumulators into the output
tile (:func:`accumulator_stager`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import float32

from plugrt.kernels import cuda, element_address, jit, ptx_statement, round_tf32, simulated, tf32_mma


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
