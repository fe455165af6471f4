"""The kernel toolkit op plugins build their CUDA tactics with.

Built-in and third-party plugins import the same things from here: ``cuda`` (Numba's,
after plugrt chose GPU or simulator), :func:`jit` (``cuda.jit`` minus the options the
simulator refuses), launch-geometry helpers and the epilogue contract of anchors (the
broadcasting elementwise kernel made from a scalar device function is the fusion code's:
:func:`plugrt.plugin.pointwise_tactic`).
The toolkit holds index arithmetic and hardware primitives (16-byte vector access; TF32 and
FP16 tensor-core instructions, ``ldmatrix`` and ``cp.async`` as inline PTX, from
:mod:`plugrt.inline_ptx`) only; the math is always the plugin's.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from numba import cuda, float32, uint32
from numba.cuda.misc.special import literal_unroll  # noqa: F401  (for kernels: `for x in literal_unroll(t)`)

from plugrt.device import guard_simulator, simulated
from plugrt.inline_ptx import (CP_ASYNC_ZFILL_PTX, CVT_F16X2_PTX, CVT_TF32_PTX, MMA_F16_PTX, MMA_TF32_PTX,  # noqa: F401
                               SHARED_ADDRESS_PTX, async_copy16, element_address, f16_mma, ldmatrix, ldmatrix_ptx,
                               shared_element_address,
                               ptx_statement, shared_address, tf32_mma)

#: ``cuda.jit`` options the simulator raises on; :func:`jit` drops them there.
_GPU_ONLY_OPTIONS = ("lineinfo", "max_registers", "lto", "launch_bounds", "forceinline", "fastmath")

#: Threads per block for 1-D grid-stride kernels on a GPU.
BLOCK = 256
#: Blocks cap for grid-stride kernels (132 SMs x 16 resident blocks of 256 threads).
MAX_BLOCKS = 132 * 16
#: The simulator runs each thread as a Python thread (~125 us each): few threads, long loops.
SIM_THREADS = 8


def jit(fn=None, **options):
    """``cuda.jit`` that drops GPU-only options under the simulator.

    Usable bare (``@jit``) or with options (``@jit(device=True)``).
    """
    if simulated():
        guard_simulator()
        options = {k: v for k, v in options.items() if k not in _GPU_ONLY_OPTIONS}
    if fn is None:
        return cuda.jit(**options)
    return cuda.jit(**options)(fn)


def grid_1d(n: int, block: int = BLOCK) -> tuple[int, int]:
    """``(blocks, threads)`` for a grid-stride loop over ``n`` items (never zero)."""
    n = max(int(n), 1)
    if simulated():
        threads = min(n, SIM_THREADS)
        return 1, threads
    threads = min(block, max(32, -(-n // 32) * 32))
    return min(-(-n // threads), MAX_BLOCKS), threads


def elementwise_grid(n: int, per_thread: int = 1, block: int = BLOCK) -> tuple[int, int]:
    """``(blocks, threads)`` giving every thread about ``per_thread`` elements of ``n``.

    Memory-bound kernels need many loads in flight: the grid is not capped at a few
    blocks per SM as :func:`grid_1d`'s is (a grid-stride loop stays correct either way).
    """
    n = max(int(n), 1)
    if simulated():
        return 1, min(n, SIM_THREADS)
    threads = min(block, max(32, -(-n // 32) * 32))
    return min(-(-n // (threads * per_thread)), 2**31 - 1), threads


def rows_grid(rows: int, block: int = BLOCK) -> tuple[int, int]:
    """``(blocks, threads)`` for one block per row (reductions, softmax, norms).

    Kernels written for it must loop over rows with a stride of ``cuda.gridDim.x`` and
    over the row with a stride of ``cuda.blockDim.x``, so any grid is correct.
    """
    rows = max(int(rows), 1)
    if simulated():
        return 1, min(SIM_THREADS, block)
    return min(rows, 65535), block


@functools.lru_cache(maxsize=None)
def vector4():
    """``(load4, store4)``: 16-byte vector access to a 1-D float32 array (global or shared).

    ``load4(a, i)`` returns ``a[i], a[i + 1], a[i + 2], a[i + 3]`` in one ``ld.v4.f32``;
    ``store4(a, i, w, x, y, z)`` stores four values in one ``st.v4.f32``. ``i`` must be a
    multiple of 4 and the array's data 16-byte aligned (check with :func:`aligned`).
    Memory-bound kernels need them to keep enough bytes in flight per thread, and
    shared-memory-bound ones to issue fewer loads; under the simulator they are plain
    indexing.
    """
    if simulated():
        @jit(device=True)
        def load4(a, i):
            return a[i], a[i + 1], a[i + 2], a[i + 3]

        @jit(device=True)
        def store4(a, i, w, x, y, z):
            a[i], a[i + 1], a[i + 2], a[i + 3] = w, x, y, z

        return load4, store4

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)
    vec = ir.VectorType(f32, 4)

    def _pointer(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        index = context.cast(builder, args[1], sig.args[1], types.int64)
        address = builder.gep(array.data, [index])
        return builder.bitcast(address, ir.PointerType(vec))

    def _float32_vector(array):
        return isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.float32

    @intrinsic
    def load4(typingctx, array, index):
        if not (_float32_vector(array) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            value = builder.load(_pointer(context, builder, sig, args), align=16)
            items = [builder.extract_element(value, ir.Constant(i32, k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, items)

        return types.UniTuple(types.float32, 4)(array, index), codegen

    @intrinsic
    def store4(typingctx, array, index, w, x, y, z):
        if not (_float32_vector(array) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            value = ir.Constant(vec, ir.Undefined)
            for k, item in enumerate(args[2:]):
                value = builder.insert_element(value, context.cast(builder, item, sig.args[2 + k], types.float32),
                                               ir.Constant(i32, k))
            builder.store(value, _pointer(context, builder, sig, args), align=16)
            return context.get_dummy_value()

        return types.void(array, index, w, x, y, z), codegen

    return load4, store4


#: Elements :func:`vector8` moves at once: 16 bytes of float16, 32 of float32.
VECTOR = 8


@functools.lru_cache(maxsize=None)
def vector8():
    """``(load8, store8)``: eight consecutive elements of a 1-D float16 or float32 array
    (global or shared) as float32 values, in 16-byte vector accesses.

    ``load8(a, i)`` returns ``a[i .. i + 7]`` widened to float32 as a ``UniTuple(float32,
    8)`` (one ``ld.v4.b32`` for float16, two ``ld.v4.f32`` for float32); ``store8(a, i,
    values)`` stores such a tuple, rounded to ``a``'s dtype, the same way. ``i`` must be a
    multiple of 8 and the array's data 16-byte aligned (:func:`aligned`). Under the
    simulator they are plain indexing.
    """
    if simulated():
        @jit(device=True)
        def load8(a, i):
            return (float32(a[i]), float32(a[i + 1]), float32(a[i + 2]), float32(a[i + 3]),
                    float32(a[i + 4]), float32(a[i + 5]), float32(a[i + 6]), float32(a[i + 7]))

        @jit(device=True)
        def store8(a, i, v):
            a[i], a[i + 1], a[i + 2], a[i + 3] = v[0], v[1], v[2], v[3]
            a[i + 4], a[i + 5], a[i + 6], a[i + 7] = v[4], v[5], v[6], v[7]

        return load8, store8

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32 = ir.IntType(32)
    result = types.UniTuple(types.float32, VECTOR)

    def _supported(array, index):
        return (isinstance(array, types.Array) and array.ndim == 1 and isinstance(index, types.Integer)
                and array.dtype in (types.float16, types.float32))

    def _chunks(context, builder, sig, args):
        """The vector pointers covering the eight elements and their element type: one
        <8 x half> for float16, two <4 x float> for float32."""
        array = context.make_array(sig.args[0])(context, builder, args[0])
        index = context.cast(builder, args[1], sig.args[1], types.int64)
        address = builder.gep(array.data, [index])
        if sig.args[0].dtype == types.float16:
            return [builder.bitcast(address, ir.PointerType(ir.VectorType(ir.HalfType(), 8)))], 8
        f4 = ir.PointerType(ir.VectorType(ir.FloatType(), 4))
        second = builder.gep(array.data, [builder.add(index, ir.Constant(ir.IntType(64), 4))])
        return [builder.bitcast(address, f4), builder.bitcast(second, f4)], 4

    @intrinsic
    def load8(typingctx, array, index):
        if not _supported(array, index):
            return None

        def codegen(context, builder, sig, args):
            pointers, width = _chunks(context, builder, sig, args)
            items = []
            for pointer in pointers:
                value = builder.load(pointer, align=16)
                for k in range(width):
                    item = builder.extract_element(value, ir.Constant(i32, k))
                    items.append(builder.fpext(item, ir.FloatType()) if width == 8 else item)
            return context.make_tuple(builder, result, items)

        return result(array, index), codegen

    @intrinsic
    def store8(typingctx, array, index, values):
        if not (_supported(array, index) and isinstance(values, types.UniTuple) and values.count == VECTOR):
            return None

        def codegen(context, builder, sig, args):
            pointers, width = _chunks(context, builder, sig, args)
            element = ir.HalfType() if width == 8 else ir.FloatType()
            items = [context.cast(builder, builder.extract_value(args[2], k), sig.args[2].dtype, types.float32)
                     for k in range(VECTOR)]
            for c, pointer in enumerate(pointers):
                value = ir.Constant(ir.VectorType(element, width), ir.Undefined)
                for k in range(width):
                    item = items[c * width + k]
                    item = builder.fptrunc(item, element) if width == 8 else item
                    value = builder.insert_element(value, item, ir.Constant(i32, k))
                builder.store(value, pointer, align=16)
            return context.get_dummy_value()

        return types.void(array, index, values), codegen

    return load8, store8


@jit(device=True)
def round_tf32(x):
    """float32 rounded to TF32 (10 mantissa bits, nearest, ties away), as ``cvt.rna`` does:
    the portable form of ``to_tf32``, for simulator siblings of tensor-core kernels."""
    box = cuda.local.array(1, float32)
    box[0] = x
    bits = box.view(np.uint32)
    bits[0] = (bits[0] + uint32(0x1000)) & uint32(0xFFFFE000)
    return box[0]


def aligned(array, alignment: int = 16) -> bool:
    """Whether a device array's data starts on an ``alignment``-byte boundary."""
    interface = getattr(array, "__cuda_array_interface__", None) or array.__array_interface__  # simulator
    return interface["data"][0] % alignment == 0


def flat(array):
    """A 1-D view of a C-contiguous device array (a 0-d array becomes one element)."""
    shape = array.shape
    if len(shape) == 1:
        return array
    return array.reshape(math.prod(shape))


def to_device(array: np.ndarray):
    """A small host table (shapes, strides, index maps, a scalar operand, a dummy) on the
    device, **read-only**: tables of the same contents (up to :data:`TABLE_SHARED_BYTES`)
    share one device array on this device, so the layers of a repeated block, and a new
    shape's specialization, upload each distinct table once. A kernel must never write to
    one (outputs and scratch come from the launch's outputs and workspace)."""
    host = np.ascontiguousarray(array)
    if host.nbytes > TABLE_SHARED_BYTES:
        return cuda.to_device(host)
    key = (0 if simulated() else cuda.get_current_device().id, host.dtype.str, host.shape, host.tobytes())
    with _TABLES_LOCK:
        found = _TABLES.get(key)
        if found is not None:
            _TABLES.move_to_end(key)
            return found
    uploaded = cuda.to_device(host)
    with _TABLES_LOCK:
        _TABLES[key] = uploaded
        while len(_TABLES) > TABLE_CACHE:
            _TABLES.popitem(last=False)  # (launches holding it keep it alive)
    return uploaded


#: Distinct device tables :func:`to_device` keeps for sharing (least recently used dropped).
TABLE_CACHE = 4096
#: Larger tables (weights a tactic derives, long index maps) are uploaded each time.
TABLE_SHARED_BYTES = 16 * 1024
_TABLES: "OrderedDict[tuple, object]" = OrderedDict()
_TABLES_LOCK = threading.Lock()


def c_strides(shape: Sequence[int]) -> np.ndarray:
    """Element strides of a C-contiguous array of ``shape`` (int64)."""
    strides = np.ones(len(shape), dtype=np.int64)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return strides


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> np.ndarray:
    """Element strides that read an array of ``shape`` broadcast to ``out_shape``
    (0 along broadcast axes; ``shape`` is right-aligned as in NumPy)."""
    rank = len(out_shape)
    own = c_strides(shape)
    strides = np.zeros(rank, dtype=np.int64)
    for k, size in enumerate(shape):
        axis = rank - len(shape) + k
        strides[axis] = own[k] if size != 1 else 0
    return strides


# --------------------------------------------------------------------------- epilogues


@dataclass(frozen=True, eq=False)
class Epilogue:
    """Per-element work an anchor tactic (Conv, Gemm, MatMul) does before its store.

    The core composes it from the pointwise plugins' device functions (bias, activation
    chains, a residual add, scaling); an anchor plugin only has to call it.

    ``fn(value, index, operands)`` is a ``@jit(device=True)`` function. ``value`` is the
    anchor's result for one output element, as it would be stored (float32 compute for
    float32/float16 outputs, float64 for float64), ``index`` the element's flat C-order
    index in the anchor's output (int64), and ``operands`` the tuple :meth:`arguments`
    returns, passed through the kernel untouched. ``fn`` returns the value to store; the
    store casts it to the output's dtype.

    An anchor tactic given an epilogue:

    - compiles its kernel per ``fn`` (use ``fn`` in the kernel factory's cache key);
    - in ``launches(ins, outs, workspace)`` reads its own inputs from ``ins[:first]`` only
      (the epilogue's tensors follow them) and passes ``arguments(ins)`` to the kernel as
      one argument;
    - stores ``out[index] = fn(value, index, operands)`` for every element, exactly once
      (a split-K tactic applies it in its final reduction, never to partial sums).

    ``vector`` (when not None) is ``fn`` for :data:`VECTOR` consecutive elements at once:
    ``vector(values, index, operands)`` takes and returns a ``UniTuple(float32, VECTOR)``,
    ``index`` being the first element's, a multiple of :data:`VECTOR` (so the elements
    share one row of the output's last axis, which the epilogue only offers where that
    axis is a multiple of :data:`VECTOR`). It reads its same-shaped operands with 16-byte
    vector loads: an anchor may call it only where :meth:`vector_ready` says so for the
    launch's arrays, and stores the result with :func:`vector8`'s ``store8``.
    """

    fn: Callable
    #: Where the epilogue's tensors start in ``ins`` (the anchor node's input count).
    first: int
    #: Index table the composed ``fn`` reads (output shape, operand strides).
    table: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    #: A short description for tactic names and logs (``"Add+Relu"``).
    label: str = ""
    #: ``fn`` for :data:`VECTOR` elements at once, or None (see the class doc).
    vector: Callable | None = None
    #: Operands (positions after ``first``) ``vector`` reads with vector loads.
    vector_operands: tuple = ()

    def arguments(self, ins: Sequence[Any]) -> tuple:
        """The kernel argument: ``(table, operand0, operand1, ...)``, operands flattened."""
        return (to_device(self.table),) + tuple(flat(array) for array in ins[self.first:])

    def vector_ready(self, ins: Sequence[Any], out) -> bool:
        """Whether an anchor may call :attr:`vector` and store eight elements at once into
        ``out``: there is one, ``out`` is float16/float32, and ``out`` and every operand
        it loads by vectors start on 16-byte boundaries."""
        return (self.vector is not None and np.dtype(out.dtype) in (np.float16, np.float32) and aligned(out)
                and all(aligned(ins[self.first + k]) for k in self.vector_operands))


@jit(device=True)
def _store_as_is(value, index, operands):
    return value


def no_epilogue(first: int) -> Epilogue:
    """The epilogue that stores the value unchanged: an anchor's tactics without fusion."""
    return Epilogue(_store_as_is, first, label="", vector=_store_as_is)


__all__ = [
    # Numba, as plugrt set it up (GPU or simulator)
    "cuda", "jit", "literal_unroll", "simulated",
    # launch geometry and host-side helpers
    "BLOCK", "MAX_BLOCKS", "SIM_THREADS", "grid_1d", "elementwise_grid", "rows_grid", "flat", "to_device",
    "aligned", "c_strides", "broadcast_strides",
    # anchors' epilogues
    "Epilogue", "no_epilogue",
    # hardware primitives
    "vector4", "vector8", "VECTOR", "element_address", "shared_element_address", "ptx_statement", "tf32_mma", "round_tf32", "CVT_TF32_PTX", "MMA_TF32_PTX",
    "f16_mma", "shared_address", "ldmatrix", "ldmatrix_ptx", "async_copy16", "CVT_F16X2_PTX", "MMA_F16_PTX",
    "CP_ASYNC_ZFILL_PTX", "SHARED_ADDRESS_PTX",
]
