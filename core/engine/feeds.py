"""The caller's bindings as the runtime binds them: feeds as NumPy arrays or C-contiguous
device arrays, output buffers as device arrays, each refused with a :class:`BindingError`
naming the binding; and the conversions kept from one run to the next
(:class:`Conversions`), so that feeding the same device object again costs nothing."""

from __future__ import annotations

import functools
from typing import Mapping

import numpy as np

from plugrt.errors import BindingError


class Conversions:
    """The caller's device objects as the runtime binds them, kept from one run to the next
    (one per binding): feeding the same object again skips its conversion (a CuPy or
    PyTorch array wrapped as a Numba one). Kept only while the object still describes the
    same memory: a Numba device array always does; another object's
    ``__cuda_array_interface__`` (pointer, shape, strides, type) must be unchanged. Holding
    the object keeps its ``id`` from being reused. NumPy arrays are converted every time, and
    so is anything whose conversion copies its data (a strided device array made
    contiguous): only a view of the caller's memory may be kept."""

    def __init__(self):
        self._entries: dict = {}

    def get(self, key, value, convert):
        """``convert(name, value)``, or what it gave for this same ``value`` last time."""
        name = key if isinstance(key, str) else key[1]
        if isinstance(value, np.ndarray):
            return convert(name, value)
        hit = self._entries.get(key)
        numba_array = isinstance(value, _device_array_type())
        described = None if numba_array else _interface(value)
        if hit is not None and hit[0] is value and hit[1] == described:
            return hit[2]
        converted = convert(name, value)
        if numba_array:
            keep = converted is value
        else:
            seen = _interface(converted) if described else False
            keep = bool(seen) and seen[0] == described[0]  # the same memory, wrapped
        if keep:
            self._entries[key] = (value, described, converted)
        else:
            self._entries.pop(key, None)
        return converted


def _interface(value):
    """What a device object's ``__cuda_array_interface__`` says of its memory, or ``False``
    where it has none (such an object is not kept)."""
    interface = getattr(value, "__cuda_array_interface__", None)
    if not isinstance(interface, Mapping):
        return False
    shape = interface.get("shape")
    strides = interface.get("strides")
    return (interface.get("data"), tuple(shape) if shape is not None else None,
            tuple(strides) if strides is not None else None, interface.get("typestr"))


def as_bindable(name: str, value):
    """``value`` as a NumPy array or a C-contiguous device array, or a :class:`BindingError`."""
    from numba import cuda

    if isinstance(value, np.ndarray) or np.isscalar(value) or isinstance(value, (list, tuple)):
        try:
            array = np.asarray(value)
        except ValueError as exc:  # ragged nesting
            raise BindingError(f"input binding {name!r}: {type(value).__name__} is not an array ({exc}); pass a "
                               "NumPy array") from None
        if array.dtype.hasobject or array.dtype.kind not in "biufc":
            raise BindingError(f"input binding {name!r}: got an array of dtype {array.dtype}, which no model input "
                               "has; pass a numeric or bool NumPy array")
        return array
    if hasattr(value, "__cuda_array_interface__") and not isinstance(value, _device_array_type()):
        try:
            value = cuda.as_cuda_array(value)
        except Exception as exc:  # an interface Numba cannot map (bad typestr, strides, pointer)
            raise BindingError(f"input binding {name!r}: its __cuda_array_interface__ is not usable "
                               f"({type(exc).__name__}: {exc})") from None
    if hasattr(value, "copy_to_host") and hasattr(value, "shape") and hasattr(value, "dtype"):
        if not value.is_c_contiguous():
            return cuda.to_device(np.ascontiguousarray(value.copy_to_host()))  # strided: made contiguous
        return value
    raise BindingError(f"input binding {name!r}: expected a NumPy array or a CUDA array "
                       f"(__cuda_array_interface__), got {type(value).__name__}")


@functools.lru_cache(maxsize=None)
def _device_array_type():
    """Numba's device array class (the simulator's fake one there)."""
    try:
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
    except ImportError:  # the simulator
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as DeviceNDArray
    return DeviceNDArray


def as_device(name: str, value):
    """An output buffer the caller gave: a C-contiguous device array, or a BindingError."""
    from numba import cuda

    if hasattr(value, "__cuda_array_interface__") and not hasattr(value, "copy_to_host"):
        try:
            value = cuda.as_cuda_array(value)
        except Exception as exc:
            raise BindingError(f"output binding {name!r}: its __cuda_array_interface__ is not usable "
                               f"({type(exc).__name__}: {exc})") from None
    if not (hasattr(value, "copy_to_host") and hasattr(value, "is_c_contiguous")):
        raise BindingError(f"output binding {name!r}: expected a device array (__cuda_array_interface__), got "
                           f"{type(value).__name__}")
    if not value.is_c_contiguous():
        raise BindingError(f"output binding {name!r}: the device array must be C-contiguous")
    return value


def host_values(value) -> np.ndarray:
    """A shape-tensor input's values on the host."""
    return value if isinstance(value, np.ndarray) else value.copy_to_host()
