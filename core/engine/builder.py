"""The builder: an ONNX model or IR graph plus a config becomes an :class:`Engine`.

Steps: import, optimize the graph (:mod:`plugrt.passes`: folding, cleanup, fusion),
resolve the optimization profile, infer concrete shapes at the profile's
opt and max shapes, choose a tactic for every device layer at opt shapes
(:class:`plugrt.tuning.Tuner`: the plugin's preference order, or timing on the GPU with
a timing cache, by ``BuilderConfig.optimization_level``), and plan activation memory for
the max shapes by liveness. Layout layers whose plugin says their output is an input's
bytes (:mod:`plugrt.engine.aliases`) run no tactic: they are views of that buffer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from plugrt.device import memory_bytes
from plugrt.engine.engine import Engine, LayerRecord
from plugrt.engine.generic import choose_generic
from plugrt.engine.accuracy import check_accuracy, relative_error
from plugrt.engine.aliases import ALIAS_TACTIC, choose_all, storage
from plugrt.engine.memory import MAX_ARENA_BYTES, largest_shapes, liveness_all, plan_memory, value_shapes
from plugrt.engine.precision import assign_precisions
from plugrt.engine.precision import check_config as check_precision_config
from plugrt.engine.profile import BuilderConfig, OptimizationProfile, resolve_profiles, resolve_specializations
from plugrt.ir.specialize import concretize, is_host_node
from plugrt.quantization.int8 import check_config as check_int8_config
from plugrt.quantization.int8 import prepare as prepare_int8
from plugrt.errors import PlugrtError, ShapeError, UnsupportedError
from plugrt.ir.dims import format_shape, is_static
from plugrt.ir.graph import Graph, Int8Request
from plugrt.tuning.timing_cache import TimingCache
from plugrt.tuning.tuner import Tuner

log = logging.getLogger("plugrt.builder")


@dataclass
class Checked:
    """What :meth:`Builder.check_model` found: the optimized graph, the profile, the graph
    at max and opt shapes, each device layer's tactic candidates, and the passes' results."""

    graph: Graph
    profile: OptimizationProfile
    max_graph: Graph
    opt_graph: Graph
    found: list
    passes: list
    precision: object = None
    #: The alias layers: node index -> the input whose bytes output 0 is.
    aliases: dict = field(default_factory=dict)
    #: Every optimization profile (``profile`` is the first), and per profile after the
    #: first its graphs at opt and max shapes and its layers' candidates (as ``found``).
    profiles: list = field(default_factory=list)
    others: list = field(default_factory=list)
    #: ``(profile index, shapes, graph, candidates)`` of each of ``specialize_shapes``.
    specials: list = field(default_factory=list)

    def max_graphs(self) -> list[Graph]:
        return [self.max_graph] + [other[1] for other in self.others]


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


        config = config or BuilderConfig()
        cache = TimingCache.load(config.timing_cache) if config.timing_cache else TimingCache()
        tuner = Tuner(config, cache, measure=self.measure, registry=self.registry)
        checked = self._check(model, config, tuner, timed=True)
        graph, profile, opt_graph = checked.graph, checked.profile, checked.opt_graph
        try:
            layers = self._choose_layers(checked.found, tuner, checked.aliases,
                                         [other[2] for other in checked.others], [s[3] for s in checked.specials])
        finally:
            tuner.finish()
            if config.timing_cache and tuner.recorded:
                cache.save(config.timing_cache)
                log.info("timing cache %s: %d new timings, %d in all", config.timing_cache, tuner.recorded, len(cache))
        memory = _plan(checked.max_graphs(), [layer.node_index for layer in layers], checked.aliases)
        _check_memory(memory.arena_bytes, profile)
        workspace = max((layer.workspace_bytes for layer in layers), default=0)
        if workspace > config.max_workspace_bytes:
            raise PlugrtError(f"the engine needs {workspace} bytes of workspace, more than the config's "
                              f"max_workspace_bytes {config.max_workspace_bytes}; raise the limit")
        log.info("built %d device layers (%d of them aliases), %d host nodes; arena %d bytes, workspace %d bytes",
                 len(layers), len(checked.aliases), len(graph.nodes) - len(layers), memory.arena_bytes, workspace)
        engine = Engine(graph, profile, layers, memory.offsets, memory.arena_bytes, workspace, self.registry,
                        shapes={"opt": value_shapes(opt_graph), "max": largest_shapes(checked.max_graphs())},
                        passes=[result.as_json() for result in checked.passes], profiles=checked.profiles,
                        specialized=[{"profile": p, "shapes": {n: list(s) for n, s in shapes.items()}}
                                     for p, shapes, _, _ in checked.specials])
        choose_generic(engine, tf32=config.tf32)
        report, int8 = checked.precision, checked.graph.int8
        if report is not None and (report.decisions or config.strongly_typed or int8 is not None):
            if int8 is not None and report.reference is None and int8.reference is not None:
                report.feeds, report.reference = int8.feeds, int8.reference  # a calibration batch
            accuracy = check_accuracy(engine, report) if config.accuracy_check else None
            engine.precision = report.as_json(config, accuracy, int8)
        return engine

    def check_model(self, model, config: BuilderConfig | None = None, dynamic_dim: int | None = None) -> Checked:
        """Everything :meth:`build_engine` checks before it times tactics: import, the
        profile, the graph passes, shapes at the profile's opt and max shapes, that
        every device layer has a tactic, and the activation memory at max shapes.
        ``plugrt check`` runs this.

        :param dynamic_dim: given, a dynamic input the profile does not name is checked
            with its symbolic dims set to this (``plugrt check`` without shapes uses 1).
        :raises PlugrtError: for the first reason the build would refuse the model.
        """
        from plugrt.onnx.importer import import_model

        config = config or BuilderConfig()
        if dynamic_dim is not None:
            graph = model.copy() if isinstance(model, Graph) else import_model(model, registry=self.registry)
            given = config.profiles[0] if config.profiles else OptimizationProfile()
            profile = OptimizationProfile(dict(given.shapes), dict(given.shape_values), dict(given.given),
                                           dict(given.value_ranges))
            for name in graph.inputs:
                shape = graph.info(name).shape
                if name not in profile.shapes and not is_static(shape):
                    filled = [d if isinstance(d, int) else dynamic_dim for d in shape]
                    profile.set_shape(name, filled, filled, filled)
            config = BuilderConfig(**{**vars(config), "profiles": [profile]})
            model = graph
        return self._check(model, config, Tuner(config, TimingCache()))

    def _check(self, model, config: BuilderConfig, tuner: Tuner, timed: bool = False) -> Checked:
        """``timed``: the precision step may time tactics (a build, not a check)."""
        from plugrt.onnx.importer import import_model
        from plugrt.passes import bind_formats, optimize

        check_precision_config(config)
        check_int8_config(config)
        graph = model.copy() if isinstance(model, Graph) else import_model(model, registry=self.registry)
        bound = bind_formats(graph, self.registry, config.io_formats) if config.io_formats else []
        profiles = resolve_profiles(graph, config)
        profile = profiles[0]
        graph.sample_inputs = [({n: s[i] for n, s in p.shapes.items()}, p.shape_values) for p in profiles
                               for i in range(3)]
        _check_profile_shapes(graph, self.registry, profiles)
        imported = len(graph.nodes)
        if config.int8:  # the passes before calibration know an INT8 build is under way
            graph.int8 = Int8Request()
        model_nodes = {node.name for node in graph.nodes}
        report = []

        def precision(g: Graph) -> int:
            report.append(assign_precisions(g, self.registry, config, tuner if timed else None, profile, model_nodes,
                                             check_range=timed))
            return len(report[-1].decisions)

        def int8(g: Graph) -> int:
            return prepare_int8(g, self.registry, config, profile, relative_error, tuner if timed else None, profiles)

        passes = bound + optimize(graph, self.registry, fusion=config.fusion, disabled=config.disabled_passes,
                                  precision=precision, int8=int8)
        log.info("graph passes: %d nodes -> %d nodes", imported, len(graph.nodes))
        at = [(concretize(graph, {n: s[1] for n, s in p.shapes.items()}, self.registry, p.shape_values),
               concretize(graph, {n: s[2] for n, s in p.shapes.items()}, self.registry, p.values_at(2)))
              for p in profiles]
        opt_graph, max_graph = at[0]
        device = [index for index, node in enumerate(max_graph.nodes) if not is_host_node(max_graph, node)]
        for index, (_, other) in enumerate(at[1:], 1):
            here = [i for i, node in enumerate(other.nodes) if not is_host_node(other, node)]
            if here != device:
                raise PlugrtError(f"profile {index} computes other nodes on the host than profile 0 (nodes "
                                  f"{sorted(set(here) ^ set(device))[:5]}): a shape-tensor input's values must be "
                                  "the same in every profile")
        aliases = choose_all([m for _, m in at], self.registry, device)
        found = self._candidates(max_graph, opt_graph, tuner, aliases)
        others = [(o, m, self._candidates(m, o, tuner, aliases, index)) for index, (o, m) in enumerate(at[1:], 1)]
        _check_memory(_plan([m for _, m in at], [entry[0] for entry in found], aliases).arena_bytes, profile)
        specials = []
        for index, shapes in resolve_specializations(graph, config, profiles):
            at_shapes = concretize(graph, shapes, self.registry, profiles[index].shape_values)
            specials.append((index, shapes, at_shapes, self._candidates(at_shapes, at_shapes, tuner, aliases, index)))
        return Checked(graph, profile, max_graph, opt_graph, found, passes, report[0] if report else None, aliases,
                       profiles, others, specials)

    def _tactics(self, op, node, graph: Graph) -> list:
        """The node's candidates at ``graph``'s shapes: its plugin's and contributed ones."""
        ins = [graph.info(name) if name else None for name in node.inputs]
        outs = [graph.info(name) for name in node.outputs if name]
        return self.registry.tactics(op, node, ins, outs)

    def _candidates(self, max_graph: Graph, opt_graph: Graph, tuner: Tuner, aliases: dict, profile: int = 0) -> list:
        """Every device layer's candidates at one profile's shapes (all problems reported at
        once); an alias layer has none."""
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
            if index in aliases:
                found.append((index, node, op, None, [], []))
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
            where = f" at profile {profile}'s shapes" if profile else ""
            raise UnsupportedError("cannot build an engine; " + str(len(problems)) + " node(s) have no GPU "
                                   f"implementation{where}:\n  " + "\n  ".join(problems))
        return found

    def _choose_layers(self, found: list, tuner: Tuner, aliases: dict, others: list = (),
                       specials: list = ()) -> list[LayerRecord]:
        """The tuner's choice for each device layer, at opt shapes; alias layers run none.
        ``others``: the candidates at each later profile's shapes, each chosen at its own
        opt shapes (:attr:`LayerRecord.profile_tactics`); ``specials``: at each of the
        config's ``specialize_shapes`` (:attr:`LayerRecord.specialized_tactics`)."""
        layers = []
        timed, position = (len(found) - len(aliases)) * (1 + len(others) + len(specials)), 0
        for k, (index, node, op, pick, candidates, at_max) in enumerate(found):
            owner = self.registry.owner(op)
            if index in aliases:
                layers.append(LayerRecord(index, dict(ALIAS_TACTIC), 0, owner.name, owner.distribution, owner.version,
                                          op.version, alias=aliases[index]))
                continue
            position += 1
            choice = tuner.choose(node, pick, op, owner, candidates, (position, timed))
            chosen = choice.tactic
            workspace = _workspace(chosen, at_max)
            more = []
            for entry in (other[k] for other in [*others, *specials]):
                position += 1
                # (one provider for all the profiles: the plan names one per layer)
                offered = [t for t in entry[4] if t.provider == chosen.provider] or entry[4]
                more.append(tuner.choose(entry[1], entry[3], op, owner, offered, (position, timed)).tactic)
                workspace = max(workspace, _workspace(more[-1], entry[5]))
            more = [tactic.identity() for tactic in more]
            layers.append(LayerRecord(index, chosen.identity(), workspace, owner.name, owner.distribution,
                                      owner.version, op.version, choice.time_ms, choice.runner_up,
                                      dict(chosen.source) if chosen.source else None,
                                      profile_tactics=more[:len(others)] or None,
                                      specialized_tactics=more[len(others):] or None))
        return layers


def _workspace(chosen, at_max: list) -> int:
    """What ``chosen`` needs at max shapes (its namesake among ``at_max``)."""
    same = [t for t in at_max if (t.name, t.provider) == (chosen.name, chosen.provider)] or at_max
    return max(int(t.workspace_bytes) for t in same) if same else int(chosen.workspace_bytes)


def _describe(graph: Graph, node) -> str:
    return ", ".join("none" if not n else f"{graph.info(n).dtype}{format_shape(graph.info(n).shape)}" for n in node.inputs)


def _plan(graphs: list[Graph], layers: list[int], aliases: dict):
    """Arena offsets for graph inputs and the outputs of the device layers (node indices,
    in order) that own their bytes, by liveness, each at its largest over ``graphs`` (one
    per profile, at its max shapes)."""
    sizes, lifetimes = liveness_all(graphs, layers, storage(graphs[0], aliases, layers))
    return plan_memory(sizes, lifetimes)


def _check_profile_shapes(graph: Graph, registry, profiles: list) -> None:
    """Every profile's min, opt and max shapes run through the imported graph's shape
    inference; where one fails, the error names the profile, the shapes and the node.

    (Exports trace some dims to constants: PyTorch's legacy exporter bakes the sequence
    length into nn.MultiheadAttention's reshapes when it is given a padding mask. Such a
    model runs only at the traced size, in onnxruntime too; found here, the user hears it
    in those words instead of from whichever graph pass first meets the shape.)"""
    for index, profile in enumerate(profiles):
        for which, corner in enumerate(("min", "opt", "max")):
            shapes = {name: entry[which] for name, entry in profile.shapes.items()}
            try:
                concretize(graph, shapes, registry, profile.values_at(which))
            except ShapeError as exc:
                given = ", ".join(f"{name}{format_shape(shape)}" for name, shape in shapes.items())
                raise ShapeError(f"the model does not run at profile {index}'s {corner} shapes ({given}): {exc}. "
                                 "An export can fix a dim to the size it was traced at (onnxruntime fails there "
                                 "too); give a profile inside the shapes the model takes, or export it with that "
                                 "dim dynamic") from exc


def _check_memory(arena_bytes: int, profile: OptimizationProfile) -> None:
    """Refuse an arena over :data:`MAX_ARENA_BYTES` or the device's memory."""
    limit, where = MAX_ARENA_BYTES, "plugrt's limit of 2^40 bytes"
    device = memory_bytes()
    if device is not None and device < limit:
        limit, where = device, f"the device's {device} bytes of memory"
    if arena_bytes > limit:
        maxima = ", ".join(f"{name}: {list(shapes[2])}" for name, shapes in profile.shapes.items())
        raise ShapeError(f"the engine needs {arena_bytes} bytes of activation memory at the profile's max "
                         f"shapes ({maxima}), more than {where}; give smaller max shapes")
