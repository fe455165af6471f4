"""A specialization: an engine bound to one set of input shapes in one context.

It holds the concrete graph (shape computations done on the host), a device array per
tensor (a view into the context's arena, a weight, an uploaded host value, or one of the
context's input/output buffers), and every layer's launches, prepared once
(:mod:`plugrt.launcher`). :meth:`Specialization.run` replays them: directly the first
time, then as one CUDA graph (:mod:`plugrt.engine.graphs`) when the context allows.

Bindings. Graph inputs and outputs live in buffers of their own (never shared with
another tensor), so every kernel parameter that points into one is known
(:attr:`slots`). :meth:`bind` moves an input or output to the caller's memory by rewriting
those parameters, in the prepared launches and in the captured graph's nodes, instead of
copying the data or capturing again.

Alias layers (:mod:`plugrt.engine.aliases`) launch nothing: their outputs are views of
their owner's array (:attr:`shared`), reshaped. A name in an engine input's group points
into that input's buffer, and a root an engine output took over into the output's, so
binding moves them with the binding.
"""

from __future__ import annotations

import math
import time
from typing import Mapping

import numpy as np

from plugrt.device import simulated
from plugrt.engine.aliases import storage
from plugrt.engine.graphs import capture
from plugrt.engine.shared_shapes import shape_key, shared_shape
from plugrt.errors import PlugrtError
from plugrt.ir.specialize import concretize, is_host_node
from plugrt.launcher import PreparedLaunch, stream_handle
from plugrt.tuning.kernel_keys import launch_keys, layer_key

#: A caller's buffer is bound in place only at this alignment (what cudaMalloc gives, and
#: what the context's own buffers have; tactics may have chosen vector widths for it).
BIND_ALIGNMENT = 256


class Specialization:
    """The engine bound to one set of input shapes: tensor arrays and prepared launches."""

    def __init__(self, context, shapes: dict, values: Mapping[str, object], sizes: Mapping | None = None,
                 start: int = 0):
        engine = context.engine
        self.label = ", ".join(f"{name}{list(shape)}" for name, shape in shapes.items()) or "no inputs"
        self.shapes, self.values, self.sizes = shapes, values, dict(sizes or {})
        #: The engine's context-free part of these shapes' preparation, which the engine's
        #: other contexts share (:mod:`plugrt.engine.shared_shapes`).
        share = shared_shape(engine, shape_key(context.profile_index, shapes, values, self.sizes, start),
                             lambda: concretize(engine.graph, shapes, engine.registry, values, self.sizes))
        self.graph = graph = share.graph
        #: A data-dependent layer (:meth:`plugrt.plugin.OpPlugin.output_bounds`) whose sizes
        #: this specialization does not know ends it: ``(its position in engine.layers, its
        #: node)``; the layers after it run in the specialization for the sizes it reports
        #: (:meth:`following`). ``None`` for the last of a run's specializations.
        self.pending: tuple | None = None
        self.reported = self._reported_host = None  # (the shapes it reports: device, host)
        self._uploads: dict = {}
        self._own: dict = {}
        aliases = {layer.node_index: layer.alias for layer in engine.layers if layer.alias is not None}
        #: Each name that is a view of another's array (alias layers' outputs; a root an
        #: engine output took over) -> that name.
        self.shared = storage(graph, aliases, [layer.node_index for layer in engine.layers])
        self._sources = {graph.nodes[index].outputs[0]: graph.nodes[index].inputs[k] for index, k in aliases.items()}
        self.io = {name: context.io_view(name, graph.info(name)) for name in _bindable(graph)}
        self.input_views = {name: self._view(context, name) for name in graph.inputs}
        self.launches: list[PreparedLaunch] = []
        self.layer_launches: list[tuple[str, int, int]] = []
        profile = engine.profiles[context.profile_index]
        #: At the profile's opt shapes the layers run their tuned tactics, else their generic
        #: ones (:mod:`plugrt.engine.generic`).
        #: (The tuned tactics were chosen at the opt values of shape-tensor inputs and at the
        #: bounds of data-dependent sizes.)
        tuned_at = all(np.asarray(values.get(name, ())).reshape(-1).tolist() == list(opt)
                       for name, opt in profile.shape_values.items()) \
            and all([tuple(s) for s in shapes_] == graph.data_dependent[name] for name, shapes_ in self.sizes.items())
        self.at_opt = tuned_at and all(tuple(shapes.get(name, ())) == tuple(entry[1])
                                       for name, entry in profile.shapes.items())
        #: Which of the engine's specialized shapes these are (``--specialize-shapes``), if any.
        self.special = next((k for k, entry in enumerate(engine.specialized) if entry["profile"] == context.profile_index
                             and all(tuple(shapes.get(n, ())) == tuple(s) for n, s in entry["shapes"].items())),
                            None) if tuned_at else None
        #: Each launching layer's tactic name (the context's profile's choice).
        self.tactics: dict[str, str] = {}
        started = time.perf_counter()
        for position, layer in enumerate(engine.layers[start:], start):
            node = graph.nodes[layer.node_index]
            if is_host_node(graph, node):
                continue
            if layer.alias is not None:
                self._check_alias(node, layer.alias)
                continue
            ins = [self._tensor(context, name) if name else None for name in node.inputs]
            outs = [self._view(context, name) if name else None for name in node.outputs]
            reports = node.name in graph.data_dependent and node.name not in self.sizes
            if all(o is None or o.size == 0 for o in outs) and not reports:
                continue
            tactic = share.tactics.get(position)
            if tactic is None:
                tactic = share.tactics[position] = find_tactic(engine.registry, node, graph,
                                                               self._tactic_of(layer, context.profile_index))
            workspace = self._workspace(context, tactic.workspace_bytes, node.name)
            if reports:
                self.pending = (position, node)
                self.reported = self._own["reported"] = _device_zeros(size_slots(graph, node))
                outs.append(self.reported)
            try:
                key = layer_key(engine.registry, node, graph, tactic)
                made = tactic.launches(ins, outs, workspace)
                launches = [PreparedLaunch(launch, k) for launch, k in zip(made, launch_keys(key, made))]
            except PlugrtError:
                raise
            except Exception as exc:
                raise PlugrtError(f"{node.describe()}: tactic {tactic.name!r} of plugin {layer.plugin!r} failed "
                                  f"to prepare its launches: {type(exc).__name__}: {exc}") from exc
            self.layer_launches.append((node.name, len(self.launches), len(self.launches) + len(launches)))
            self.tactics[node.name] = tactic.name
            self.launches.extend(launches)
            if self.pending is not None:
                break
        self.prepare_seconds = time.perf_counter() - started
        self.outputs = {}
        for name in graph.outputs if self.pending is None else ():
            known = self._known(name) if name not in graph.inputs else None
            if known is not None:
                self.outputs[name] = ("host", known)
            else:
                self.outputs[name] = ("device", self._tensor(context, name))
        #: Raw launches only (on a GPU): what graphs and in-place binding need.
        self.raw = bool(self.launches) and all(launch.raw for launch in self.launches)
        self.slots = self._binding_slots() if self.raw else {}
        self.bound = {name: _address(view) for name, view in self.io.items()} if self.raw else {}
        #: Output buffers the caller gave for the run being enqueued, and those bound in place.
        self.given_outputs: dict = {}
        self.in_place: set = set()
        self._holding: dict = {}
        self.runs = 0
        self.cuda_graph = None
        self._graph_failed = False

    def _tactic_of(self, layer, profile: int) -> dict:
        """The layer's tuned tactic at the profile's opt shapes, its specialized one at a
        specialized shape, else its generic one."""
        if self.at_opt:
            return layer.tactic_for(profile)
        if self.special is not None and layer.specialized_tactics:
            return layer.specialized_tactics[self.special]
        return layer.generic_for(profile)

    # ------------------------------------------------------------------ running

    def run(self, stream, context) -> None:
        """Enqueue the launches on ``stream``: as a CUDA graph from the second run on, when
        the context uses graphs and capture works; directly otherwise."""
        self.runs += 1
        if self.cuda_graph is None and self.runs > 1 and context.use_cuda_graph and self.raw \
                and not self._graph_failed:
            context.make_room_for_graph(self)
            self.cuda_graph = capture(self.launches, context.capture_stream_handle(), f"shapes {self.label}")
            self._graph_failed = self.cuda_graph is None
        if self.cuda_graph is not None:
            self.cuda_graph.launch(stream_handle(stream))
            return
        for launch in self.launches:
            launch(stream)

    def reported_sizes(self, stream) -> dict:
        """After this specialization ran on ``stream``: the pending layer's outputs' actual
        shapes, read on the host (a synchronization of the run), with every size known so
        far; what :meth:`following` is keyed by."""
        from numba import cuda

        _, node = self.pending
        if self._reported_host is None:
            count = self.reported.shape
            self._reported_host = np.empty(count, np.int64) if simulated() else cuda.pinned_array(count, np.int64)
        host = self._reported_host
        self.reported.copy_to_host(host, stream=stream)
        stream.synchronize()
        bounds = self.graph.data_dependent[node.name]
        shapes, at = [], 0
        for bound in bounds:
            shapes.append(tuple(int(d) for d in host[at:at + len(bound)]))
            at += len(bound)
        if any(not 0 <= d <= m for s, b in zip(shapes, bounds) for d, m in zip(s, b)):
            raise PlugrtError(f"{node.describe()}: its tactic reported output shapes {[list(s) for s in shapes]}, "
                              f"outside the bounds {[list(b) for b in bounds]} its plugin's output_bounds() gave; "
                              "the plugin is at fault")
        return {**self.sizes, node.name: shapes}

    def following(self, context, sizes: dict) -> "Specialization":
        """The specialization of the layers after the pending one, for these sizes."""
        return Specialization(context, self.shapes, self.values, sizes, self.pending[0] + 1)

    def chain(self, context, rule: str = "max"):
        """The specializations after this one where every data-dependent layer reports the
        sizes ``rule`` gives (:data:`plugrt.ir.infer.SIZE_RULES`): what a plan's kernels
        must cover. Nothing runs."""
        engine, spec = context.engine, self
        ruled = concretize(engine.graph, self.shapes, engine.registry, self.values, rule)
        while spec.pending is not None:
            _, node = spec.pending
            bounds = spec.graph.data_dependent[node.name]
            shapes = [ruled.info(name).shape if name else bound for name, bound in zip(node.outputs, bounds)]
            spec = spec.following(context, {**spec.sizes, node.name: shapes})
            yield spec

    def drop_graph(self) -> None:
        if self.cuda_graph is not None:
            self.cuda_graph.close()
            self.cuda_graph = None

    def close(self) -> None:
        self.drop_graph()
        self.launches = []
        self._uploads.clear()
        self._own.clear()
        self._holding.clear()

    # ------------------------------------------------------------------ bindings

    def can_bind(self, name: str, array) -> bool:
        """Whether ``array`` (a C-contiguous device array) can stand in for binding ``name``."""
        if name not in self.slots or array.size == 0:
            return False
        address = _device_address(array)
        return address is not None and address % BIND_ALIGNMENT == 0

    def bind(self, name: str, array=None) -> None:
        """Point binding ``name`` at ``array`` (``None``: back at the context's own buffer)."""
        address = _device_address(self.io[name] if array is None else array)
        if self.bound[name] == address:
            return
        graph = self.cuda_graph
        patched = set()
        for index, slot, offset in self.slots[name]:
            self.launches[index].set_pointer(slot, address + offset)
            patched.add(index)
        if graph is not None:
            if graph.patchable:
                for index in sorted(patched):
                    graph.patch(index, self.launches[index])
            else:
                self.drop_graph()  # captured again at the next run
        self.bound[name] = address
        if array is None:
            self._holding.pop(name, None)
        else:
            self._holding[name] = array  # alive while the launches point at it

    def _binding_slots(self) -> dict[str, list[tuple[int, int, int]]]:
        """For each input and output buffer: ``(launch, parameter slot, byte offset)`` of
        every kernel parameter pointing into it."""
        ranges = [(name, _address(view), int(view.size) * view.dtype.itemsize) for name, view in self.io.items()]
        slots: dict[str, list] = {name: [] for name, _, size in ranges if size}
        for index, launch in enumerate(self.launches):
            for slot, pointer in launch.pointers():
                for name, base, size in ranges:
                    if size and base <= pointer < base + size:
                        slots[name].append((index, slot, pointer - base))
                        break
        return slots

    # ------------------------------------------------------------------ tensors

    def _tensor(self, context, name: str):
        """The device array holding ``name``: a weight, an uploaded host value, or a view."""
        value = self.graph.values[name]
        if value.const is not None:
            weight = context.weights.get(name)
            return weight if weight is not None else self._upload(name, value.const)
        known = self._known(name) if name not in self.graph.inputs else None
        if known is not None:
            return self._upload(name, known)
        return self._view(context, name)

    def _known(self, name: str):
        """``name``'s value where the host knows it at these shapes: its own, or that of the
        source of the alias layers making it (never a weight's: the view of it serves)."""
        info = self.graph.info(name)
        source = name
        while info.value is None and source in self._sources:
            source = self._sources[source]
            if self.graph.values[source].const is not None:
                return None
            value = self.graph.info(source).value
            if value is not None:
                return np.reshape(value, tuple(int(d) for d in info.shape))
        return info.value

    def _check_alias(self, node, source: int) -> None:
        """An alias layer's output holds exactly its source's bytes at these shapes too."""
        src, out = self.graph.info(node.inputs[source]), self.graph.info(node.outputs[0])
        if src.dtype != out.dtype or int(np.prod(src.shape, dtype=np.int64)) != int(np.prod(out.shape, dtype=np.int64)):
            raise PlugrtError(f"{node.describe()}: runs as an alias of input {source}, but at shapes {self.label} "
                              f"output 0 is {out.dtype}{list(out.shape)} and the input {src.dtype}{list(src.shape)}; "
                              "its plugin's aliases() must hold at every shape of the profile")

    def _workspace(self, context, nbytes: int, layer: str):
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

    def _view(self, context, name: str):
        """An input's or output's own buffer, a view into the arena at the planned offset,
        or an own allocation."""
        from numba import cuda

        if name in self.io:
            return self.io[name]
        info = self.graph.info(name)
        shape = tuple(int(d) for d in info.shape)
        owner = self.shared.get(name)
        if owner is not None:
            return self._tensor(context, owner).reshape(shape)
        nbytes = math.prod(shape) * info.dtype.itemsize
        offset = context.engine.offsets.get(name)
        planned = context.engine.shapes.get("max", {}).get(name)
        fits = planned is not None and nbytes <= math.prod(int(d) for d in planned) * info.dtype.itemsize
        if offset is None or nbytes == 0 or not fits:
            if name not in self._own:
                self._own[name] = cuda.device_array(shape, info.dtype)
            return self._own[name]
        return arena_view(context.arena, offset, nbytes, info.dtype, shape)


def arena_view(arena, offset: int, nbytes: int, dtype, shape: tuple):
    """``arena[offset:offset + nbytes]`` as a C-contiguous array of ``dtype`` and ``shape``.

    On a GPU one Numba device array is made over a view of the arena's memory: slicing,
    then ``view`` and ``reshape``, makes three, each computing its extents in Python, and a
    new shape's specialization makes one for most of its tensors. (The simulator's arrays
    are NumPy's, sliced as they are.)"""
    if simulated():
        return arena[offset:offset + nbytes].view(dtype).reshape(shape)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    from plugrt.kernels import c_strides

    dtype = np.dtype(dtype)
    strides = tuple(int(s) * dtype.itemsize for s in c_strides(shape))
    return DeviceNDArray(shape, strides, dtype, gpu_data=arena.gpu_data.view(offset, offset + nbytes))


def size_slots(graph, node) -> int:
    """How many int64s a data-dependent node's tactic writes its outputs' shapes into."""
    return sum(len(bound) for bound in graph.data_dependent[node.name])


def _device_zeros(count: int):
    from numba import cuda

    return cuda.to_device(np.zeros(max(count, 1), np.int64))


def _bindable(graph) -> list[str]:
    """The inputs and the device outputs: the tensors a caller binds."""
    names = list(graph.inputs)
    for name in graph.outputs:
        info = graph.info(name)
        if name not in names and (info.value is None or name in graph.inputs) and graph.values[name].const is None:
            names.append(name)
    return names


def _device_address(array) -> int | None:
    """A device array's data address (Numba's arrays without building their interface)."""
    pointer = getattr(array, "device_ctypes_pointer", None)
    if pointer is not None:
        return int(pointer.value or 0)
    interface = getattr(array, "__cuda_array_interface__", None)
    return None if interface is None else int(interface["data"][0] or 0)


def _address(array) -> int:
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:  # the simulator's arrays
        interface = array.__array_interface__ if hasattr(array, "__array_interface__") else \
            np.asarray(array).__array_interface__
    return int(interface["data"][0] or 0)


def find_tactic(registry, node, graph, identity: dict):
    """The tactic a plan recorded (the owner's, or the contributing plugin's it names), made
    again for these concrete shapes."""
    op = registry.op(node)
    ins = [graph.info(name) if name else None for name in node.inputs]
    outs = [graph.info(name) for name in node.outputs if name]
    chosen = None
    for wanted in (identity, None):  # (its supplier asked for it alone; else every tactic)
        offered = registry.tactics(op, node, ins, outs, wanted=wanted)
        tactics = [t for t in offered if t.provider == identity.get("provider")] or offered
        named = [t for t in tactics if t.name == identity["name"]]
        exact = [t for t in named if dict(t.params) == identity["params"]]
        chosen = (exact or named or ([] if wanted else tactics) or [None])[0]
        if chosen is not None:
            break
    if chosen is None:
        raise PlugrtError(f"{node.describe()}: plugin {type(op).__name__} offers no CUDA tactic for these shapes")
    return chosen


__all__ = ["Specialization", "arena_view", "find_tactic", "BIND_ALIGNMENT"]
