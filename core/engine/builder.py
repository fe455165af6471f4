"""The builder: an ONNX model or IR graph plus a config becomes an :class:`Engine`.

Steps: import, optimize the graph (:mod:`plugrt.passes`: folding, cleanup, fusion),
resolve the optimization profile, infer concrete shapes at the profile's
opt and max shapes, choose a tactic for every device layer at opt shapes
(:class:`plugrt.tuning.Tuner`: the plugin's preference order, or timing on the GPU with
a timing cache, by ``BuilderConfig.optimization_level``), and plan activation memory for
the max shapes by liveness.
"""

from __future__ import annotations

import logging


from plugrt.engine.engine import Engine, LayerRecord
from plugrt.engine.memory import liveness, plan_memory, value_shapes
from plugrt.engine.profile import BuilderConfig, OptimizationProfile, resolve_profile
from plugrt.ir.specialize import concretize, is_host_node
from plugrt.errors import PlugrtError, UnsupportedError
from plugrt.ir.dims import format_shape, is_static
from plugrt.ir.graph import Graph
from plugrt.tuning.timing_cache import TimingCache
from plugrt.tuning.tuner import Tuner

log = logging.getLogger("plugrt.builder")


class Builder:
    """Builds engines with the plugins of ``registry`` (the installed ones by default).

    ``measure`` replaces the CUDA-event timer of the tactic tuner (``measure(run) ->
    milliseconds``, see :class:`plugrt.tuning.Tuner`); given one, tactics are verified
    and timed even in the CUDA simulator (tests do this).
    """

    def __init__(self, registry=None, measure=None):
        if registry is None:
            from plugrt.registry import default_registry

            registry = default_registry()
        self.registry = registry
        self.measure = measure

    def create_builder_config(self) -> BuilderConfig:
        return BuilderConfig()

    def create_optimization_profile(self) -> OptimizationProfile:
        return OptimizationProfile()

    def build_engine(self, model, config: BuilderConfig | None = None) -> Engine:
        """Build an engine from an ONNX model (path, bytes, ModelProto) or a :class:`Graph`."""
        from plugrt.onnx.importer import import_model

        from plugrt.passes import optimize

        config = config or BuilderConfig()
        cache = TimingCache.load(config.timing_cache) if config.timing_cache else TimingCache()
        tuner = Tuner(config, cache, measure=self.measure)
        graph = model.copy() if isinstance(model, Graph) else import_model(model, registry=self.registry)
        profile = resolve_profile(graph, config)
        values = profile.shape_values
        graph.sample_inputs = [({n: s[i] for n, s in profile.shapes.items()}, values) for i in range(3)]
        imported = len(graph.nodes)
        passes = optimize(graph, self.registry, fusion=config.fusion, disabled=config.disabled_passes)
        log.info("graph passes: %d nodes -> %d nodes", imported, len(graph.nodes))
        max_graph = concretize(graph, {n: s[2] for n, s in profile.shapes.items()}, self.registry, values)
        opt_graph = concretize(graph, {n: s[1] for n, s in profile.shapes.items()}, self.registry, values)
        try:
            layers = self._choose_tactics(max_graph, opt_graph, tuner)
        finally:
            tuner.finish()
            if config.timing_cache and tuner.recorded:
                cache.save(config.timing_cache)
                log.info("timing cache %s: %d new timings, %d in all", config.timing_cache, tuner.recorded, len(cache))
        memory = _plan(max_graph, layers)
        workspace = max((layer.workspace_bytes for layer in layers), default=0)
        if workspace > config.max_workspace_bytes:
            raise PlugrtError(f"the engine needs {workspace} bytes of workspace, more than the config's "
                              f"max_workspace_bytes {config.max_workspace_bytes}; raise the limit")
        log.info("built %d device layers, %d host nodes; arena %d bytes, workspace %d bytes",
                 len(layers), len(graph.nodes) - len(layers), memory.arena_bytes, workspace)
        return Engine(graph, profile, layers, memory.offsets, memory.arena_bytes, workspace, self.registry,
                      shapes={"opt": value_shapes(opt_graph), "max": value_shapes(max_graph)},
                      passes=[result.as_json() for result in passes])

    def _tactics(self, op, node, graph: Graph) -> list:
        """The node's candidates at ``graph``'s shapes: its plugin's and contributed ones."""
        ins = [graph.info(name) if name else None for name in node.inputs]
        outs = [graph.info(name) for name in node.outputs if name]
        return self.registry.tactics(op, node, ins, outs)

    def _choose_tactics(self, max_graph: Graph, opt_graph: Graph, tuner: Tuner) -> list[LayerRecord]:
        """Every device layer's candidates first (all problems reported at once), then the
        tuner's choice for each, at opt shapes."""
        found, problems = [], []
        for index, node in enumerate(max_graph.nodes):
            if is_host_node(max_graph, node):
                continue
            op = self.registry.op(node)
            dynamic = [n for n in node.outputs if n and not is_static(max_graph.info(n).shape)]
            if dynamic:
                problems.append(f"{node.describe()}: output {dynamic[0]!r} has shape "
                                f"{format_shape(max_graph.info(dynamic[0]).shape)}, which depends on input data "
                                "that is not known at build time; make that input an initializer or a "
                                "shape-tensor input")
                continue
            pick = opt_graph if not is_host_node(opt_graph, opt_graph.nodes[index]) else max_graph
            try:
                candidates = self._tactics(op, node, pick)
                at_max = self._tactics(op, node, max_graph) if pick is not max_graph else candidates
            except PlugrtError as exc:
                problems.append(str(exc))
                continue
            if not candidates:
                problems.append(f"{node.describe()}: plugin {type(op).__name__} offers no CUDA tactic for "
                                f"inputs {_describe(pick, node)}")
                continue
            if not tuner.allowed(candidates):
                problems.append(f"{node.describe()}: every tactic of plugin {type(op).__name__} uses TF32 "
                                f"({', '.join(t.name for t in candidates)}), which the builder config forbids; "
                                "allow TF32 (drop --no-tf32)")
                continue
            found.append((index, node, op, pick, candidates, at_max))
        if problems:
            raise UnsupportedError("cannot build an engine; " + str(len(problems)) + " node(s) have no GPU "
                                   "implementation:\n  " + "\n  ".join(problems))
        layers = []
        for position, (index, node, op, pick, candidates, at_max) in enumerate(found, 1):
            owner = self.registry.owner(op)
            choice = tuner.choose(node, pick, op, owner, candidates, (position, len(found)))
            chosen = choice.tactic
            same = [t for t in at_max if (t.name, t.provider) == (chosen.name, chosen.provider)] or at_max
            workspace = max(int(t.workspace_bytes) for t in same) if same else int(chosen.workspace_bytes)
            layers.append(LayerRecord(index, chosen.identity(), workspace, owner.name, owner.distribution,
                                      owner.version, op.version, choice.time_ms, choice.runner_up,
                                      dict(chosen.source) if chosen.source else None))
        return layers


def _describe(graph: Graph, node) -> str:
    return ", ".join("none" if not n else f"{graph.info(n).dtype}{format_shape(graph.info(n).shape)}" for n in node.inputs)


def _plan(graph: Graph, layers: list[LayerRecord]):
    """Arena offsets for graph inputs and device-layer outputs, by liveness."""
    sizes, lifetimes = liveness(graph, [layer.node_index for layer in layers])
    return plan_memory(sizes, lifetimes)
