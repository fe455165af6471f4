"""Execution contexts: an engine's activation arena and workspace, bound to a stream.

A context specializes the engine for each set of input shapes it sees (within the
profile): it infers concrete shapes (shape computations run on the host there), binds
every tensor to a view into the arena, asks each layer's tactic for its launches and
prebuilds them (:mod:`plugrt.launcher`). ``execute`` then copies the inputs in,
replays the launches and copies the outputs out. Several contexts of one engine share
its weights and run concurrently on their own streams.
"""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np

from plugrt.bindings import check_inputs
from plugrt.launcher import PreparedLaunch
from plugrt.ir.specialize import concretize, is_host_node
from plugrt.tuning.kernel_keys import layer_key
from plugrt.errors import BindingError, PlugrtError


class ExecutionContext:
    """Runs an engine; not thread-safe (use one context per thread or stream)."""

    def __init__(self, engine, stream=None, use_cuda_graph: bool = True):
        from numba import cuda

        self.engine = engine
        self.use_cuda_graph = use_cuda_graph
        self.stream = stream if stream is not None else cuda.stream()
        self.arena = cuda.device_array(max(engine.arena_bytes, 1), np.uint8)
        self.workspace = cuda.device_array(engine.workspace_bytes, np.uint8) if engine.workspace_bytes else None
        self.weights = engine.device_weights()
        self._specs: dict[tuple, Specialization] = {}
        self.current: Specialization | None = None
        opt = {name: entry[1] for name, entry in engine.profile.shapes.items()}
        self.current = self._specialization(opt, engine.profile.shape_values)

    # ------------------------------------------------------------------ running

    def execute(self, feeds: Mapping[str, object], device_outputs: bool = False) -> dict:
        """Run synchronously; return the outputs as NumPy arrays (or fresh device arrays)."""
        if device_outputs:
            outputs = self.execute_async(feeds, self.stream)
            self.stream.synchronize()
            return outputs
        spec = self._run(feeds, self.stream)
        self.stream.synchronize()
        return {name: np.array(value) if kind == "host" else value.copy_to_host()
                for name, (kind, value) in spec.outputs.items()}

    def execute_async(self, feeds: Mapping[str, object], stream=None) -> dict:
        """Enqueue a run on ``stream``; return fresh device arrays for the outputs
        (NumPy arrays for outputs known on the host), valid once the stream is done."""
        from numba import cuda

        stream = self._stream(stream)
        spec = self._run(feeds, stream)
        results = {}
        for name, (kind, value) in spec.outputs.items():
            if kind == "host":
                results[name] = np.array(value)
                continue
            out = cuda.device_array(value.shape, value.dtype, stream=stream)
            if value.size:
                out.copy_to_device(value, stream=stream)
            results[name] = out
        return results

    def _run(self, feeds: Mapping[str, object], stream) -> "Specialization":
        """Check and copy in the inputs, then enqueue the launches; outputs stay in the arena."""
        spec = self.copy_inputs(feeds, stream)
        spec.enqueue(stream)
        return spec

    def copy_inputs(self, feeds: Mapping[str, object], stream=None) -> "Specialization":
        """Check ``feeds``, choose the specialization for their shapes and enqueue the input
        copies on ``stream`` (the first step of :meth:`execute_async`)."""
        stream = self._stream(stream)
        feeds = self._bind(feeds)
        values = {name: _host(feeds[name]) for name in self.engine.profile.shape_values}
        spec = self._specialization({name: tuple(int(d) for d in feeds[name].shape) for name in feeds}, values)
        for name, view in spec.input_views.items():
            source = feeds[name]
            if view.size:
                view.copy_to_device(np.ascontiguousarray(source) if isinstance(source, np.ndarray) else source,
                                    stream=stream)
        return spec

    def output_arrays(self) -> dict:
        """The current specialization's outputs where the context keeps them: device arrays
        (NumPy arrays for outputs known on the host), overwritten by the next run."""
        return {name: value for name, (kind, value) in self.current.outputs.items()}

    def close(self) -> None:
        """Release the context's device memory."""
        self._specs.clear()
        self.current = None
        self.arena = self.workspace = None

    def __enter__(self) -> "ExecutionContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def enqueue(self, stream=None) -> None:
        """Replay the current specialization's launches on inputs already in place."""
        self.current.enqueue(self._stream(stream))

    def _stream(self, stream):
        if stream is None:
            return self.stream
        if isinstance(stream, int) and not isinstance(stream, bool):
            from numba import cuda

            return cuda.external_stream(stream)
        if not hasattr(stream, "synchronize"):
            raise BindingError(f"stream must be a Numba CUDA stream or a stream handle (int), got "
                               f"{type(stream).__name__}")
        return stream

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
            bound[name] = _as_bindable(name, value)
        check_inputs({name: graph.info(name) for name in graph.inputs}, bound)
        for name in graph.inputs:
            self.engine.profile.check(name, tuple(int(d) for d in bound[name].shape))
        return bound

    # ------------------------------------------------------------------ specializations

    def _specialization(self, shapes: Mapping[str, tuple], values: Mapping[str, object]) -> "Specialization":
        key = tuple((name, tuple(shapes[name])) for name in self.engine.graph.inputs)
        key += tuple((name, np.asarray(values[name]).tobytes()) for name in sorted(values))
        spec = self._specs.get(key)
        if spec is None:
            spec = Specialization(self, dict(shapes), values)
            self._specs[key] = spec
        self.current = spec
        return spec


class Specialization:
    """The engine bound to one set of input shapes: tensor views and prebuilt launches."""

    def __init__(self, context: ExecutionContext, shapes: dict, values: Mapping[str, object]):
        from numba import cuda

        engine = context.engine
        self.graph = graph = concretize(engine.graph, shapes, engine.registry, values)
        self._uploads: dict = {}
        self._own: dict = {}
        self.input_views = {name: self._view(context, name) for name in graph.inputs}
        self.launches: list[PreparedLaunch] = []
        self.layer_launches: list[tuple[str, int, int]] = []
        started = time.perf_counter()
        for layer in engine.layers:
            node = graph.nodes[layer.node_index]
            if is_host_node(graph, node):
                continue
            ins = [self._tensor(context, name) if name else None for name in node.inputs]
            outs = [self._view(context, name) if name else None for name in node.outputs]
            if all(o is None or o.size == 0 for o in outs):
                continue
            tactic = _find_tactic(engine.registry, node, graph, layer.tactic)
            workspace = self._workspace(context, tactic.workspace_bytes, node.name)
            try:
                key = layer_key(engine.registry, node, graph, tactic)
                launches = [PreparedLaunch(launch, None if key is None else f"{key}/{index}")
                            for index, launch in enumerate(tactic.launches(ins, outs, workspace))]
            except PlugrtError:
                raise
            except Exception as exc:
                raise PlugrtError(f"{node.describe()}: tactic {tactic.name!r} of plugin {layer.plugin!r} failed "
                                  f"to prepare its launches: {type(exc).__name__}: {exc}") from exc
            self.layer_launches.append((node.name, len(self.launches), len(self.launches) + len(launches)))
            self.launches.extend(launches)
        self.prepare_seconds = time.perf_counter() - started
        self.outputs = {}
        for name in graph.outputs:
            info = graph.info(name)
            if info.value is not None and name not in graph.inputs:
                self.outputs[name] = ("host", info.value)
            else:
                self.outputs[name] = ("device", self._tensor(context, name))

    def enqueue(self, stream) -> None:
        for launch in self.launches:
            launch(stream)

    # ------------------------------------------------------------------ binding tensors

    def _tensor(self, context: ExecutionContext, name: str):
        """The device array holding ``name``: a weight, an uploaded host value, or a view."""
        value = self.graph.values[name]
        if value.const is not None:
            weight = context.weights.get(name)
            return weight if weight is not None else self._upload(name, value.const)
        if value.info.value is not None and name not in self.graph.inputs:
            return self._upload(name, value.info.value)
        return self._view(context, name)

    def _workspace(self, context: ExecutionContext, nbytes: int, layer: str):
        """The context's workspace cut to ``nbytes``; an own one if this shape needs more."""
        from numba import cuda

        if not nbytes:
            return None
        if context.workspace is not None and context.workspace.size >= nbytes:
            return context.workspace[:nbytes]
        key = f"workspace/{layer}"
        if key not in self._own:
            self._own[key] = cuda.device_array(nbytes, np.uint8)
        return self._own[key]

    def _upload(self, name: str, array: np.ndarray):
        from numba import cuda

        if name not in self._uploads:
            self._uploads[name] = cuda.to_device(np.ascontiguousarray(array))
        return self._uploads[name]

    def _view(self, context: ExecutionContext, name: str):
        """A view into the arena at the planned offset, or an own allocation."""
        from numba import cuda

        info = self.graph.info(name)
        shape = tuple(int(d) for d in info.shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * info.dtype.itemsize
        offset = context.engine.offsets.get(name)
        planned = context.engine.shapes.get("max", {}).get(name)
        fits = planned is not None and nbytes <= int(np.prod(planned, dtype=np.int64)) * info.dtype.itemsize
        if offset is None or nbytes == 0 or not fits:
            if name not in self._own:
                self._own[name] = cuda.device_array(shape, info.dtype)
            return self._own[name]
        return context.arena[offset:offset + nbytes].view(info.dtype).reshape(shape)


def _as_bindable(name: str, value):
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
    if hasattr(value, "__cuda_array_interface__"):
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


def _host(value) -> np.ndarray:
    """A shape-tensor input's values on the host."""
    return value if isinstance(value, np.ndarray) else value.copy_to_host()


def _find_tactic(registry, node, graph, identity: dict):
    """The tactic a plan recorded (the owner's, or the contributing plugin's it names), made
    again for these concrete shapes."""
    op = registry.op(node)
    ins = [graph.info(name) if name else None for name in node.inputs]
    outs = [graph.info(name) for name in node.outputs if name]
    offered = registry.tactics(op, node, ins, outs)
    tactics = [t for t in offered if t.provider == identity.get("provider")] or offered
    named = [t for t in tactics if t.name == identity["name"]]
    exact = [t for t in named if dict(t.params) == identity["params"]]
    chosen = (exact or named or tactics or [None])[0]
    if chosen is None:
        raise PlugrtError(f"{node.describe()}: plugin {type(op).__name__} offers no CUDA tactic for these shapes")
    return chosen


def host_seconds_per_launch(context: ExecutionContext, repeats: int = 200) -> float:
    """Host time to enqueue one prebuilt launch of the current specialization."""
    spec = context.current
    if not spec.launches:
        return 0.0
    started = time.perf_counter()
    for _ in range(repeats):
        spec.enqueue(context.stream)
    elapsed = time.perf_counter() - started
    context.stream.synchronize()
    return elapsed / (repeats * len(spec.launches))


__all__ = ["ExecutionContext", "Specialization", "host_seconds_per_launch"]
