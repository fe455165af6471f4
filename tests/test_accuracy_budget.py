"""The accuracy budget's per-layer sensitivity (:func:`plugrt.quantization.budget.local_errors`):
a layer's own output error in INT8, computed from the float network's values of its
inputs, is the error at that layer's output of the whole network with that layer alone in
INT8 (everything above it float), which the test runs end to end as the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from plugrt.engine import BuilderConfig, OptimizationProfile
from plugrt.engine.accuracy import relative_error
from plugrt.ir.graph import Int8Request
from plugrt.onnx.importer import import_model
from plugrt.quantization.budget import local_errors, quantized
from plugrt.quantization.int8 import calibrate
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from test_precision import conv_net, encoder_layer


@pytest.mark.parametrize("model, shape", [(conv_net(21), (1, 3, 6, 6)), (encoder_layer(22), None)],
                         ids=["convnet", "encoder"])
def test_local_errors_equal_each_layer_alone_in_int8(model, shape):
    registry = default_registry()
    graph = import_model(model, registry=registry)
    rng = np.random.default_rng(3)
    name = graph.inputs[0]
    info = graph.info(name)
    shape = shape or tuple(d if isinstance(d, int) else 1 for d in info.shape)
    batches = [{name: rng.standard_normal(shape).astype(info.dtype)} for _ in range(2)]
    config = BuilderConfig(int8=True, calibration_data=batches, progress=False)
    ranges, _ = calibrate(graph, registry, config, OptimizationProfile())
    full = quantized(graph, registry, Int8Request(ranges, set()))
    layers = sorted(layer for layer, decision in full.int8.decisions.items() if decision == "int8")
    assert len(layers) >= 3, full.int8.decisions
    errors = local_errors(graph, full, registry, layers, batches, relative_error)
    float_run = ReferenceExecutor(graph, registry)
    for layer in layers:
        output = next(node.outputs[0] for node in graph.nodes if node.name == layer)
        alone = quantized(graph, registry, Int8Request(ranges, set(layers) - {layer}))
        assert alone.int8.decisions.get(layer) == "int8"
        alone_run = ReferenceExecutor(alone, registry)
        expected = max(relative_error(alone_run.run(feeds, keep_intermediates=True)[output],
                                      float_run.run(feeds, keep_intermediates=True)[output]) for feeds in batches)
        assert expected > 0, layer
        assert errors[layer] == pytest.approx(expected, rel=1e-6), layer
