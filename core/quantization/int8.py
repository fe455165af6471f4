"""The builder's INT8 step: calibrated ranges handed to the ``quantize`` passes.

TensorRT's implicit quantization, with its users' complaints answered:

- Ranges are collected from the FP32 network after the passes that change which ops
  the graph holds and before fusion into kernels (TensorRT calibrates before fusion):
  every float tensor the plugins' references compute, over **every** calibration batch
  at whatever shapes the batches have (TensorRT uses the calibration profile's opt shape
  only); a batch outside the optimization profile is refused, naming it.
- One histogram per tensor serves every algorithm (:mod:`.calibrators`), so switching
  ``--calibration-algorithm`` recalibrates from the cache's absence, not the data.
- The cache (:mod:`.cache`) names the algorithm and a hash of the graph being calibrated:
  a changed model or algorithm is refused, never silently reused.
- Every layer that stays in float is reported with its reason (``Int8Request.fallbacks``,
  filled by the passes and by :mod:`.budget`), never a silent fallback.

The ``quantize`` passes of the plugins (the built-in quant family) read
:attr:`Graph.int8 <plugrt.ir.graph.Graph.int8>` and place the Q/DQ pairs.
"""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np

from plugrt.errors import PlugrtError
from plugrt.ir.dims import format_shape
from plugrt.ir.graph import Graph, Int8Request
from plugrt.quantization import cache as calibration_cache
from plugrt.quantization.calibrators import ALGORITHMS, RangeCollector
from plugrt.quantization.data import calibrate_progress, load_calibration_data
from plugrt.reference import ReferenceExecutor

log = logging.getLogger("plugrt.builder")


def check_config(config) -> None:
    """Refuse INT8 settings that cannot work, before anything is imported."""
    if not config.int8:
        given = [flag for flag, value in (("--calibration-data", config.calibration_data),
                                           ("--calibration-cache", config.calibration_cache),
                                           ("--accuracy-budget", config.accuracy_budget)) if value is not None]
        if given:
            raise PlugrtError(f"{given[0]} without --int8: calibration only serves an INT8 build; add --int8")
        return
    if config.strongly_typed:
        raise PlugrtError("--int8 with --strongly-typed: a strongly typed build runs every layer in the dtype the "
                          "model gives it (a Q/DQ model is quantized where its Q/DQ nodes say); drop --int8")
    if config.calibration_algorithm not in ALGORITHMS:
        raise PlugrtError(f"calibration algorithm {config.calibration_algorithm!r}: use one of {', '.join(ALGORITHMS)}")
    if not 0.0 < float(config.calibration_percentile) <= 100.0:
        raise PlugrtError(f"calibration percentile {config.calibration_percentile}: give a value in (0, 100]")
    if config.accuracy_budget is not None and not float(config.accuracy_budget) > 0.0:
        raise PlugrtError(f"accuracy budget {config.accuracy_budget}: give a relative error above 0, e.g. 0.01")


def graph_hash(graph: Graph) -> str:
    """A digest of what calibration depends on: nodes, attributes, inputs, constants."""
    digest = hashlib.sha256()
    for name in graph.inputs:
        info = graph.info(name)
        digest.update(f"in {name} {info.dtype} {format_shape(info.shape)}\n".encode())
    for node in graph.nodes:
        attrs = json.dumps({k: _plain(v) for k, v in sorted(node.attrs.items())}, sort_keys=True, default=str)
        digest.update(f"{node.domain}::{node.op_type} {node.inputs} {node.outputs} {attrs}\n".encode())
    for name, array in sorted(graph.initializers().items()):
        array = np.ascontiguousarray(array)
        digest.update(f"const {name} {array.dtype} {array.shape}\n".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def _plain(value):
    if isinstance(value, np.ndarray):
        return [str(value.dtype), list(value.shape), hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()]
    return value


def prepare(graph: Graph, registry, config, profile, metric=None, tuner=None, profiles: list | None = None) -> int:
    """Set ``graph.int8`` for an INT8 build (ranges from the cache or from calibration);
    return how many tensors have a range. Not an INT8 build: ``graph.int8`` stays None.
    ``metric(got, expected)``: the accuracy budget's default error measure. ``tuner``
    (a build that times tactics) gives the passes a timer (:attr:`Int8Request.timer`):
    a layer stays in INT8 only where its integer kernel is measured no slower than float."""
    if not config.int8:
        graph.int8 = None
        return 0
    excluded = {name for name, precision in config.layer_precisions.items() if precision != "int8"}
    required = ({name for name, precision in config.layer_precisions.items() if precision == "int8"}
                if config.precision_constraints != "none" else set())
    digest = graph_hash(graph)
    ranges, kept = _cached(config, digest), []
    if ranges is None:
        ranges, kept = calibrate(graph, registry, config, profile, profiles=profiles)
        # As the cache stores them (float32 scales), so a build from the cache is the same build.
        ranges = {name: calibration_cache.decode_scale(calibration_cache.encode_scale(amax))
                  for name, amax in ranges.items()}
        if config.calibration_cache:
            calibration_cache.write_cache(config.calibration_cache, config.calibration_algorithm, digest, ranges,
                                          percentile=config.calibration_percentile)
            log.info("calibration cache %s written: %d tensor ranges", config.calibration_cache, len(ranges))
    graph.int8 = Int8Request(ranges=dict(ranges), excluded=set(excluded), fp16=bool(config.fp16),
                             timer=layer_timer(graph, registry, tuner, profile), required=required,
                             obey=config.precision_constraints == "obey")
    if config.accuracy_budget is not None or config.accuracy_metric is not None:
        from plugrt.quantization.budget import BATCHES, fit_budget

        if not kept:
            if config.calibration_data is None:
                raise PlugrtError("--accuracy-budget measures the INT8 network on calibration data: give "
                                  "--calibration-data DATA too (the cache's ranges are still used)")
            kept = _first_batches(graph, registry, config, BATCHES)
        fit_budget(graph, registry, config, metric, kept)
    elif not kept and config.calibration_data is not None and config.accuracy_check:
        kept = _first_batches(graph, registry, config, 1)  # ranges from the cache: data still checks accuracy
    if kept:
        graph.int8.feeds, graph.int8.reference = kept[0]
    return len(ranges)


def layer_timer(graph: Graph, registry, tuner, profile):
    """:attr:`Int8Request.timer` over ``graph`` at the profile's opt shapes, or None where
    ``tuner`` does not time (no GPU, level 0): the fastest tactic's median time of a node
    with its inputs retyped (:func:`plugrt.tuning.variants.retyped`), through the tuner
    (its timing cache: the build's own tuning of an identical layer finds the times)."""
    if tuner is None or not tuner.times:
        return None
    from plugrt.tuning.variants import retyped
    from plugrt.ir.specialize import concretize

    concrete: list = []

    def timer(node, dtypes: dict) -> float | None:
        if not concrete:
            concrete.append(concretize(graph, {n: s[1] for n, s in profile.shapes.items()}, registry,
                                       profile.shape_values))
        op = registry.op(node)
        try:
            scratch, tactics = retyped(concrete[0], node, dtypes, registry, op, tuner)
        except Exception as exc:  # noqa: BLE001 - a variant the plugin cannot run is not timed
            log.info("%s: not timed with inputs %s (%s)", node.describe(), dtypes, exc)
            return None
        return tuner.choose(node, scratch, op, registry.owner(op), tactics, always_time=True).time_ms

    return timer


def _cached(config, digest: str) -> dict[str, float] | None:
    """The cache's ranges, or None when there is no cache file yet (then calibration
    needs data). A cache for another model or algorithm is an error (:mod:`.cache`)."""
    import os

    path = config.calibration_cache
    if path and os.path.exists(path):
        found = calibration_cache.read_cache(path, config.calibration_algorithm, digest,
                                             percentile=config.calibration_percentile, allow_tensorrt=True)
        ranges = dict(found.ranges)
        if found.from_tensorrt:
            log.warning("calibration cache %s has no model hash (a TensorRT cache): its ranges are used as they "
                        "are; tensors it does not name stay in float", path)
        log.info("calibration cache %s: %d tensor ranges reused, calibration skipped", path, len(ranges))
        return ranges
    if config.calibration_data is None:
        where = f" (the cache {path} does not exist yet)" if path else ""
        raise PlugrtError("--int8 needs calibration data to choose the INT8 ranges: give --calibration-data DATA "
                          f"(an .npz batch or a folder of them, keyed by input name) or a calibration cache an "
                          f"earlier build wrote{where}; or build without --int8")
    return None


def calibrate(graph: Graph, registry, config, profile, keep: int = 4,
              profiles: list | None = None) -> tuple[dict[str, float], list]:
    """Run the graph's references on every calibration batch; return each float tensor's
    range (amax) by the config's algorithm (tensors zero throughout get none), and the
    first ``keep`` batches with the network's outputs on them, ``(feeds, outputs)`` (the
    build's accuracy check and the accuracy budget measure on them)."""
    batches = load_calibration_data(config.calibration_data, list(graph.inputs))
    total = batches.total
    executor = ReferenceExecutor(graph, registry)
    collector = RangeCollector()
    count, kept = 0, []
    for index, feeds in enumerate(calibrate_progress(batches, total, config.progress)):
        _check_batch(graph, profiles or [profile], feeds, index)

        def observe(node, outputs):
            for name, array in zip([n for n in node.outputs if n], outputs):
                if np.asarray(array).dtype.kind == "f":
                    collector.update(name, array)

        for name in graph.inputs:
            if np.asarray(feeds[name]).dtype.kind == "f":
                collector.update(name, np.asarray(feeds[name]))
        typed = {name: np.asarray(feeds[name], dtype=graph.info(name).dtype) for name in graph.inputs}
        outputs = executor.run(typed, observe=observe)
        if len(kept) < keep:
            kept.append((typed, outputs))
        count += 1
    if not count:
        raise PlugrtError(f"calibration data {config.calibration_data!r} holds no batch; give at least one")
    ranges = {}
    for name in collector.names():
        amax = float(collector.compute_amax(name, config.calibration_algorithm, config.calibration_percentile))
        if np.isfinite(amax) and amax > 0.0:
            ranges[name] = amax
    log.info("calibrated %d tensors over %d batches (%s)", len(ranges), count, config.calibration_algorithm)
    return ranges, kept


def _first_batches(graph: Graph, registry, config, count: int) -> list:
    """``(feeds, outputs)`` of the first ``count`` calibration batches."""
    executor, found = ReferenceExecutor(graph, registry), []
    for feeds in load_calibration_data(config.calibration_data, list(graph.inputs)):
        typed = {name: np.asarray(feeds[name], dtype=graph.info(name).dtype) for name in graph.inputs}
        found.append((typed, executor.run(typed)))
        if len(found) == count:
            break
    return found


def _check_batch(graph: Graph, profiles: list, feeds: dict, index: int) -> None:
    """A batch's shapes must be ones the engine will run: inside one of the optimization
    profiles (:meth:`OptimizationProfile.check <plugrt.engine.profile.OptimizationProfile.check>`)."""
    shapes = {name: tuple(int(d) for d in np.shape(feeds[name])) for name in graph.inputs
              if profiles[0].get_shape(name) is not None}
    if any(all(profile.contains(name, shape) for name, shape in shapes.items()) for profile in profiles):
        return
    for k, profile in enumerate(profiles):
        for name, shape in shapes.items():
            try:
                profile.check(name, shape)
            except PlugrtError as error:
                where = f" (profile {k})" if len(profiles) > 1 else ""
                raise PlugrtError(f"calibration batch {index}: {error}{where}, or give batches of shapes the "
                                  "engine will run") from None
