"""End to end: the example encoder layer (exported-transformer form) built into an engine
with the attention fused, against onnxruntime."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.registry import default_registry
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE

ort = pytest.importorskip("onnxruntime")
MAKE_MODELS = Path(__file__).resolve().parents[3] / "examples" / "make_models.py"
QUALIFIED = f"{DOMAIN}::{OP_TYPE}"


def make_encoder():
    if not MAKE_MODELS.exists():
        pytest.skip("examples/make_models.py is not here (the plugin is tested outside the plugrt repository)")
    spec = importlib.util.spec_from_file_location("plugrt_example_models", MAKE_MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.make_encoder()
    model.ir_version = 10  # onnxruntime reads it everywhere the tests run
    return model


def build(model, shape, **config):
    config = BuilderConfig(**config)
    config.add_optimization_profile(OptimizationProfile().set_shape("tokens", (1, 2, shape[2]), shape, shape))
    return Builder(default_registry()).build_engine(model, config)


def test_encoder_engine_fuses_attention_and_matches_onnxruntime(rng):
    model = make_encoder()
    shape = (2, 6, 32)
    engine = build(model, shape)
    layers = engine.inspect()["layers"]
    attention = [layer for layer in layers if layer["op"] == QUALIFIED]
    assert len(attention) == 1, [layer["op"] for layer in layers]
    assert attention[0]["distribution"] == "plugrt-contrib-attention"
    assert not any("Softmax" in layer["op"] for layer in layers)
    assert len(attention[0]["onnx_nodes"]) >= 4  # MatMul, Mul, Softmax, MatMul (and K's Transpose)

    x = rng.standard_normal(shape).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"tokens": x})[0]
    got = engine.create_execution_context().execute({"tokens": x})["encoded"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_disabling_the_pass_keeps_the_unfused_layers():
    engine = build(make_encoder(), (1, 3, 32), disabled_passes={"contrib-attention:fuse_attention"})
    ops = [layer["op"] for layer in engine.inspect()["layers"]]
    assert QUALIFIED not in ops
