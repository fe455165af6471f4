"""Attention as real exporters write it (tests/exports.py): every form becomes one
MultiHeadAttention with the right attributes, and its engine matches onnxruntime on fresh
inputs with each kernel family (SIMT scalar and vector loads, TF32 tensor cores emulated);
near-misses stay unfused, saying why, or fuse without the attribute they do not earn."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.registry import default_registry
from plugrt_contrib_attention import simt, tactics, tensor_cores
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE

from . import exports
from .exports import B, D, FMIN, H, S

ort = pytest.importorskip("onnxruntime")
QUALIFIED = f"{DOMAIN}::{OP_TYPE}"
#: One engine per kernel family: the tactics offered, the tolerance against onnxruntime.
VARIANTS = {"simt": ((simt.SIM_CONFIGS[0],), 1e-4), "simt_vector": ((simt.SIM_CONFIGS[1],), 1e-4),
            "tf32": (tensor_cores.SIM_CONFIGS, 5e-3)}


def random_feeds(model, rng, shapes):
    feeds = {}
    for name, shape in shapes.items():
        if "mask" in name:
            feeds[name] = np.where(rng.random(shape) < 0.25, FMIN, 0).astype(np.float32)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def build(model, variant, monkeypatch, profile=None):
    """The engine with only ``variant``'s tactics offered; ``profile``: name -> (min, opt, max)."""
    configs, _ = VARIANTS[variant]
    monkeypatch.setattr(tactics, "candidates", lambda gpu=None: configs)
    config = BuilderConfig(progress=False, tf32=variant == "tf32")
    if profile:
        shapes = OptimizationProfile()
        for name, (low, opt, high) in profile.items():
            shapes.set_shape(name, low, opt, high)
        config.add_optimization_profile(shapes)
    return Builder(default_registry()).build_engine(model, config)


def attention_node(engine):
    """The engine's one attention node; nothing else of the block (Softmax, MatMul) is left."""
    ops = [layer["op"] for layer in engine.inspect()["layers"]]
    assert ops.count(QUALIFIED) == 1 and not [op for op in ops if "Softmax" in op or "MatMul" in op], ops
    return next(n for n in engine.graph.nodes if (n.domain, n.op_type) == (DOMAIN, OP_TYPE))


def check_engine(model, shapes, monkeypatch, rng, variant, profile=None, run_shapes=()):
    """Build, check against onnxruntime at ``shapes`` (and each of ``run_shapes``); the node."""
    engine = build(model, variant, monkeypatch, profile)
    node = attention_node(engine)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    context = engine.create_execution_context()
    tol = VARIANTS[variant][1]
    for at in (shapes,) + tuple(run_shapes):
        feeds = random_feeds(model, rng, at)
        want = session.run(None, feeds)[0]
        got = context.execute(feeds)[model.graph.output[0].name]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return node


def projections(b=B, s=S, kv_hidden=H * D, **extra):
    return {"xq": (b, s, H * D), "xk": (b, s, kv_hidden), "xv": (b, s, kv_hidden), **extra}


def pipeline_graph(model):
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry)
    return graph


def ops_of(graph):
    return [node.op_type for node in graph.nodes]


# --------------------------------------------------------------------------- causal masks


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpt2_sliced_bias_becomes_causal(variant, monkeypatch, rng):
    """The constant buffer sliced at static shapes (folded into a constant causal mask)."""
    node = check_engine(exports.gpt2(), projections(attention_mask=(B, 1, 1, S)), monkeypatch, rng, variant)
    assert node.attrs["causal"] in (1, 2) and node.attrs["layout"] == "bsh,bsh,bsh,bsh"
    assert node.attrs["num_heads"] == H and node.inputs[3] == "attention_mask"  # the padding mask alone


@pytest.mark.parametrize("variant", ["simt", "tf32"])
def test_gpt2_sliced_bias_with_dynamic_shapes(variant, monkeypatch, rng):
    """The Slice of the buffer stays (symbolic bounds): read as rows ``[Sk - Sq, Sk)``; the
    engine runs at the profile's shapes, the kernel skipping key tiles past the diagonal."""
    profile = {name: ((1, 2, *shape[2:]), shape, shape) for name, shape in projections(3, 7).items()}
    profile["attention_mask"] = ((1, 1, 1, 2), (3, 1, 1, 7), (3, 1, 1, 7))
    node = check_engine(exports.gpt2(dynamic=True), projections(3, 7, attention_mask=(3, 1, 1, 7)), monkeypatch, rng,
                        variant, profile, run_shapes=[projections(1, 2, attention_mask=(1, 1, 1, 2))])
    # Shape reads Q's and K's head transposes (the slice bounds) and the merged heads (the
    # merge's target): those stay, the output's transpose is taken in
    assert node.attrs["causal"] == 2 and node.attrs["layout"] == "bhsd,bhsd,bsh,bshd"


@pytest.mark.parametrize("dynamic", [False, True])
def test_sdpa_is_causal_trilu_mask(dynamic, monkeypatch, rng):
    """torch's SDPA export (is_causal): the Trilu mask folded (static) or read as built
    (dynamic), the sqrt-split scale on Q and K, HF's NaN guard."""
    model = exports.sdpa(dynamic=dynamic, guard=True)
    profile = {name: ((1, 2, H * D), shape, shape) for name, shape in projections().items()} if dynamic else None
    node = check_engine(model, projections(), monkeypatch, rng, "simt_vector", profile)
    assert node.attrs["causal"] == 1 and len(node.inputs) == 3 and node.attrs["guard_nan"] == 1
    assert node.attrs["scale"] == pytest.approx(1 / np.sqrt(D))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_llama_grouped_heads_and_additive_causal_mask(variant, monkeypatch, rng):
    """repeat_kv absorbed (K/V with 2 heads for 4), Q and K computed in [B, H, S, D] (the
    rotary stand-in), V's head split and the output's merge absorbed, the constant causal
    mask become the attribute."""
    node = check_engine(exports.llama(), projections(kv_hidden=2 * D), monkeypatch, rng, variant)
    assert node.attrs["causal"] == 1 and len(node.inputs) == 3
    assert node.attrs["layout"] == "bhsd,bhsd,bsh,bsh" and node.attrs["kv_num_heads"] == 2


def test_llama_computed_mask_and_one_kv_head(monkeypatch, rng):
    """Multi-query attention: the cleanup turns V's one-head split and repeat's Unsqueeze
    into Reshapes; the repeat is still read (K and V enter with their one head)."""
    engine = build(exports.llama(kv_heads=1, mask="computed"), "tf32", monkeypatch)
    node = attention_node(engine)
    assert node.attrs["causal"] == 1 and len(node.inputs) == 3
    assert [engine.graph.info(name).shape[1] for name in node.inputs[1:3]] == [1, 1]
    check_engine(exports.llama(kv_heads=1, mask="computed"), projections(kv_hidden=D), monkeypatch, rng, "tf32")


# --------------------------------------------------------------------------- biases


@pytest.mark.parametrize("two_adds, bias_input", [(True, False), (False, False), (True, True)])
def test_t5_position_bias_and_mask(two_adds, bias_input, monkeypatch, rng):
    """The relative bias and the padding mask: one mask input (a constant plus an input
    summed by an Add outside the op), no scale."""
    shapes = projections(mask=(B, 1, 1, S), **({"position_bias": (1, H, S, S)} if bias_input else {}))
    node = check_engine(exports.t5(two_adds, bias_input), shapes, monkeypatch, rng, "simt")
    assert node.attrs["scale"] == 1.0 and node.attrs["causal"] == 0 and len(node.inputs) == 4


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_swin_window_bias_and_shifted_window_mask(variant, monkeypatch, rng):
    """The window mask [1, nW, 1, N, N] summed with the bias [1, H, N, N] into one [nW, H, N, N]
    mask that batch b reads at b % nW (``mask_period``)."""
    node = check_engine(exports.swin(), {n: (4, S, H, D) for n in "qkv"}, monkeypatch, rng, variant)
    assert node.attrs["layout"] == "bshd,bshd,bshd,bhsd" and node.attrs["scale"] == pytest.approx(D ** -0.5)
    assert node.attrs["mask_period"] == 2


def test_swin_window_mask_computed_at_run_time(monkeypatch, rng):
    """A window mask the graph computes (here an input) is squeezed to [nW, 1, N, N] outside
    the op; the bias is added to it there."""
    shapes = {**{n: (4, S, H, D) for n in "qkv"}, "window_mask": (1, 2, 1, S, S)}
    node = check_engine(exports.swin(window_mask="input"), shapes, monkeypatch, rng, "simt")
    assert node.attrs["mask_period"] == 2 and len(node.inputs) == 4


# --------------------------------------------------------------------------- scales


@pytest.mark.parametrize("q_op, k_op, before, scores_op", [
    ("Mul", None, False, None), (None, "Div", False, None), (None, "Mul", True, None),
    ("Div", "Div", False, None), ("Mul", "Mul", True, "Div"), (None, None, False, "Mul")])
def test_scale_before_or_after_the_product(q_op, k_op, before, scores_op, monkeypatch, rng):
    model = exports.scaled(q_op, k_op, before, scores_op, factor=0.5)
    node = check_engine(model, projections(), monkeypatch, rng, "simt")
    assert node.attrs["scale"] == pytest.approx(0.5 ** sum(x is not None for x in (q_op, k_op, scores_op)))
    assert node.attrs["layout"] == "bsh,bsh,bsh,bsh"


# --------------------------------------------------------------------------- near-misses


def test_a_non_triangular_bool_mask_is_not_causal(caplog):
    """Where(mask, scores, finfo.min) over a mask that is no causal pattern: left as it is
    (a row it masked whole would average V there), and -v says why."""
    buffer = np.tril(np.ones((8, 8), np.uint8))
    buffer[3, 1] = 0  # one hole under the diagonal
    with caplog.at_level(logging.INFO, logger="plugrt.passes.fuse_attention"):
        graph = pipeline_graph(exports.gpt2(buffer=buffer.reshape(1, 1, 8, 8)))
    assert OP_TYPE not in ops_of(graph) and "Softmax" in ops_of(graph)
    assert "not a causal mask" in caplog.text


def test_an_upper_left_mask_read_from_the_lower_right_is_kept_as_a_mask():
    """A causal Where with a -inf fill: causal; the same condition, shifted one diagonal,
    is an additive mask input, not ``causal``."""
    fused = [n for n in pipeline_graph(exports.gpt2(fill=-np.inf)).nodes if n.op_type == OP_TYPE]
    assert fused and fused[0].attrs["causal"] in (1, 2)
    shifted = [n for n in pipeline_graph(exports.sdpa(diagonal=1)).nodes if n.op_type == OP_TYPE]
    assert shifted and shifted[0].attrs["causal"] == 0 and len(shifted[0].inputs) == 4


def test_a_tiled_kv_is_not_grouped_heads(monkeypatch, rng):
    """K/V repeated by Tile give head h the K/V head h % Hk, not h // n: the Tile stays."""
    node = check_engine(exports.llama(repeat="tile"), projections(kv_hidden=2 * D), monkeypatch, rng, "simt")
    assert "kv_num_heads" not in node.attrs or node.attrs["kv_num_heads"] in (0, None)


def test_a_window_mask_that_varies_over_the_images_is_not_fused(caplog):
    with caplog.at_level(logging.INFO, logger="plugrt.passes.fuse_attention"):
        graph = pipeline_graph(exports.swin(window_mask="per_image"))
    assert OP_TYPE not in ops_of(graph) and "varies over the images" in caplog.text
