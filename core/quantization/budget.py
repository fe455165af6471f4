"""Accuracy-aware INT8 (beyond TensorRT): the most sensitive layers stay in float until the
INT8 engine's outputs are within the budget of the FP32 network's.

``BuilderConfig.accuracy_budget`` (``--accuracy-budget REL``) is a relative output error;
``BuilderConfig.accuracy_metric(name, int8_output, fp32_output) -> error`` replaces the
default metric (the builder's: :func:`plugrt.engine.accuracy.relative_error`, the largest
element error over the output's largest magnitude) and is held to the budget (0.01 when
none is given).

How. The errors are measured on the calibration batches (at most :data:`BATCHES`) through
the plugins' references, so the numbers are the quantized graph's own arithmetic (the
kernels are checked against those references elsewhere):

1. every layer the ``quantize`` passes would put in INT8 is found (one trial run);
2. each one's sensitivity is its own output's error in INT8: the layer's integer form (its
   quantize, integer kernel and rescale, as the passes make them) run on the float
   network's values of its inputs, against the float network's value of its output.
   One float run per batch serves every layer, so this costs a few layers' work, where
   the network's error with each layer alone in INT8 would cost a network run per layer
   and batch (minutes for a ResNet-50 in the references);
3. the layers sorted by sensitivity, the fewest most-sensitive ones are kept in float
   (a bisection over that count, each step one run of the network) for the error to meet
   the budget.

Each layer kept in float is recorded in ``Int8Request.fallbacks`` with its sensitivity;
the build report lists them.
"""

from __future__ import annotations

import logging

import numpy as np

from plugrt.ir.graph import Graph, Int8Request
from plugrt.passes import eliminate_dead_code
from plugrt.reference import ReferenceExecutor

log = logging.getLogger("plugrt.builder")

#: Calibration batches the budget is measured on.
BATCHES = 4
#: The budget when only a metric is given.
DEFAULT_BUDGET = 0.01


def quantized(graph: Graph, registry, request: Int8Request) -> Graph:
    """A copy of ``graph`` after the registry's ``quantize`` passes under ``request``."""
    trial = graph.copy()
    trial.int8 = request
    for _, graph_pass in registry.passes("quantize"):
        graph_pass.run(trial, registry)
    eliminate_dead_code.run(trial, registry)  # (as the pipeline does after them)
    return trial


def fit_budget(graph: Graph, registry, config, default_metric, measured: list) -> None:
    """Add to ``graph.int8.excluded`` the layers the budget needs in float (see module doc);
    ``default_metric(got, expected)`` serves when the config gives no metric; ``measured``
    holds ``(feeds, float outputs)`` of the calibration batches to measure on."""
    request = graph.int8
    budget = float(config.accuracy_budget if config.accuracy_budget is not None else DEFAULT_BUDGET)
    metric = config.accuracy_metric or (lambda name, got, expected: default_metric(got, expected))
    batches = [feeds for feeds, _ in measured[:BATCHES]]
    expected = [outputs for _, outputs in measured[:BATCHES]]

    def error(excluded: set[str]) -> float:
        trial = quantized(graph, registry, Int8Request(request.ranges, excluded))
        executor = ReferenceExecutor(trial, registry)
        worst = 0.0
        for feeds, reference in zip(batches, expected):
            got = executor.run(feeds)
            worst = max([worst] + [float(metric(name, got[name], reference[name])) for name in graph.outputs])
        return worst

    full = quantized(graph, registry, Int8Request(request.ranges, set(request.excluded)))
    layers = sorted(name for name, decision in full.int8.decisions.items() if decision == "int8")
    whole = error(set(request.excluded))
    log.info("accuracy budget %.3g: %d INT8 layers, error %.3g", budget, len(layers), whole)
    if whole <= budget or not layers:
        return
    sensitivity = local_errors(graph, full, registry, layers, batches, default_metric)
    order = sorted(layers, key=lambda layer: -sensitivity[layer])
    low, high = 0, len(order)  # excluding ``high`` most sensitive meets the budget (all float does)
    errors = {0: whole, len(order): 0.0}
    while high - low > 1:
        middle = (low + high) // 2
        errors[middle] = error(set(request.excluded) | set(order[:middle]))
        if errors[middle] <= budget:
            high = middle
        else:
            low = middle
    for layer in order[:high]:
        request.excluded.add(layer)
        request.fall_back(layer, f"accuracy budget {budget:g}: the {high} most sensitive INT8 layer(s) stay in "
                                 f"float; its own output's error in INT8 is {sensitivity[layer]:.3g}")
    log.info("accuracy budget %.3g: %d layer(s) kept in float, error %.3g -> %.3g", budget, high, whole,
             errors.get(high, 0.0))


def local_errors(graph: Graph, full: Graph, registry, layers: list[str], batches: list, measure) -> dict[str, float]:
    """Each of ``layers``' own error in INT8, the largest over ``batches``: the nodes of
    ``full`` (every layer INT8) that compute the layer's output from values the float
    ``graph`` also has, run on those float values, measured against the float output by
    ``measure(got, expected)``."""
    outputs = {layer: next((node.outputs[0] for node in graph.nodes if node.name == layer), None) for layer in layers}
    float_run = ReferenceExecutor(graph, registry)
    errors = {layer: 0.0 for layer in layers}
    for feeds in batches:
        known = float_run.run(feeds, keep_intermediates=True)
        for layer, output in outputs.items():
            if output is None or output not in known:
                continue
            env = dict(full.initializers())
            for node in _computing(full, output, known):
                args = [(env[name] if name in env else known[name]) if name else None for name in node.inputs]
                env.update(zip(node.outputs, registry.op(node).reference(node, args)))
            errors[layer] = max(errors[layer], float(measure(np.asarray(env[output]), known[output])))
    return errors


def _computing(graph: Graph, target: str, known) -> list:
    """The nodes of ``graph`` that compute ``target`` from the ``known`` values (and
    constants), in graph order."""
    producers = graph.producers()
    needed, stack = set(), [target]
    while stack:
        name = stack.pop()
        node = producers.get(name)
        if node is None or (name != target and name in known) or node.name in needed:
            continue
        needed.add(node.name)
        stack.extend(n for n in node.inputs if n)
    return [node for node in graph.nodes if node.name in needed]
