"""The pack_projections pass: Q, K and V projections of one input become one GEMM the
attention reads in place. Packed and unpacked graphs give the same results (the pass on
its own, against the reference; whole engines against onnxruntime and each other, on
fresh inputs); BERT-, ViT- and T5-like projections, grouped K/V heads, GPT-2's packed
GEMM and Split; near misses stay as they are and -v says why."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.registry import default_registry
from plugrt.testing import check_pass
from plugrt_contrib_attention import pack, simt, tactics, tensor_cores
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE

from .exports import B, D, FMIN, H, S, Graph

ort = pytest.importorskip("onnxruntime")
QUALIFIED = f"{DOMAIN}::{OP_TYPE}"
HIDDEN = H * D
PACK = f"contrib-attention:{pack.NAME}"
#: Where the pass runs: before the epilogue fusion and the precision step.
LATER = ["fuse_epilogues", "fuse_pointwise"]
#: One engine per kernel family: the tactics offered, the tolerance against onnxruntime.
VARIANTS = {"simt": ((simt.SIM_CONFIGS[0],), 1e-4), "simt_vector": ((simt.SIM_CONFIGS[1],), 1e-4),
            "tf32": (tensor_cores.SIM_CONFIGS, 5e-3)}


def projection(g, rng, x, tag, width, bias=True, bias_first=False):
    """``x @ W (+ b)``, constant W ``[HIDDEN, width]`` and b, the Add's operands either way round."""
    y = g.op("MatMul", x, g.const(f"{tag}_w", rng.standard_normal((HIDDEN, width)) / np.sqrt(HIDDEN)))
    if not bias:
        return y
    b = g.const(f"{tag}_b", 0.5 * rng.standard_normal(width))
    return g.op("Add", b, y) if bias_first else g.op("Add", y, b)


def encoder(kind="bert", dynamic=False, seed=0):
    """Self-attention on an input ``x`` as exports write it, its projections by ``kind``:
    ``bert`` (biases, a padding mask input), ``vit`` (biases added first, no mask), ``t5``
    (no biases, no scale, a position bias and a mask), ``gqa`` (K and V of 2 heads, repeat_kv),
    ``k_read`` (K's projection also added to the output), and the near misses ``cross``
    (K and V projections of another input), ``input_weight`` (Q's weight a graph input),
    ``rotary`` (Q and K scaled by a table after the head split, LLaMA's rotary stand-in)."""
    g, rng = Graph(), np.random.default_rng(seed)
    b, s = ("batch", "seq") if dynamic else (B, S)
    x = g.input("x", (b, s, HIDDEN))
    source = g.input("memory", (b, s, HIDDEN)) if kind == "cross" else x
    kv_heads = 2 if kind == "gqa" else H
    bias = kind not in ("t5", "rotary")
    q = projection(g, rng, x, "q", HIDDEN, bias, bias_first=kind == "vit")
    if kind == "input_weight":
        q = g.op("MatMul", x, g.input("wq", (HIDDEN, HIDDEN)))
    k_proj = projection(g, rng, source, "k", kv_heads * D, bias, bias_first=kind == "vit")
    v = projection(g, rng, source, "v", kv_heads * D, bias)
    q, k, v = g.split_heads(q, H, D), g.split_heads(k_proj, kv_heads, D), g.split_heads(v, kv_heads, D)
    if kind == "rotary":
        table = g.const("rotary", np.linspace(0.5, 1.5, S * D).reshape(1, 1, S, D))
        q, k = g.op("Mul", q, table), g.op("Mul", k, table)
    if kind == "gqa":
        k, v = g.repeat_kv(k, kv_heads, H // kv_heads), g.repeat_kv(v, kv_heads, H // kv_heads)
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    if kind != "t5":
        scores = g.op("Div", scores, g.const("root", np.sqrt(D)))
    if kind == "t5":
        scores = g.op("Add", scores, g.const("position_bias", rng.standard_normal((1, H, S, S))))
    if kind in ("bert", "t5"):
        scores = g.op("Add", scores, g.input("mask", (b, 1, 1, s)))
    y = g.merge_heads(g.op("MatMul", g.op("Softmax", scores, axis=-1), v), HIDDEN)
    if kind == "k_read":
        y = g.op("Add", y, k_proj)
    return g.model()


def gpt2(seed=0):
    """GPT-2's c_attn as torch exports Conv1D: the tokens flattened, one Gemm ``[HIDDEN, 3 * HIDDEN]``
    with its bias, the rows back to ``[B, S, 3 * HIDDEN]``, ``Split`` into Q, K, V; a padding mask."""
    g, rng = Graph(), np.random.default_rng(seed)
    x = g.input("x", (B, S, HIDDEN))
    rows = g.op("Reshape", x, g.const("rows", [-1, HIDDEN], np.int64))
    qkv = g.op("Gemm", rows, g.const("c_attn_w", rng.standard_normal((HIDDEN, 3 * HIDDEN)) / np.sqrt(HIDDEN)),
               g.const("c_attn_b", 0.5 * rng.standard_normal(3 * HIDDEN)))
    qkv = g.op("Reshape", qkv, g.const("tokens", [B, S, 3 * HIDDEN], np.int64))
    parts = [f"split{i}" for i in range(3)]
    g.nodes.append(helper.make_node("Split", [qkv, g.const("widths", [HIDDEN] * 3, np.int64)], parts, axis=2,
                                    name="/attn/Split"))
    q, k, v = (g.split_heads(part, H, D) for part in parts)
    scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), g.const("root", np.sqrt(D)))
    scores = g.op("Add", scores, g.input("mask", (B, 1, 1, S)))
    g.merge_heads(g.op("MatMul", g.op("Softmax", scores, axis=-1), v), HIDDEN)
    return g.model()


def feeds_for(model, rng, b=B, s=S):
    feeds = {}
    for value in model.graph.input:
        if value.name == "mask":
            feeds["mask"] = np.where(rng.random((b, 1, 1, s)) < 0.25, FMIN, 0).astype(np.float32)
        elif value.name == "wq":
            feeds["wq"] = (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
        else:
            feeds[value.name] = rng.standard_normal((b, s, HIDDEN)).astype(np.float32)
    return feeds


def before_packing(model):
    """The graph as the pipeline hands it to this pass (attention fused, epilogues not yet)."""
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry, disabled=[PACK] + LATER)
    return graph


def count(graph, op_type):
    return sum(node.op_type == op_type for node in graph.nodes)


def attention_of(graph):
    found = [node for node in graph.nodes if (node.domain, node.op_type) == (DOMAIN, OP_TYPE)]
    assert len(found) == 1, [node.op_type for node in graph.nodes]
    return found[0]


# --------------------------------------------------------------------------- the pass alone


@pytest.mark.parametrize("kind, adds", [("bert", 1), ("vit", 1), ("t5", 0), ("gqa", 1)])
def test_three_projections_of_one_input_become_one_matmul(kind, adds):
    graph = before_packing(encoder(kind))
    assert count(graph, "MatMul") == 3
    before, after = check_pass(graph, pack.run, rtol=1e-5, atol=1e-6)
    node = attention_of(after)
    kv = 2 * D if kind == "gqa" else HIDDEN
    assert node.attrs["packed"] == [HIDDEN, kv, kv] and len(set(node.inputs[:3])) == 1
    assert node.attrs["layout"] == "bsh,bsh,bsh,bsh" and node.attrs["num_heads"] == H
    assert node.attrs["kv_num_heads"] == (2 if kind == "gqa" else H)
    assert count(after, "MatMul") == 1 and count(after, "Add") == count(before, "Add") - 3 * adds + adds
    matmul = after.producers()[node.inputs[0]]
    assert matmul.op_type == ("Add" if adds else "MatMul") and len(after.nodes) < len(before.nodes)
    assert after.info(node.inputs[0]).shape[-1] == HIDDEN + 2 * kv


def test_gpt2s_split_of_one_packed_gemm_is_read_in_place():
    before, after = check_pass(before_packing(gpt2()), pack.run, rtol=1e-5, atol=1e-6)
    node = attention_of(after)
    assert count(before, "Split") == 1 and count(after, "Split") == 0
    assert node.attrs["packed"] == [HIDDEN] * 3 and after.producers()[node.inputs[0]].op_type == "Reshape"


def test_a_projection_read_elsewhere_is_sliced_from_the_packed_one():
    """K's projection is also added to the output: that reader gets K's columns by a Slice."""
    before, after = check_pass(before_packing(encoder("k_read")), pack.run, rtol=1e-5, atol=1e-6)
    assert attention_of(after).attrs["packed"] and count(after, "MatMul") == 1 and count(after, "Slice") == 1


@pytest.mark.parametrize("kind, why", [
    ("cross", "K is a projection of 'memory'"),
    ("input_weight", "is not a constant 2-D matrix"),
    ("rotary", "Q is read in layout bhsd (made by Mul)")])
def test_near_misses_stay_apart_and_say_why(kind, why, caplog):
    with caplog.at_level(logging.INFO, logger="plugrt.passes.pack_projections"):
        before, after = check_pass(before_packing(encoder(kind)), pack.run)
    assert [n.op_type for n in after.nodes] == [n.op_type for n in before.nodes]
    assert not attention_of(after).attrs.get("packed") and why in caplog.text


def test_the_pass_can_be_disabled():
    registry = default_registry()
    graph = import_model(encoder(), registry=registry)
    optimize(graph, registry, disabled=[pack.NAME])
    assert count(graph, "MatMul") + count(graph, "Fused") >= 3 and not attention_of(graph).attrs.get("packed")


# --------------------------------------------------------------------------- engines


def build(model, variant=None, monkeypatch=None, profile=None, **config):
    if variant is not None:
        monkeypatch.setattr(tactics, "candidates", lambda gpu=None, **_: VARIANTS[variant][0])
    config = BuilderConfig(progress=False, **{"tf32": variant == "tf32", **config})
    if profile:
        shapes = OptimizationProfile()
        for name, (low, opt, high) in profile.items():
            shapes.set_shape(name, low, opt, high)
        config.add_optimization_profile(shapes)
    return Builder(default_registry()).build_engine(model, config)


def projection_layers(engine):
    """The engine's layers that run a GEMM (alone or with an epilogue), by op label."""
    return [layer["op"] for layer in engine.inspect()["layers"] if "MatMul" in layer["op"] or "Gemm" in layer["op"]]


def outputs(engine, feeds):
    return engine.create_execution_context().execute(feeds)["y"]


def check_against_onnxruntime(model, engine, rng, tol, shapes=((B, S),)):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s in shapes:
        feeds = feeds_for(model, rng, b, s)
        np.testing.assert_allclose(outputs(engine, feeds), session.run(None, feeds)[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bert_like_engine_runs_one_fused_projection_gemm(variant, monkeypatch, rng):
    """One MatMul+Add layer (the packed biases in its epilogue), then the attention reading
    its output thrice; the engine without the pass agrees with it and onnxruntime."""
    model = encoder("bert")
    engine = build(model, variant, monkeypatch)
    assert projection_layers(engine) == ["MatMul+Add"]
    node = attention_of(engine.graph)
    assert node.attrs["packed"] and len(set(node.inputs[:3])) == 1
    check_against_onnxruntime(model, engine, rng, VARIANTS[variant][1])
    unpacked = build(model, variant, monkeypatch, disabled_passes=[PACK])
    assert projection_layers(unpacked).count("MatMul+Add") == 3
    feeds = feeds_for(model, rng)
    np.testing.assert_allclose(outputs(engine, feeds), outputs(unpacked, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["vit", "t5", "gqa", "k_read"])
def test_packed_engines_match_onnxruntime(kind, rng):
    model = encoder(kind)
    engine = build(model, tf32=False)
    assert attention_of(engine.graph).attrs["packed"]
    check_against_onnxruntime(model, engine, rng, 1e-4)


def test_gpt2_engine_reads_the_gemm_without_its_split(rng):
    model = gpt2()
    engine = build(model, tf32=False)
    ops = [layer["op"] for layer in engine.inspect()["layers"]]
    assert "Split" not in ops and attention_of(engine.graph).attrs["packed"] == [HIDDEN] * 3
    check_against_onnxruntime(model, engine, rng, 1e-4)


def test_dynamic_batch_and_sequence(rng):
    """Head-split targets computed from x's shape: the engine runs at two profile shapes."""
    model = encoder("bert", dynamic=True)
    engine = build(model, profile={"x": ((1, 2, HIDDEN), (B, S, HIDDEN), (3, 7, HIDDEN)),
                                   "mask": ((1, 1, 1, 2), (B, 1, 1, S), (3, 1, 1, 7))}, tf32=False)
    assert attention_of(engine.graph).attrs["packed"]
    check_against_onnxruntime(model, engine, rng, 1e-4, shapes=((B, S), (3, 7), (1, 2)))


def test_float16_engine_packs_before_precision_and_keeps_the_epilogue(rng):
    """With FP16 the packed MatMul+Add is still one fused layer, in float16 like the
    attention, no cast between them."""
    model = encoder("bert")
    engine = build(model, fp16=True, tf32=False)
    layers = engine.inspect()["layers"]
    gemm = next(layer for layer in layers if layer["op"] == "MatMul+Add")
    attention = next(layer for layer in layers if layer["op"] == QUALIFIED)
    assert gemm["precision"] == attention["precision"] == "fp16"
    assert len(gemm["onnx_nodes"]) == 6  # the three MatMuls and their Adds
    node = attention_of(engine.graph)
    assert engine.graph.producers()[node.inputs[0]].op_type == "Fused"  # no reformat between
    check_against_onnxruntime(model, engine, rng, 2e-2)


def timm(unbind: str, dynamic: bool = False):
    """timm's ViT attention: ``qkv(x).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)`` taken
    apart along axis 0 as the exporters write ``unbind``/unpacking (``split``: Split and
    Squeeze, the legacy exporter; ``slice``: Slice and Squeeze, dynamo; ``gather``:
    ``qkv[0], qkv[1], qkv[2]``), then softmax(q k^T / sqrt(D)) v and the head merge."""
    g, rng = Graph(), np.random.default_rng(5)
    b, s = ("batch", "seq") if dynamic else (B, S)
    x = g.input("x", (b, s, HIDDEN))
    packed = projection(g, rng, x, "qkv", 3 * HIDDEN)
    target = g.op("Concat", g.dim(packed, 0), g.dim(packed, 1), g.const("heads5", [3, H, D], np.int64), axis=0)
    qkv = g.op("Transpose", g.op("Reshape", packed, target), perm=[2, 0, 3, 1, 4])
    zero = g.const("axis0", [0], np.int64)
    if unbind == "split":
        out = [f"part{i}" for i in range(3)]
        g.nodes.append(helper.make_node("Split", [qkv, g.const("ones", [1, 1, 1], np.int64)], out, axis=0))
        q, k, v = (g.op("Squeeze", part, zero) for part in out)
    elif unbind == "slice":
        q, k, v = (g.op("Squeeze", g.op("Slice", qkv, g.const(f"lo{i}", [i], np.int64),
                                        g.const(f"hi{i}", [i + 1], np.int64), zero), zero) for i in range(3))
    else:
        q, k, v = (g.op("Gather", qkv, g.const(f"at{i}", i, np.int64), axis=0) for i in range(3))
    scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), g.const("root", np.sqrt(D)))
    g.merge_heads(g.op("MatMul", g.op("Softmax", scores, axis=-1), v), HIDDEN)
    return g.model()


@pytest.mark.parametrize("unbind", ["split", "slice", "gather"])
def test_timm_packed_qkv_is_read_in_place(unbind, rng):
    """The attention reads timm's one qkv GEMM in place: no 5-D Transpose, no Split, Slice,
    Squeeze or Gather left; the engine matches onnxruntime, over a dynamic batch and sequence too."""
    model = timm(unbind)
    engine = build(model, tf32=False)
    ops = [layer["op"] for layer in engine.inspect()["layers"]]
    assert ops == ["MatMul+Add", QUALIFIED], ops
    assert attention_of(engine.graph).attrs["packed"] == [HIDDEN] * 3
    check_against_onnxruntime(model, engine, rng, 1e-4)
    dynamic = timm(unbind, dynamic=True)
    engine = build(dynamic, profile={"x": ((1, 2, HIDDEN), (B, S, HIDDEN), (3, 7, HIDDEN))}, tf32=False)
    check_against_onnxruntime(dynamic, engine, rng, 1e-4, shapes=((B, S), (3, 7), (1, 2)))
