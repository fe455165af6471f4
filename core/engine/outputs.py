"""A run's outputs: the caller's device buffers, and output allocators.

``execute_async(outputs=...)`` takes device arrays to write outputs into; where the
caller's buffer can stand in for the context's own (aligned, the run's launches all in one
specialization) the kernels write it directly, else the output is copied there.

An output whose size is data (a data-dependent layer's, :meth:`plugrt.plugin.OpPlugin.output_bounds`)
has no size before the run: the caller gives an *output allocator* for it (TensorRT's
``IOutputAllocator``), an object with

- ``reallocate_output(name, memory, size, alignment)``: device memory (an object with
  ``__cuda_array_interface__``) of at least ``size`` bytes at ``alignment``; ``memory`` is
  what it returned for the previous run (``None`` the first time), to return again when
  it is large enough;
- ``notify_shape(name, shape)``: the output's shape in this run.

After the run's last data-dependent layer the context knows every output's shape: it asks
the allocator for memory, copies the output there on the run's stream and returns that
memory, viewed at the output's dtype and shape. Any output may have an allocator.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from plugrt.engine.feeds import as_device
from plugrt.errors import BindingError

#: The alignment output allocators are asked for (what cudaMalloc gives).
ALIGNMENT = 256


def bind_outputs(spec, outputs: Mapping[str, object], chained: bool, convert) -> dict:
    """Check the caller's output arrays against ``spec`` (the run's last specialization)
    (each through ``convert(name, array)``) and bind those that can stand in for the
    context's buffers; ``chained``: the run
    went through data-dependent layers (its earlier launches are another specialization's,
    so outputs are copied, never bound)."""
    if not isinstance(outputs, Mapping):
        raise BindingError(f"outputs must be a mapping of output name to device array, got {type(outputs).__name__}")
    given = {}
    for name, array in outputs.items():
        if name not in spec.outputs:
            raise BindingError(f"output binding {name!r}: the model has no such output; its outputs are "
                               f"{', '.join(map(repr, spec.outputs))}")
        array = convert(name, array)
        kind, value = spec.outputs[name]
        shape = tuple(int(d) for d in np.shape(value))
        if tuple(array.shape) != shape or np.dtype(array.dtype) != np.dtype(value.dtype):
            sized = " (its size depends on data: give it an output allocator, context.set_output_allocator)" \
                if chained else ""
            raise BindingError(f"output binding {name!r}: expected a device array of {np.dtype(value.dtype)}"
                               f"{list(shape)}, got {np.dtype(array.dtype)}{list(array.shape)}{sized}")
        given[name] = array
    spec.in_place = set()
    for name in spec.slots:
        if name in spec.outputs and name not in spec.input_views:
            target = given.get(name)
            if target is not None and not chained and spec.can_bind(name, target):
                spec.bind(name, target)
                spec.in_place.add(name)
            else:
                spec.bind(name, None)
    return given


def check_allocator(name: str, allocator) -> None:
    missing = [m for m in ("reallocate_output", "notify_shape") if not callable(getattr(allocator, m, None))]
    if missing:
        raise BindingError(f"output allocator for {name!r}: {type(allocator).__name__} has no "
                           f"{' or '.join(missing)}() method; see plugrt.engine.outputs")


def allocate(allocators: dict, memory: dict, name: str, value, stream):
    """Output ``name``'s ``value`` (a device array, or a NumPy array known on the host)
    copied into the memory its allocator gives; that memory at ``value``'s dtype and shape."""
    allocator = allocators[name]
    shape, dtype = tuple(int(d) for d in np.shape(value)), np.dtype(value.dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    given = allocator.reallocate_output(name, memory.get(name), nbytes, ALIGNMENT)
    if given is None:
        raise BindingError(f"output allocator for {name!r}: reallocate_output returned None, not device memory")
    raw = as_device(name, given)
    memory[name] = given
    raw = raw.reshape(raw.size).view(np.uint8) if raw.dtype != np.uint8 or raw.ndim != 1 else raw
    if raw.size < nbytes:
        raise BindingError(f"output allocator for {name!r}: reallocate_output returned {raw.size} bytes, fewer than "
                           f"the {nbytes} asked for")
    out = raw[:nbytes].view(dtype).reshape(shape)
    if nbytes:
        out.copy_to_device(np.ascontiguousarray(value) if isinstance(value, np.ndarray) else value, stream=stream)
    allocator.notify_shape(name, shape)
    return out


__all__ = ["bind_outputs", "check_allocator", "allocate", "ALIGNMENT"]
