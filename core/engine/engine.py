"""The engine: a built network ready to run, and its plan-file form.

An :class:`Engine` holds the graph, the profile, one :class:`LayerRecord` per device
layer (which plugin and tactic runs it), the activation memory plan and the weights.
``serialize``/``save`` write a plan file (JSON header, raw arrays, checksum; no pickle);
``Engine.deserialize``/``Engine.load`` read one and check that every plugin it needs is
installed at a compatible version. Weights go to the GPU once, when the first execution
context is made.

Plugin compatibility: each layer (and each part of a fused layer) records the plugin, its
distribution and version, and the op's own ``version``. A plan loads when the op comes
from the same distribution, at the same op version, in the same release series
(``major.minor``) of that distribution: a patch release (``1.2.0`` -> ``1.2.3``) with
unchanged op versions loads, with a warning. Anything else is refused with
``pip install DIST==VERSION`` of the recorded release. The op version is what an op's
author bumps when a plan's recorded data would mean something else (math, attributes,
serialized data, tactic names and parameters).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import asdict, dataclass, replace

import numpy as np

from plugrt import __version__
from plugrt.device import describe as describe_device
from plugrt.engine.graph_io import graph_from_json, graph_to_json
from plugrt.engine.plan_file import decode_plan, encode_plan, read_plan, write_plan
from plugrt.engine.profile import OptimizationProfile
from plugrt.engine import plan_checks, plan_kernels
from plugrt.engine.plan_schema import check_header
from plugrt.errors import PlanError
from plugrt.fusion.op import body_nodes, is_fused
from plugrt.fusion.op import label as fused_label
from plugrt.ir.dims import format_shape

ENGINE_FORMAT = "plugrt-engine/1"
#: A layer's tensor format unless its tactic's ``params["format"]`` says another
#: (``"channels_last"``): linear, the model's own row-major layout.
LINEAR = "linear"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerRecord:
    """One device layer: the graph node it runs and the plugin tactic that runs it."""

    node_index: int
    tactic: dict
    workspace_bytes: int
    plugin: str
    distribution: str | None
    distribution_version: str | None
    op_version: str
    #: The tactic's median time at opt shapes when it was timed (from the timing cache).
    time_ms: float | None = None
    #: The second fastest verified tactic when timed: ``{"name", "params", "time_ms"}``.
    runner_up: dict | None = None
    #: Who contributed the tactic when not the op's own plugin (``Tactic.source``:
    #: ``{"plugin", "distribution", "version", "provider_version"}``).
    tactic_provider: dict | None = None
    #: A layout layer run as an alias (:mod:`plugrt.engine.aliases`): the input whose bytes
    #: its output 0 is; it launches nothing (``tactic`` is ``{"name": "alias", ...}``).
    alias: int | None = None
    #: The tactic chosen at each later optimization profile's opt shapes (profile 1, 2,
    #: ...); ``None`` with one profile.
    profile_tactics: list | None = None
    #: Per profile, the tactic run at shapes other than its opt shapes where it is not the
    #: tuned one (``None``: the tuned one; :mod:`plugrt.engine.generic`).
    generic_tactics: list | None = None
    #: The tactic chosen at each of the engine's specialized shapes (:attr:`Engine.specialized`).
    specialized_tactics: list | None = None

    def tactic_for(self, profile: int) -> dict:
        """The tactic this layer runs in optimization profile ``profile`` at its opt shapes."""
        return self.tactic if profile == 0 or not self.profile_tactics else self.profile_tactics[profile - 1]

    def generic_for(self, profile: int) -> dict:
        """The tactic this layer runs in profile ``profile`` at any other shape."""
        found = self.generic_tactics[profile] if self.generic_tactics else None
        return found or self.tactic_for(profile)

    def with_generic(self, tactics: list) -> "LayerRecord":
        return replace(self, generic_tactics=list(tactics))


class Engine:
    """A built engine. Make one with :class:`plugrt.engine.Builder` or :meth:`load`."""

    def __init__(self, graph, profile: OptimizationProfile, layers: list[LayerRecord], offsets: dict[str, int],
                 arena_bytes: int, workspace_bytes: int, registry, shapes: dict | None = None, device: dict | None = None,
                 passes: list | None = None, precision: dict | None = None, profiles: list | None = None,
                 specialized: list | None = None):
        self.graph = graph
        #: Every optimization profile, in the order the config added them (a context
        #: selects one); ``profile`` is the first.
        self.profiles = list(profiles) if profiles else [profile]
        self.profile = self.profiles[0]
        #: Shapes the layers were also tuned at (``--specialize-shapes``): ``{"profile": index,
        #: "shapes": {input: shape}}`` each; a context runs those tactics at exactly them.
        self.specialized = list(specialized or [])
        self.layers = layers
        self.offsets = offsets
        self.arena_bytes = arena_bytes
        self.workspace_bytes = workspace_bytes
        self.registry = registry
        self.shapes = shapes or {}
        self.device = device or describe_device()
        #: What each graph pass did at build time (``PassResult.as_json``).
        self.passes = passes or []
        #: What the precision step chose, and the build's accuracy check
        #: (:meth:`plugrt.engine.precision.PrecisionReport.as_json`); ``None``: every layer
        #: as the model typed it.
        self.precision = precision
        self._weights: dict[int, dict] = {}  # device id -> {initializer name: device array}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ bindings

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    @property
    def weight_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.graph.initializers().values())

    def device_weights(self) -> dict:
        """The initializers on the current device, uploaded once per device and shared by its contexts."""
        from plugrt.device import current_device_id

        device = current_device_id()
        with self._lock:
            if device not in self._weights:
                from numba import cuda

                self._weights[device] = {name: cuda.to_device(np.ascontiguousarray(array))
                                         for name, array in self.graph.initializers().items() if array.size}
            return self._weights[device]

    def close(self) -> None:
        """Drop the device weights (contexts made before keep theirs; later ones upload again)."""
        with self._lock:
            self._weights = {}

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create_execution_context(self, stream=None, use_cuda_graph: bool = True, max_graphs: int | None = None,
                                 profile: int = 0, batch_buckets=None, max_specializations: int | None = None):
        """A context that runs this engine on ``stream`` (a new one by default) in
        optimization profile ``profile``. From the second run of an input shape on, its
        launches replay as one CUDA graph unless ``use_cuda_graph`` is false; it keeps
        ``max_graphs`` graphs (16) and ``max_specializations`` shapes' launches (64).
        ``batch_buckets``: ``execute`` pads each request's batch up to the nearest of these
        sizes (:mod:`plugrt.engine.buckets`)."""
        from plugrt.engine.context import MAX_GRAPHS, ExecutionContext

        return ExecutionContext(self, stream, use_cuda_graph, MAX_GRAPHS if max_graphs is None else max_graphs,
                                profile, batch_buckets, max_specializations)

    # ------------------------------------------------------------------ plan files

    def serialize(self) -> bytes:
        header, arrays = self._plan_content()
        return encode_plan(header, arrays)

    def save(self, path: str) -> None:
        """Write the plan file atomically."""
        header, arrays = self._plan_content()
        write_plan(path, header, arrays)

    def _plan_content(self):
        """The header and arrays of this engine's plan; on a GPU its opt-shape kernels
        too (:mod:`plugrt.engine.plan_kernels`)."""
        graph_header, arrays = graph_to_json(self.graph)
        kernels, kernel_arrays = plan_kernels.collect(self)
        arrays.update(kernel_arrays)
        header = {
            "format": ENGINE_FORMAT,
            "plugrt_version": __version__,
            "device": self.device,
            "graph": graph_header,
            "profiles": [profile.as_json() for profile in self.profiles],
            "layers": [asdict(layer) for layer in self.layers],
            "memory": {"offsets": self.offsets, "arena_bytes": self.arena_bytes,
                       "workspace_bytes": self.workspace_bytes},
            "shapes": self.shapes,
            "passes": self.passes,
            "kernels": kernels,
        }
        if self.precision is not None:
            header["precision"] = self.precision
        if self.specialized:
            header["specialized"] = self.specialized
        return header, arrays

    @classmethod
    def deserialize(cls, data: bytes, registry=None, label: str = "<bytes>") -> "Engine":
        header, arrays = decode_plan(data, label)
        return cls._from_plan(header, arrays, registry, label)

    @classmethod
    def load(cls, path: str, registry=None) -> "Engine":
        header, arrays = read_plan(path)
        return cls._from_plan(header, arrays, registry, repr(path))

    @classmethod
    def _from_plan(cls, header: dict, arrays: dict, registry, label: str) -> "Engine":
        """Check the whole header (:mod:`plugrt.engine.plan_schema`, then against the graph
        and plugins, :mod:`plugrt.engine.plan_checks`) before anything is allocated."""
        if registry is None:
            from plugrt.registry import default_registry

            registry = default_registry()
        if not isinstance(header, dict) or header.get("format") != ENGINE_FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            raise PlanError(f"plan {label} has engine format {found!r}; this plugrt reads "
                            f"{ENGINE_FORMAT!r}: rebuild the plan with plugrt {__version__}")
        check_header(header, arrays, label)
        layers = [LayerRecord(**entry) for entry in header["layers"]]
        memory = header["memory"]
        graph = graph_from_json(header["graph"], arrays, label)
        _check_plugins(graph, layers, registry, label)
        plan_checks.check_structure(graph, registry, label)
        plan_checks.check_attributes(graph, registry, label)
        plan_checks.infer(graph, registry, label)
        profiles, graphs = plan_checks.load_profiles(header, graph, registry, label)
        specials = plan_checks.load_specialized(header.get("specialized", []), graph, profiles, registry, label)
        plan_checks.check_shapes(header, graphs, label)
        workspace = plan_checks.check_layers(layers, registry, graphs, label, specials)
        plan_checks.check_memory(header, layers, [m for _, m in graphs], workspace, label)
        plan_kernels.supply(header.get("kernels"), arrays, label)
        return cls(graph, profiles[0], layers, dict(memory["offsets"]), memory["arena_bytes"],
                   memory["workspace_bytes"], registry, header["shapes"], header["device"], header["passes"],
                   header.get("precision"), profiles, header.get("specialized"))

    # ------------------------------------------------------------------ inspection

    def inspect(self) -> dict:
        """Layers (plugin, tactic and its time, shapes, precision) and memory, JSON-safe. An
        alias layer has no tactic (``None``) and names the tensor it is a view of (``alias``)."""
        from plugrt.ir.specialize import concretize

        layers = []
        opt = self.shapes.get("opt", {})
        dependent = concretize(self.graph, {n: e[1] for n, e in self.profile.shapes.items()}, self.registry,
                               self.profile.shape_values).data_dependent  # (their outputs: at their bounds)
        for layer in self.layers:
            node = self.graph.nodes[layer.node_index]
            outs = [n for n in node.outputs if n]
            alias = node.inputs[layer.alias] if layer.alias is not None else None
            layers.append({
                "name": node.name, "op": fused_label(node) if is_fused(node) else node.qualified_op,
                "plugin": layer.plugin,
                "distribution": layer.distribution, "tactic": layer.tactic["name"] if alias is None else None,
                "params": layer.tactic["params"], "alias": alias,
                "inputs": {n: format_shape(opt.get(n, self._shape(n))) for n in node.inputs if n},
                "outputs": {n: format_shape(opt.get(n, self._shape(n))) for n in outs},
                "precision": self._precision(node, outs),
                "format": layer.tactic["params"].get("format", LINEAR),
                "workspace_bytes": layer.workspace_bytes, "onnx_nodes": list(node.origin or (node.name,)),
                "time_ms": layer.time_ms, "runner_up": layer.runner_up,
                "tactic_provider": layer.tactic_provider,
                "profile_tactics": [t["name"] for t in layer.profile_tactics] if layer.profile_tactics else None,
                "generic_tactics": [t and t["name"] for t in layer.generic_tactics] if layer.generic_tactics else None,
                "specialized_tactics": [t["name"] for t in layer.specialized_tactics or ()] or None,
                "data_dependent": node.name in dependent,
            })
            if is_fused(node):
                layers[-1]["parts"] = [{"op": entry["op_type"], "plugin": entry.get("plugin"),
                                        "distribution": entry.get("distribution")} for entry in node.attrs["body"]]
        device_nodes = {layer.node_index for layer in self.layers}
        host = [self.graph.nodes[i].name for i in range(len(self.graph.nodes)) if i not in device_nodes]
        return {
            "device": self.device,
            "inputs": {n: {"dtype": str(self.graph.info(n).dtype), "shape": format_shape(self.graph.info(n).shape)}
                       for n in self.graph.inputs},
            "outputs": {n: {"dtype": str(self.graph.info(n).dtype), "shape": format_shape(self.graph.info(n).shape)}
                        for n in self.graph.outputs},
            "profile": self.profile.as_json(),
            "profiles": [profile.as_json() for profile in self.profiles],
            "specialized": self.specialized,
            "layers": layers,
            "host_nodes": host,
            "plugins": self.plugins(),
            "passes": self.passes,
            "precision": self.precision,
            "memory": {"weights_bytes": self.weight_bytes, "arena_bytes": self.arena_bytes,
                       "workspace_bytes": self.workspace_bytes},
        }

    def plugins(self) -> list[dict]:
        """The plugins the plan needs, as it recorded them: name, distribution, version and
        the ops each runs (``domain::op_type`` with the op version), sorted by name."""
        found: dict[str, dict] = {}

        def note(plugin, distribution, version, node, op_version):
            entry = found.setdefault(plugin, {"plugin": plugin, "distribution": distribution, "version": version,
                                              "ops": {}})
            entry["ops"][node.qualified_op] = op_version

        for layer in self.layers:
            node = self.graph.nodes[layer.node_index]
            note(layer.plugin, layer.distribution, layer.distribution_version, node, layer.op_version)
            if layer.tactic_provider:
                source = layer.tactic_provider
                entry = found.setdefault(source["plugin"], {"plugin": source["plugin"],
                                                            "distribution": source.get("distribution"),
                                                            "version": source.get("version"), "ops": {}})
                entry.setdefault("tactics", {})[node.qualified_op] = source.get("provider_version")
            if is_fused(node):
                for part, entry in zip(body_nodes(node), node.attrs["body"]):
                    note(entry.get("plugin"), entry.get("distribution"), entry.get("version"), part,
                         entry.get("op_version"))
        return [found[name] for name in sorted(found)]

    def _precision(self, node, outs: list) -> str:
        """The layer's precision: what the precision step chose for the ONNX nodes it runs
        (``mixed`` when they differ, ``reformat`` for an inserted Cast alone), else its
        first output's dtype (``fp32``, ``fp16``, ``int64``...)."""
        chosen = (self.precision or {}).get("decisions", {})
        found = {chosen[name] for name in node.origin or (node.name,) if name in chosen}
        compute = found - {"reformat"}
        if len(compute) == 1:
            return compute.pop()
        if compute:
            return "mixed"
        if found:
            return "reformat"
        if not outs:
            return ""
        dtype = self.graph.info(outs[0]).dtype
        return {"float16": "fp16", "float32": "fp32", "float64": "fp64"}.get(dtype.name, dtype.name)

    def _shape(self, name: str):
        info = self.graph.info(name)
        return info.shape if info is not None else None


def _check_plugins(graph, layers: list[LayerRecord], registry, label: str) -> None:
    """Every plugin a layer needs (each part of a fused layer too) must be installed at the
    version the plan was built with."""
    problems = []
    for layer in layers:
        if not 0 <= layer.node_index < len(graph.nodes):
            raise PlanError(f"plan {label}: layer refers to node {layer.node_index}, which does not exist; rebuild it")
        node = graph.nodes[layer.node_index]
        needs = [(node, layer.plugin, layer.distribution, layer.distribution_version, layer.op_version)]
        if is_fused(node):
            needs += [(part, entry.get("plugin"), entry.get("distribution"), entry.get("version"),
                       entry.get("op_version")) for part, entry in zip(body_nodes(node), node.attrs["body"])]
        problems += [p for need in needs if (p := _plugin_problem(registry, *need))]
        if layer.tactic_provider:
            problems += [p for p in [_provider_problem(registry, node, layer)] if p]
    if problems:
        raise PlanError(f"plan {label} cannot be loaded:\n  " + "\n  ".join(problems))


def _plugin_problem(registry, node, plugin, distribution, version, op_version) -> str | None:
    dist = distribution or "(no distribution)"
    if distribution and version:
        install = f"pip install {distribution}=={version}"
    elif distribution:
        install = f"pip install {distribution}"
    else:
        install = f"register plugin {plugin!r} in this registry"
    op = registry.find_op(node.domain, node.op_type, node.opset)
    if op is None:
        return (f"{node.describe()} needs plugin {plugin!r} from distribution {dist} version {version}, which is "
                f"not installed: {install}")
    owner = registry.owner(op)
    why = _incompatibility(distribution, version, op_version, owner.distribution, owner.version, op.version,
                           op.loads_versions)
    if why:
        return (f"{node.describe()} was built with {dist} {version} (op version {op_version}), but "
                f"{owner.distribution or '(no distribution)'} {owner.version} (op version {op.version}) is "
                f"installed, and {why}: {install}, or rebuild the plan")
    if owner.name != plugin:
        return (f"{node.describe()} was built with plugin {plugin!r}, but plugin {owner.name!r} provides the op "
                f"here: {install}, or rebuild the plan")
    if owner.version != version:
        log.warning("%s was built with %s %s; running it with %s %s (a patch release, same op version %s)",
                    node.describe(), dist, version, dist, owner.version, op.version)
    return None


def _provider_problem(registry, node, layer: LayerRecord) -> str | None:
    """Why the plugin that contributed a layer's tactic cannot run it again, or ``None``."""
    source = layer.tactic_provider
    plugin, distribution, version = source.get("plugin"), source.get("distribution"), source.get("version")
    tactic = f"{node.describe()} runs tactic {layer.tactic.get('name')!r} contributed by plugin {plugin!r}"
    install = f"pip install {distribution}=={version}" if distribution and version else \
        f"pip install {distribution}" if distribution else f"register plugin {plugin!r} in this registry"
    record = registry.plugins.get(plugin)
    provider = next((p for p in record.providers if p.serves(node.domain, node.op_type, node.opset)),
                    None) if record is not None else None
    if provider is None:
        return (f"{tactic} ({distribution or '(no distribution)'} {version}), which is not installed: {install}, "
                "or rebuild the plan without it")
    why = _incompatibility(distribution, version, source.get("provider_version"), record.distribution,
                           record.version, provider.version, provider.loads_versions)
    if why:
        return (f"{tactic} ({distribution} {version}, provider version {source.get('provider_version')}), but "
                f"{record.distribution} {record.version} (provider version {provider.version}) is installed, and "
                f"{why}: {install}, or rebuild the plan")
    return None


def _incompatibility(distribution, version, op_version, installed_distribution, installed_version,
                     installed_op_version, loads_versions=()) -> str | None:
    """Why the installed plugin cannot run a layer the plan recorded, or ``None``; an op
    version in ``loads_versions`` (the installed op's earlier versions it still runs) is
    no difference."""
    if installed_distribution != distribution:
        return "another distribution provides the op"
    if installed_op_version != op_version and op_version not in loads_versions:
        return "the op versions differ"
    if version == installed_version:
        return None
    recorded, installed = release_series(version), release_series(installed_version)
    if recorded is None or installed is None:
        return "the versions differ"
    if recorded != installed:
        return f"the release series differ ({'.'.join(map(str, recorded))} vs {'.'.join(map(str, installed))})"
    return None


_RELEASE = re.compile(r"\s*v?(?:\d+!)?(\d+(?:\.\d+)*)")


def release_series(version: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a PEP 440 version (``"1.2.3.post1"`` -> ``(1, 2)``), or ``None``."""
    match = _RELEASE.match(version or "")
    if match is None:
        return None
    parts = [int(p) for p in match.group(1).split(".")] + [0]
    return parts[0], parts[1]
