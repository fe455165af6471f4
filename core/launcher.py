"""Prebuilt kernel launches: compile once, pack the arguments once, launch in ~5 us.

Numba's dispatcher spends 20-40 us of host time per launch marshalling arguments
(``research/NUMBA_CUDA.md`` section 1). At specialization time the engine turns every
:class:`~plugrt.tactic.Launch` into a :class:`PreparedLaunch`: the kernel is compiled for
the arguments' types, the CUDA function handle fetched, and the arguments flattened the
way Numba's ABI lays them out (an array becomes ``meminfo, parent, nitems, itemsize,
data, *shape, *strides``) into a ``void*[]`` that ``cuLaunchKernel`` reads. In the
simulator a prepared launch simply calls the kernel.
"""

from __future__ import annotations

import ctypes
import logging
import threading

import numpy as np

from plugrt.device import guard_simulator, simulated
from plugrt.tactic import Launch

log = logging.getLogger("plugrt.engine")

#: Numba's simulator is not thread-safe (two threads' kernels share the fake ``cuda``
#: module's thread indices): simulated launches run one at a time.
_SIMULATOR_LOCK = threading.RLock()

_CTYPES_BY_NAME = {
    "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool,
}


def _dim3(value) -> tuple[int, int, int]:
    if isinstance(value, (tuple, list)):
        dims = [int(v) for v in value] + [1, 1]
        return dims[0], dims[1], dims[2]
    return int(value), 1, 1


class PreparedLaunch:
    """One launch, ready to replay on a stream.

    ``key`` names the kernel's code for the kernel cache and plan files
    (:func:`plugrt.binaries.function`); without one the kernel is compiled by Numba.
    """

    def __init__(self, launch: Launch, key: str | None = None):
        self.launch = launch
        self.key = key
        self.grid = _dim3(launch.grid)
        self.block = _dim3(launch.block)
        self._raw = None
        if not simulated():
            try:
                self._raw = _RawLaunch(launch, self.grid, self.block, key)
            except Exception as exc:  # an unusual argument type: the dispatcher still works
                from plugrt.errors import PlugrtError

                if isinstance(exc, PlugrtError):
                    raise
                log.warning("kernel %s: raw launch unavailable (%s); using Numba's dispatcher",
                            getattr(launch.kernel, "__name__", launch.kernel), exc)

    def __call__(self, stream) -> None:
        if self._raw is not None:
            self._raw(stream)
            return
        launch = self.launch
        if simulated():
            guard_simulator()  # (a plugin's own @cuda.jit kernels too)
            with _SIMULATOR_LOCK:
                launch.kernel[self.grid, self.block, stream, launch.shared_bytes](*launch.args)
            return
        launch.kernel[self.grid, self.block, stream, launch.shared_bytes](*launch.args)

    @property
    def raw(self) -> bool:
        return self._raw is not None

    # ------------------------------------------------------------------ graphs and rebinding
    # (raw launches only: a CUDA graph's kernel node copies these; rebinding rewrites one
    # pointer of the packed parameters in place)

    def pointers(self) -> list[tuple[int, int]]:
        """``(slot, address)`` of every array data pointer among the packed parameters."""
        return list(self._raw.pointer_slots) if self._raw is not None else []

    def set_pointer(self, slot: int, address: int) -> None:
        """Point parameter ``slot`` (from :meth:`pointers`) at ``address``."""
        self._raw.values[slot].value = address

    def node_params(self):
        """A ``CUDA_KERNEL_NODE_PARAMS`` for this launch (its parameter buffer, live)."""
        return self._raw.node_params()


class _RawLaunch:
    """``cuLaunchKernel`` with a parameter buffer packed once."""

    def __init__(self, launch: Launch, grid, block, key: str | None):
        from cuda.bindings import driver as drv

        from plugrt import binaries

        kernel = launch.kernel
        argtypes = tuple(arg_type(kernel, a) for a in launch.args)
        function = binaries.function(kernel, argtypes, key)
        if launch.shared_bytes > 48 * 1024:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(drv.cuFuncSetAttribute(function, attr, int(launch.shared_bytes))[0], "cuFuncSetAttribute")
        values: list = []
        pointer_slots: list = []
        for ty, arg in zip(argtypes, launch.args):
            _pack(ty, arg, values, pointer_slots)
        self.values = values
        self.pointer_slots = pointer_slots
        self._keep = launch
        self._params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        self._params_address = ctypes.addressof(self._params)
        self._function = function
        self._grid, self._block, self._shared = grid, block, int(launch.shared_bytes)
        self._drv = drv

    def __call__(self, stream) -> None:
        handle = _stream_handle(stream)
        gx, gy, gz = self._grid
        bx, by, bz = self._block
        err, = self._drv.cuLaunchKernel(self._function, gx, gy, gz, bx, by, bz, self._shared, handle,
                                        self._params_address, 0)
        if err != self._drv.CUresult.CUDA_SUCCESS:
            _check(err, "cuLaunchKernel")

    def node_params(self):
        params = self._drv.CUDA_KERNEL_NODE_PARAMS()
        params.func = self._function
        params.gridDimX, params.gridDimY, params.gridDimZ = self._grid
        params.blockDimX, params.blockDimY, params.blockDimZ = self._block
        params.sharedMemBytes = self._shared
        params.kernelParams = self._params_address
        return params


def arg_type(kernel, arg):
    """Numba's type of a kernel argument (``kernel.typeof_pyval``), remembered for the
    arguments whose type their class and dtype alone decide: NumPy scalars, 1-D
    contiguous device arrays (what :func:`plugrt.kernels.flat` makes) and tuples of these.
    A new shape's specialization types about 15 arguments a launch; Numba's typing of
    each costs tens of microseconds."""
    key = _type_key(arg)
    if key is None:
        return kernel.typeof_pyval(arg)
    found = _ARG_TYPES.get(key)
    if found is None:
        found = kernel.typeof_pyval(arg)
        if len(_ARG_TYPES) < 4096:
            _ARG_TYPES[key] = found
    return found


def _type_key(arg):
    if isinstance(arg, np.generic):
        return (type(arg),)
    if isinstance(arg, tuple):
        keys = tuple(_type_key(item) for item in arg)
        return None if None in keys else ("tuple",) + keys
    shape, dtype = getattr(arg, "shape", None), getattr(arg, "dtype", None)
    if (isinstance(shape, tuple) and len(shape) == 1 and isinstance(dtype, np.dtype) and not dtype.fields
            and getattr(arg, "strides", None) == (dtype.itemsize,) and hasattr(arg, "__cuda_array_interface__")):
        return (type(arg), dtype.str, "C1")
    return None


#: :func:`arg_type`'s answers by key (a class and dtype: few distinct ones).
_ARG_TYPES: dict = {}


def _pack(ty, arg, values: list, pointer_slots: list) -> None:
    """Append ``arg``'s kernel parameters the way Numba lays them out (tuples flattened);
    note in ``pointer_slots`` where each array's data pointer went."""
    from numba import types

    if isinstance(ty, types.Array):
        cai = arg.__cuda_array_interface__
        address = cai["data"][0] or 0
        values += [ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int64(int(arg.size)),
                   ctypes.c_int64(int(arg.dtype.itemsize))]
        pointer_slots.append((len(values), address))
        values.append(ctypes.c_void_p(address))
        values += [ctypes.c_int64(int(s)) for s in arg.shape]
        values += [ctypes.c_int64(int(s)) for s in arg.strides]
    elif isinstance(ty, types.BaseTuple):
        for item_type, item in zip(ty, arg):
            _pack(item_type, item, values, pointer_slots)
    elif str(ty) in _CTYPES_BY_NAME:
        values.append(_CTYPES_BY_NAME[str(ty)](arg.item() if hasattr(arg, "item") else arg))
    elif str(ty) == "float16":
        values.append(ctypes.c_uint16(int(np.float16(arg).view(np.uint16))))
    else:
        raise TypeError(f"argument type {ty} is not supported by raw launches")


def stream_handle(stream) -> int:
    """The ``CUstream`` address of a stream: a Numba stream, a CuPy or PyTorch stream, a
    cuda.core stream (``__cuda_stream__``), a raw handle (``int``), or ``None``/``0`` for
    the legacy default stream. Anything else raises ``TypeError``."""
    if stream is None or isinstance(stream, int) and not isinstance(stream, bool):
        return int(stream or 0)
    protocol = getattr(stream, "__cuda_stream__", None)
    if callable(protocol):
        return int(protocol()[1])
    for attribute in ("handle", "ptr", "cuda_stream"):  # Numba, CuPy, PyTorch
        handle = getattr(stream, attribute, None)
        if handle is not None:
            handle = getattr(handle, "value", handle)  # a ctypes c_void_p
            try:
                return int(handle or 0)
            except (TypeError, ValueError):
                break
    raise TypeError(f"{type(stream).__name__} is not a CUDA stream")


_stream_handle = stream_handle


def _check(err, what: str) -> None:
    from cuda.bindings import driver as drv

    if err != drv.CUresult.CUDA_SUCCESS:
        from plugrt.errors import PlugrtError

        raise PlugrtError(f"{what} failed: {err}")
