"""What every attention kernel shares: the concrete problem and its launch arguments.

All kernels of this package take the same arguments, ``(out, q, k, v, mask, sq, sk, heads,
k_sb, k_sh, v_sb, v_sh, m_sb, m_sh, m_sq, m_sk, qscale)``: flat arrays, the sequence
lengths and head count, element strides of K's and V's batch and head (0 where
broadcast) and of the mask's four axes (0 where broadcast), and ``scale``; and run one
block per (query tile, batch x head), the query tile fastest (blocks of one head share
its K and V in L2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import float32

from plugrt.kernels import flat, jit, simulated, to_device
from plugrt.plugin import Launch

#: Largest dynamic shared memory a block may ask for on sm_90 (227 KiB); the engine's
#: launcher opts kernels above 48 KiB in.
MAX_SHARED_BYTES = 227 * 1024
#: Largest grid (blocks along x).
MAX_BLOCKS = 2**31 - 1


@dataclass(frozen=True)
class AttentionShapes:
    """The concrete problem: Q ``[b, h, sq, d]``, K/V ``[.., sk, d / dv]``, broadcast strides."""

    b: int
    h: int
    sq: int
    sk: int
    d: int
    dv: int
    k_strides: tuple[int, int]
    v_strides: tuple[int, int]
    mask_strides: tuple[int, int, int, int] | None

    @classmethod
    def of(cls, q_shape, k_shape, v_shape, mask_shape=None) -> "AttentionShapes":
        b, h, sq, d = (int(x) for x in q_shape)
        sk, dv = int(k_shape[2]), int(v_shape[3])

        def lead_strides(shape):
            rows = int(shape[2]) * int(shape[3])
            return (int(shape[1]) * rows if int(shape[0]) != 1 else 0, rows if int(shape[1]) != 1 else 0)

        mask = None
        if mask_shape is not None:
            full = (1,) * (4 - len(mask_shape)) + tuple(int(x) for x in mask_shape)
            strides, step = [0, 0, 0, 0], 1
            for axis in range(3, -1, -1):
                strides[axis] = step if full[axis] != 1 else 0
                step *= full[axis]
            mask = tuple(strides)
        return cls(b, h, sq, sk, d, dv, lead_strides(k_shape), lead_strides(v_shape), mask)

    @property
    def has_mask(self) -> bool:
        return self.mask_strides is not None

    def blocks(self, bq: int) -> int:
        """The grid for query tiles of ``bq`` rows."""
        return self.b * self.h * -(-self.sq // bq)

    def launch_list(self, kernel, bq: int, threads: int, shared_bytes: int, dtype, scale: float):
        """The tactic's ``launches(ins, outs, workspace)`` running ``kernel`` once."""
        blocks = self.blocks(bq)
        mask_strides = self.mask_strides or (0, 0, 0, 0)
        dtype_name = np.dtype(dtype).name

        def launches(ins, outs, workspace):
            if blocks == 0 or self.dv == 0:
                return []
            q, k, v = (flat(x) for x in ins[:3])
            mask = flat(ins[3]) if self.has_mask else to_device(np.zeros(1, dtype_name))
            args = (flat(outs[0]), q, k, v, mask, np.int64(self.sq), np.int64(self.sk), np.int64(self.h),
                    np.int64(self.k_strides[0]), np.int64(self.k_strides[1]),
                    np.int64(self.v_strides[0]), np.int64(self.v_strides[1]),
                    *(np.int64(s) for s in mask_strides), np.float32(scale))
            return [Launch(kernel, blocks, threads, args, shared_bytes)]

        return launches


@jit(device=True)
def as_is(x):
    """The identity, for :func:`tile_stager` (float32 kernels stage values unchanged)."""
    return x


@functools.lru_cache(maxsize=None)
def tile_stager(rows: int, cols: int, width: int, at: int, pitch: int, threads: int, convert):
    """``stage(smem, src, base, count, scale, tid)``: copy ``rows x cols`` of a row-major
    ``src`` (rows of ``cols`` elements from ``base``; those past ``count`` read as 0) into
    ``smem[at + r * pitch + c]`` for ``c < width`` (columns past ``cols`` zero), scaled and
    passed through ``convert`` (a device function: TF32 rounding, or :func:`as_is`).
    Consecutive threads take consecutive columns (coalesced reads); when ``width`` divides
    the block each thread keeps its column (no index division)."""
    zero = float32(0.0)
    if threads % width == 0:
        step = threads // width

        @jit(device=True)
        def stage(smem, src, base, count, scale, tid):
            col = tid % width
            inside = col < cols
            for r in range(tid // width, rows, step):
                value = zero
                if inside and r < count:
                    value = convert(float32(src[base + r * cols + col]) * scale)
                smem[at + r * pitch + col] = value

        return stage

    @jit(device=True)
    def stage(smem, src, base, count, scale, tid):
        for e in range(tid, rows * width, threads):
            r = e // width
            col = e - r * width
            value = zero
            if col < cols and r < count:
                value = convert(float32(src[base + r * cols + col]) * scale)
            smem[at + r * pitch + col] = value

    return stage


@functools.lru_cache(maxsize=None)
def shared_vector_load(width: int, vector: bool = True):
    """``load(smem, i)``: ``smem[i : i + width]`` of a 1-D float32 array (``width`` 2 or 4)
    as a tuple; with ``vector`` one ``4 * width``-byte load (``i`` a multiple of ``width``,
    the data aligned to it), else scalar loads (always in the simulator, which runs no
    LLVM intrinsics). Indices are uint64."""
    if not vector or simulated():
        one, two, three = np.uint64(1), np.uint64(2), np.uint64(3)
        if width == 2:
            @jit(device=True)
            def load(smem, i):
                return smem[i], smem[i + one]
        else:
            @jit(device=True)
            def load(smem, i):
                return smem[i], smem[i + one], smem[i + two], smem[i + three]
        return load

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    vec = ir.VectorType(ir.FloatType(), width)

    @intrinsic
    def load(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1
                and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            offset = context.cast(builder, args[1], sig.args[1], types.uint64)
            address = builder.bitcast(builder.gep(data, [offset]), ir.PointerType(vec))
            value = builder.load(address, align=4 * width)
            items = [builder.extract_element(value, ir.Constant(ir.IntType(32), k)) for k in range(width)]
            return context.make_tuple(builder, sig.return_type, items)

        return types.UniTuple(types.float32, width)(array, index), codegen

    return load
