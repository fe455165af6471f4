"""Execution contexts: an engine's activation arena and workspace, bound to a stream.

A context specializes the engine for each set of input shapes it sees (within the
profile; :mod:`plugrt.engine.specialization`) and keeps the most recent ones. A run copies
host inputs in through pinned staging buffers (or, for device inputs, points the kernels
at the caller's memory), replays the launches (as a CUDA graph from the second run of a
shape on) and leaves the outputs in the context's output buffers, or in the caller's.

Streams: ``execute_async`` enqueues everything on the caller's stream (a Numba, CuPy,
PyTorch or cuda.core stream, or a raw handle) and synchronizes only after a data-dependent
layer, to read its outputs' sizes (:mod:`plugrt.engine.specialization`); a run on
another stream than the last one waits for the last one on the device. Threads: a
context runs one request at a time, and using it from two threads at once is an error;
use one context per thread (:class:`plugrt.engine.pool.ContextPool`). Several contexts of
one engine share its weights and run concurrently.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Mapping

import numpy as np

from plugrt.bindings import check_inputs
from plugrt.device import current_device_id, ensure_current, simulated
from plugrt.engine import buckets
from plugrt.engine import outputs as outputs_
from plugrt.engine.feeds import Conversions, as_bindable, as_device, host_values
from plugrt.engine.graphs import NonBlockingStream
from plugrt.engine.profile import check_binding
from plugrt.engine.profile import profile_index as _profile_index
from plugrt.engine.specialization import Specialization
from plugrt.engine.staging import HostStaging
from plugrt.errors import BindingError, PlugrtError
from plugrt.launcher import stream_handle

log = logging.getLogger("plugrt.engine")

#: CUDA graphs a context keeps (one per input shape) before it drops the least recently used.
MAX_GRAPHS = 16
#: Specializations (input shapes) a context keeps.
MAX_SPECIALIZATIONS = 64


class ExecutionContext:
    """Runs an engine on a stream; one request at a time (see the module doc)."""

    def __init__(self, engine, stream=None, use_cuda_graph: bool = True, max_graphs: int = MAX_GRAPHS,
                 profile: int = 0, batch_buckets=None, max_specializations: int | None = None):
        from numba import cuda

        self.engine = engine
        #: The device the context belongs to: the one current where it was made. Every call
        #: makes it current in the calling thread (:func:`plugrt.device.make_current`).
        self.device_id = current_device_id()
        self.profile_index = _profile_index(engine, profile)
        self.batch_buckets = buckets.check_buckets(engine, self.profile_index, batch_buckets or ())  # (execute pads)
        self.use_cuda_graph = bool(use_cuda_graph) and not simulated()
        self.max_graphs = max(int(max_graphs), 1)
        #: Input shapes whose prepared launches the context keeps (a shape dropped is
        #: prepared again when it comes back: tens of milliseconds on the host).
        self.max_specializations = max(int(max_specializations or MAX_SPECIALIZATIONS), 1)
        self._warned_specs = False
        self._external: dict[int, object] = {}
        self.stream = self._stream(stream) if stream is not None else cuda.stream()
        self._busy = threading.Lock()
        self._closed = False
        self.arena = cuda.device_array(max(engine.arena_bytes, 1), np.uint8)
        self.workspace = cuda.device_array(engine.workspace_bytes, np.uint8) if engine.workspace_bytes else None
        self.weights = engine.device_weights()
        self._io: dict[str, object] = {}
        self._staging = HostStaging()
        self._converted = Conversions()
        self._checked: tuple | None = None
        self._capture_stream = None
        self._last_stream: int | None = None
        self._done = cuda.event()
        self._warned_graphs = False
        self._specs: OrderedDict[tuple, Specialization] = OrderedDict()
        self.current: Specialization | None = None
        #: The specializations the last run went through: one, or more past data-dependent layers.
        self.last_run: list[Specialization] = []
        self._allocators: dict = {}
        self._allocated: dict = {}
        self._at_opt()
        if self.batch_buckets and self.current.graph.data_dependent:
            raise PlugrtError("batch buckets: the engine has data-dependent layers (their outputs' sizes are data, "
                              f"which padded rows change: {', '.join(self.current.graph.data_dependent)}); run unpadded")

    # ------------------------------------------------------------------ optimization profiles

    @property
    def optimization_profile(self) -> int:
        """The index of the optimization profile this context runs (its shapes and tactics)."""
        return self.profile_index

    def set_optimization_profile_async(self, index: int, stream=None) -> None:
        """Run optimization profile ``index`` from the next request on (TensorRT's call of
        this name): inputs must then lie in its range, and its layers run the tactics chosen
        at its opt shapes. The switch itself enqueues nothing on ``stream``."""
        index = _profile_index(self.engine, index)
        with self._using():
            if index != self.profile_index:
                self.profile_index = index
                self._checked = None
                self._at_opt()

    def specialize(self, shapes, values=None) -> Specialization:
        """Prepare the run of these input shapes (within the context's profile; shape-tensor
        inputs at these ``values``, else the opt ones): its launches, its kernels loaded
        (from the plan or the kernel cache) or compiled; a server warms a context up with
        its common shapes this way. Runs nothing."""
        with self._using():
            profile = self.engine.profiles[self.profile_index]
            shapes = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
            for name in self.engine.graph.inputs:
                if name not in shapes:
                    raise BindingError(f"specialize: no shape for input {name!r}")
                check_binding(self.engine.profiles, self.profile_index, name, shapes[name])
            values = {**profile.shape_values, **(values or {})}
            profile.check_values(values)
            return self._specialization(shapes, values)

    def _at_opt(self) -> None:
        profile = self.engine.profiles[self.profile_index]
        self._specialization({name: entry[1] for name, entry in profile.shapes.items()}, profile.shape_values)

    # ------------------------------------------------------------------ running

    def execute(self, feeds: Mapping[str, object], device_outputs: bool = False) -> dict:
        """Run synchronously; return the outputs as NumPy arrays (or fresh device arrays)."""
        if self.batch_buckets and isinstance(feeds, Mapping):
            return buckets.run(self, feeds, device_outputs)
        return self.run_unbucketed(feeds, device_outputs)

    def run_unbucketed(self, feeds: Mapping[str, object], device_outputs: bool = False) -> dict:
        if device_outputs:
            outputs = self.execute_async(feeds, self.stream)
            self.stream.synchronize()
            return outputs
        with self._using():
            spec = self._run(self._copy_inputs(feeds, self.stream), self.stream)
            pending = {}
            for name, (kind, value) in spec.outputs.items():
                pending[name] = np.array(value) if kind == "host" else self._staging.download(name, value, self.stream)
            self._done.record(self.stream)
            self.stream.synchronize()
            return {name: np.array(value) for name, value in pending.items()}

    def execute_async(self, feeds: Mapping[str, object], stream=None, outputs: Mapping[str, object] | None = None) -> dict:
        """Enqueue a run on ``stream`` (synchronizing only after data-dependent layers).

        ``outputs`` may give device arrays (of the output's shape and dtype) to write
        outputs into: they are returned as they are; outputs with an output allocator come
        in its memory; the others as fresh device arrays (NumPy arrays for outputs known on
        the host). All are valid once the stream has done the run."""
        from numba import cuda

        stream = self._stream(stream)
        with self._using():
            spec = self._run(self._copy_inputs(feeds, stream), stream, outputs or {})
            given = spec.given_outputs
            results = {}
            for name, (kind, value) in spec.outputs.items():
                target = given.get(name)
                if name in self._allocators:
                    results[name] = outputs_.allocate(self._allocators, self._allocated, name, value, stream)
                    continue
                if kind == "host":
                    if target is not None:
                        target.copy_to_device(np.ascontiguousarray(value, target.dtype), stream=stream)
                    results[name] = target if target is not None else np.array(value)
                elif target is not None:
                    if name not in spec.in_place and value.size:
                        target.copy_to_device(value, stream=stream)
                    results[name] = target
                else:
                    out = cuda.device_array(value.shape, value.dtype, stream=stream)
                    if value.size:
                        out.copy_to_device(value, stream=stream)
                    results[name] = out
            self._done.record(stream)
            for name in given:  # the caller's own objects (a CuPy or PyTorch array stays one)
                results[name] = outputs[name]
            return results

    def set_output_allocator(self, name: str, allocator) -> None:
        """Give output ``name`` an output allocator (TensorRT's ``IOutputAllocator``;
        ``None`` removes it): ``execute_async`` then writes the output into the memory it
        gives, once the run knows the output's shape (:mod:`plugrt.engine.outputs`). How an
        output whose size is data (NonZero's) is written to the caller's memory."""
        outputs = self.engine.graph.outputs
        if name not in outputs:
            raise BindingError(f"output allocator for {name!r}: the model has no such output; its outputs are "
                               f"{', '.join(map(repr, outputs))}")
        self._allocated.pop(name, None)
        if allocator is None:
            self._allocators.pop(name, None)
            return
        outputs_.check_allocator(name, allocator)
        self._allocators[name] = allocator

    def copy_inputs(self, feeds: Mapping[str, object], stream=None) -> Specialization:
        """Check ``feeds``, choose the specialization for their shapes and enqueue the input
        copies (or bind device inputs in place) on ``stream``: the first step of a run."""
        stream = self._stream(stream)
        with self._using():
            return self._copy_inputs(feeds, stream)

    def enqueue(self, stream=None) -> None:
        """Replay the current specialization (inputs already in place) on ``stream``."""
        stream = self._stream(stream)
        with self._using():
            self._run(self.current, stream)
            self._done.record(stream)

    def output_arrays(self) -> dict:
        """The last run's outputs where the context keeps them: device arrays (NumPy arrays
        for outputs known on the host), overwritten by the next run."""
        spec = self.last_run[-1] if self.last_run else self.current
        return {name: value for name, (kind, value) in spec.outputs.items()}

    def _run(self, spec: Specialization, stream, outputs: Mapping[str, object] = {}) -> Specialization:
        """Enqueue ``spec`` and, past each data-dependent layer it ends with, the specialization
        for the sizes that layer reported (read with a sync of ``stream``); return the last."""
        first, self.last_run = spec, [spec]
        while spec.pending is not None:
            spec.run(stream, self)
            spec = self._following(spec, spec.reported_sizes(stream))
            self.last_run.append(spec)
        spec.given_outputs = outputs_.bind_outputs(spec, outputs, spec is not first,
                                                   lambda name, a: self._converted.get(("output", name), a, as_device))
        spec.run(stream, self)
        return spec

    def _copy_inputs(self, feeds: Mapping[str, object], stream) -> Specialization:
        feeds = self._bind(feeds)
        profile = self.engine.profiles[self.profile_index]
        values = {name: host_values(feeds[name]) for name in profile.shape_values}
        profile.check_values(values)
        spec = self._specialization({name: tuple(int(d) for d in feeds[name].shape) for name in feeds}, values)
        self._order_after_last_run(stream)
        for name, view in spec.input_views.items():
            source = feeds[name]
            if name in spec.slots and spec.pending is None:  # (a chain's later launches read the buffer)
                if spec.can_bind(name, source):
                    spec.bind(name, source)
                    continue
                spec.bind(name, None)
            if not view.size:
                continue
            if isinstance(source, np.ndarray):
                self._staging.upload(name, source, view, stream)
            else:
                view.copy_to_device(source, stream=stream)
        return spec

    def _order_after_last_run(self, stream) -> None:
        """A run on another stream than the last waits for the last one, on the device."""
        handle = stream_handle(stream) if not simulated() else id(stream)
        if self._last_stream is not None and handle != self._last_stream:
            self._done.wait(stream)
        self._last_stream = handle

    # ------------------------------------------------------------------ threads and lifetime

    def _using(self):
        ensure_current(self.device_id)
        if self._closed:
            raise PlugrtError("this execution context is closed; create another with "
                              "engine.create_execution_context()")
        if not self._busy.acquire(blocking=False):
            raise PlugrtError("this execution context is running a request on another thread; a context runs one "
                              "request at a time: give each thread its own context (plugrt.engine.ContextPool)")
        return _Release(self._busy)

    def close(self) -> None:
        """Release the context's graphs and device memory (the engine's weights stay)."""
        if self._closed:
            return
        with self._using():
            for spec in self._specs.values():
                spec.close()
            self._specs.clear()
            self._closed = True
        self.current, self.last_run = None, []
        self.arena = self.workspace = None
        self._io.clear()
        self._staging.close()
        if self._capture_stream is not None:
            self._capture_stream.close()
            self._capture_stream = None

    def __enter__(self) -> "ExecutionContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ buffers, streams, graphs

    def io_view(self, name: str, info):
        """A view of binding ``name``'s own buffer (grown when a shape needs more)."""
        from numba import cuda

        shape = tuple(int(d) for d in info.shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * info.dtype.itemsize
        buffer = self._io.get(name)
        if buffer is None or buffer.size < nbytes:
            planned = self.engine.shapes.get("max", {}).get(name)
            largest = int(np.prod(planned, dtype=np.int64)) * info.dtype.itemsize if planned is not None else 0
            buffer = self._io[name] = cuda.device_array(max(nbytes, largest, 1), np.uint8)
        return buffer[:nbytes].view(info.dtype).reshape(shape)

    def capture_stream_handle(self) -> int:
        """The context's capture stream: non-blocking, so that another thread's copies on
        the legacy default stream never join a capture in progress."""
        if self._capture_stream is None:
            self._capture_stream = NonBlockingStream()
        return self._capture_stream.handle

    def make_room_for_graph(self, spec: Specialization) -> None:
        """Drop the least recently used graphs so that ``spec``'s fits in the bound."""
        with_graphs = [s for s in self._specs.values() if s.cuda_graph is not None and s is not spec]
        while len(with_graphs) >= self.max_graphs:
            if not self._warned_graphs:
                self._warned_graphs = True
                log.warning("execution context: more than %d input shapes have CUDA graphs; dropping the least "
                            "recently used (pad inputs to fewer shapes, raise max_graphs, or pass "
                            "use_cuda_graph=False)", self.max_graphs)
            with_graphs.pop(0).drop_graph()

    def _stream(self, stream):
        """The caller's stream as one Numba can enqueue copies on."""
        from numba import cuda

        if stream is None:
            return self.stream
        if simulated():
            if hasattr(stream, "synchronize") and not isinstance(stream, (str, bytes)):
                return stream
            if isinstance(stream, int) and not isinstance(stream, bool):
                return cuda.stream()  # the simulator runs everything in order anyway
            raise BindingError(f"stream must be a CUDA stream or a stream handle (int), got {type(stream).__name__}")
        if type(stream).__module__.startswith("numba"):
            return stream
        try:
            handle = stream_handle(stream)
        except TypeError:
            raise BindingError(f"stream must be a CUDA stream (Numba, CuPy, PyTorch, cuda.core) or a stream handle "
                               f"(int), got {type(stream).__name__}") from None
        if not handle:
            return cuda.default_stream()
        external = self._external.get(handle)
        if external is None:
            if len(self._external) > 64:
                self._external.clear()
            external = self._external[handle] = cuda.external_stream(handle)
        return external

    # ------------------------------------------------------------------ feeds and specializations

    def _bind(self, feeds: Mapping[str, object]) -> dict:
        """Check the feeds; device objects (``__cuda_array_interface__``) stay on the device,
        contiguous (a strided one is made contiguous first, as a strided NumPy array is)."""
        graph = self.engine.graph
        if not isinstance(feeds, Mapping):
            raise BindingError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}; "
                               f"pass {{{', '.join(f'{n!r}: ...' for n in graph.inputs)}}}")
        bound = {}
        for name, value in feeds.items():
            if not isinstance(name, str):
                raise BindingError(f"input binding {name!r}: names are str; the inputs are "
                                   f"{', '.join(map(repr, graph.inputs))}")
            bound[name] = self._converted.get(name, value, as_bindable)
        # The same names, dtypes and shapes as the last run's pass the same checks: a server
        # feeding one shape pays them once, not per request (host time of execute_async).
        signature = tuple((name, array.dtype, tuple(array.shape)) for name, array in bound.items())
        if signature != self._checked:
            check_inputs({name: graph.info(name) for name in graph.inputs}, bound)
            for name in graph.inputs:
                check_binding(self.engine.profiles, self.profile_index, name, tuple(int(d) for d in bound[name].shape))
            self._checked = signature
        return bound

    def _specialization(self, shapes: Mapping[str, tuple], values: Mapping[str, object]) -> Specialization:
        key = (self.profile_index,) + tuple((name, tuple(shapes[name])) for name in self.engine.graph.inputs)
        if values:
            key += tuple((name, np.asarray(values[name]).tobytes()) for name in sorted(values))
        self.current = self._kept(key, lambda: Specialization(self, dict(shapes), values))
        return self.current

    def _following(self, spec: Specialization, sizes: dict) -> Specialization:
        """The specialization after ``spec``'s data-dependent layer for the sizes it reported."""
        key = spec.key + (tuple((name, tuple(map(tuple, shapes))) for name, shapes in sorted(sizes.items())),)
        return self._kept(key, lambda: spec.following(self, sizes))

    def _kept(self, key: tuple, make) -> Specialization:
        spec = self._specs.get(key)
        if spec is None:
            spec = make()
            spec.key = key
            self._specs[key] = spec
            while len(self._specs) > self.max_specializations:
                if not self._warned_specs:
                    self._warned_specs = True
                    log.warning("execution context: more than %d input shapes seen; dropping the least recently "
                                "used one's prepared launches (each comes back at a host cost: raise "
                                "max_specializations, or pad requests to fewer shapes with batch_buckets)",
                                self.max_specializations)
                _, oldest = self._specs.popitem(last=False)
                oldest.close()
        else:
            self._specs.move_to_end(key)
        return spec



class _Release:
    def __init__(self, lock):
        self._lock = lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._lock.release()



def host_seconds_per_launch(context: ExecutionContext, repeats: int = 200) -> float:
    """Host time to enqueue one prebuilt launch of the current specialization (directly)."""
    spec = context.current
    if not spec.launches:
        return 0.0
    import time

    started = time.perf_counter()
    for _ in range(repeats):
        for launch in spec.launches:
            launch(context.stream)
    elapsed = time.perf_counter() - started
    context.stream.synchronize()
    return elapsed / (repeats * len(spec.launches))


__all__ = ["ExecutionContext", "Specialization", "host_seconds_per_launch", "MAX_GRAPHS"]
