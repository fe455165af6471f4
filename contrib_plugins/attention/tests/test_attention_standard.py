"""The standard ONNX ``Attention`` (opset 23) as exporters write it: built engines run it as
one MultiHeadAttention (the head split and merge around it taken into the op's layout) and
match onnxruntime on fresh inputs, over dynamic dims; nodes the plugin does not implement
are expanded into their ONNX body and still match; with the fusion pass disabled the op
runs the same kernels itself."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE

ort = pytest.importorskip("onnxruntime")
FLOAT = TensorProto.FLOAT
MHA = f"{DOMAIN}::{OP_TYPE}"
EXPORTS = pathlib.Path(__file__).resolve().parents[3] / "tests" / "data" / "exports"


def projected(rng, *, heads=2, kv_heads=1, head=4, three_d=False, mask=None, attrs=None, hidden=8):
    """x ``[batch, seq, hidden]`` projected to Q (``heads``) and K, V (``kv_heads``), the
    ``Attention`` node over them (4-D after PyTorch's head split, or 3-D), the heads merged
    back and projected out. ``mask``: ``None``, ``"bool"`` or ``"float"``, a graph input
    ``mask`` of shape ``[batch, 1, seq, seq]``."""
    w = {name: numpy_helper.from_array((rng.standard_normal(shape) / 3).astype(np.float32), name)
         for name, shape in (("wq", (hidden, heads * head)), ("wk", (hidden, kv_heads * head)),
                             ("wv", (hidden, kv_heads * head)), ("wo", (heads * head, hidden)))}
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("q_split", [0, 0, heads, head]), ("kv_split", [0, 0, kv_heads, head]), ("merge", [0, 0, heads * head]))]
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}p"]) for n in "qkv"]
    if three_d:
        ins = ["qp", "kp", "vp"]
        attrs = dict(attrs or {}, q_num_heads=heads, kv_num_heads=kv_heads)
    else:
        for n in "qkv":
            nodes += [helper.make_node("Reshape", [f"{n}p", "q_split" if n == "q" else "kv_split"], [f"{n}s"]),
                      helper.make_node("Transpose", [f"{n}s"], [f"{n}h"], perm=[0, 2, 1, 3])]
        ins = ["qh", "kh", "vh"]
    inputs = [helper.make_tensor_value_info("x", FLOAT, ["batch", "seq", hidden])]
    if mask is not None:
        ins.append("mask")
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL if mask == "bool" else FLOAT,
                                                    ["batch", 1, "seq", "seq"]))
    nodes.append(helper.make_node("Attention", ins, ["a"], name="sdpa", **(attrs or {})))
    if three_d:
        nodes.append(helper.make_node("MatMul", ["a", "wo"], ["y"]))
    else:
        nodes += [helper.make_node("Transpose", ["a"], ["am"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["am", "merge"], ["ar"]), helper.make_node("MatMul", ["ar", "wo"], ["y"])]
    output = helper.make_tensor_value_info("y", FLOAT, ["batch", "seq", 8])
    graph = helper.make_graph(nodes, "attention23", inputs, [output],
                              list(w.values()) + consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model)
    return model


def feeds(model, rng, batch, seq):
    found = {"x": rng.standard_normal((batch, seq, 8)).astype(np.float32)}
    names = {value.name: value for value in model.graph.input}
    if "mask" in names:
        keep = rng.random((batch, 1, seq, seq)) < 0.7
        keep[..., 0] = True  # (no row masked whole: onnxruntime and ONNX differ there)
        found["mask"] = keep if names["mask"].type.tensor_type.elem_type == TensorProto.BOOL else \
            np.where(keep, 0.0, -1e4).astype(np.float32)
    return found


def engine_of(model, passes=None, fp16=False):
    config = BuilderConfig(progress=False, tf32=False, fp16=fp16)
    if passes:
        config.disabled_passes = set(passes)
    profile = OptimizationProfile().set_shape("x", (1, 1, 8), (2, 4, 8), (2, 5, 8))
    if any(value.name == "mask" for value in model.graph.input):
        profile.set_shape("mask", (1, 1, 1, 1), (2, 1, 4, 4), (2, 1, 5, 5))
    config.add_optimization_profile(profile)
    return Builder(default_registry()).build_engine(model, config)


def matches_onnxruntime(model, engine, rng, rtol=1e-4, atol=1e-5):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with engine.create_execution_context() as context:
        for batch, seq in ((2, 4), (1, 5), (2, 3)):
            given = feeds(model, rng, batch, seq)
            np.testing.assert_allclose(context.execute(given)["y"], session.run(None, given)[0], rtol=rtol, atol=atol)


def layer_ops(engine):
    return [layer["op"] for layer in engine.inspect()["layers"]]


@pytest.mark.parametrize("case", ["4d_causal_gqa", "3d_bool_mask", "4d_float_mask", "4d_named_heads"])
def test_attention_runs_as_one_fused_layer_and_matches_onnxruntime(case, rng):
    """(``4d_named_heads``: opsets 23 and 24 let a 4-D node name its head counts too.)"""
    model = {"4d_causal_gqa": lambda: projected(rng, attrs={"is_causal": 1}),
             "4d_named_heads": lambda: projected(rng, attrs={"is_causal": 1, "q_num_heads": 2, "kv_num_heads": 1}),
             "3d_bool_mask": lambda: projected(rng, three_d=True, mask="bool"),
             "4d_float_mask": lambda: projected(rng, heads=2, kv_heads=2, mask="float", attrs={"scale": 0.25})}[case]()
    assert "Attention" in {node.op_type for node in import_model(model).nodes}  # (kept whole, not expanded)
    engine = engine_of(model)
    ops = layer_ops(engine)
    assert ops.count(MHA) == 1 and not [op for op in ops if "Softmax" in op or "Transpose" in op], ops
    matches_onnxruntime(model, engine, rng)


def test_a_node_the_plugin_declines_is_expanded_and_still_matches(rng):
    model = projected(rng, heads=2, kv_heads=2, attrs={"softcap": 2.0})
    assert "Attention" not in {node.op_type for node in import_model(model).nodes}
    matches_onnxruntime(model, engine_of(model), rng)


def test_without_the_fusion_pass_the_op_runs_its_own_kernels(rng):
    """A boolean mask converted in the op's workspace before the fused kernel."""
    model = projected(rng, three_d=True, mask="bool", attrs={"is_causal": 1})
    engine = engine_of(model, passes=["contrib-attention:fuse_attention"])
    assert "Attention" in layer_ops(engine) and MHA not in layer_ops(engine), layer_ops(engine)
    matches_onnxruntime(model, engine, rng)


def test_float16_engine(rng):
    model = projected(rng, attrs={"is_causal": 1})
    matches_onnxruntime(model, engine_of(model, fp16=True), rng, rtol=2e-2, atol=2e-2)


def test_pytorch_sdpa_export_is_fused():
    """``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` exported by PyTorch 2.13
    at opset 23 (``tests/data/exports``): one fused layer, no head transposes left."""
    model = onnx.load(EXPORTS / "torch_sdpa_opset23.onnx")
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 5, 16), (2, 5, 16), (4, 5, 16)))
    ops = layer_ops(Builder(default_registry()).build_engine(model, config))
    assert ops.count(MHA) == 1 and not [op for op in ops if "Softmax" in op], ops


def test_pytorch_llama_block_export_matches_onnx_reference(rng):
    """A pre-norm block with grouped-query SDPA over a boolean padding mask (``nn.RMSNorm``,
    ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :],
    enable_gqa=True)``, 4 query heads over 2 K/V heads) exported by PyTorch 2.13 with
    ``dynamo=True, opset_version=23`` and dynamic batch and sequence: one fused attention
    reading a packed Q/K/V GEMM, matching ONNX's reference evaluator (onnxruntime 1.32
    refuses the broadcast ``[B, 1, 1, T]`` mask) at three shapes of the profile."""
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(EXPORTS / "torch_gqa_block_opset23.onnx")
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 1, 32), (2, 4, 32), (2, 6, 32))
                                    .set_shape("mask", (1, 1), (2, 4), (2, 6)))
    engine = Builder(default_registry()).build_engine(model, config)
    ops = layer_ops(engine)
    assert ops.count(MHA) == 1 and ops.count("MatMul") == 1 and "Transpose" not in ops, ops
    reference = ReferenceEvaluator(model)
    with engine.create_execution_context() as context:
        for batch, seq in ((2, 6), (1, 3), (2, 5)):
            keep = rng.random((batch, seq)) < 0.7
            keep[:, 0] = True
            given = {"x": rng.standard_normal((batch, seq, 32)).astype(np.float32), "mask": keep}
            out = model.graph.output[0].name
            np.testing.assert_allclose(context.execute(given)[out], reference.run(None, given)[0], rtol=1e-4, atol=1e-5)


def test_mask_and_cache_kernels_type_for_sm90():
    """The simulator never types kernels: the op's boolean and float mask conversions and
    its KV-cache append, compiled for sm_90."""
    import sys

    sys.path.insert(0, str(EXPORTS.parents[1]))
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_contrib_attention.standard import _additive_cast, _additive_from_bool, _append_kv
        for out in ("float16", "float32"):
            check(f"bool -> {out}", _additive_from_bool, [arr(np.bool_), arr(out), I64, scalar(out), scalar(out)],
                  out != "float64")
            for given in ("float16", "float32", "float64"):
                check(f"{given} -> {out}", _additive_cast, [arr(given), arr(out), I64, scalar(out), scalar(out)])
            check(f"append {out}", _append_kv, [arr(out)] * 3 + [I64] * 8, True)
    """)
    assert not failures, "\\n".join(failures)


def cached(three_d: bool, outputs: int):
    """One decoding step's Attention with a KV cache (opset 23): Q, K, V of this step's
    ``S`` positions, ``past_key``/``past_value`` of ``P`` earlier ones, causal; batch, S and
    P dynamic. ``outputs``: 3 (Y and the present K/V) or 1 (Y alone: they go to the workspace)."""
    heads, kv_heads, head = 4, 2, 4
    if three_d:
        ins = [helper.make_tensor_value_info("q", FLOAT, ["b", "s", heads * head]),
               helper.make_tensor_value_info("k", FLOAT, ["b", "s", kv_heads * head]),
               helper.make_tensor_value_info("v", FLOAT, ["b", "s", kv_heads * head])]
        attrs = {"q_num_heads": heads, "kv_num_heads": kv_heads}
        y = helper.make_tensor_value_info("y", FLOAT, ["b", "s", heads * head])
    else:
        ins = [helper.make_tensor_value_info("q", FLOAT, ["b", heads, "s", head]),
               helper.make_tensor_value_info("k", FLOAT, ["b", kv_heads, "s", head]),
               helper.make_tensor_value_info("v", FLOAT, ["b", kv_heads, "s", head])]
        attrs = {}
        y = helper.make_tensor_value_info("y", FLOAT, ["b", heads, "s", head])
    ins += [helper.make_tensor_value_info(n, FLOAT, ["b", kv_heads, "p", head]) for n in ("past_key", "past_value")]
    outs = [y] + [helper.make_tensor_value_info(n, FLOAT, ["b", kv_heads, "t", head])
                  for n in ("present_key", "present_value")][:outputs - 1]
    node = helper.make_node("Attention", ["q", "k", "v", "", "past_key", "past_value"], [o.name for o in outs],
                            is_causal=1, name="step", **attrs)
    model = helper.make_model(helper.make_graph([node], "step", ins, outs), opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("three_d,outputs", [(False, 3), (True, 3), (False, 1)])
def test_a_kv_cache_step_matches_onnxruntime(rng, three_d, outputs):
    """The present K/V appended to the cache and attended with the causal mask aligned to the
    cache's end, over dynamic batch, step length and cache length, against onnxruntime (ONNX's
    reference evaluator where the present outputs are not asked for)."""
    model = cached(three_d, outputs)
    assert "Attention" in {node.op_type for node in import_model(model).nodes}  # (kept whole)
    shapes = {name: value.type.tensor_type.shape for name, value in ((v.name, v) for v in model.graph.input)}

    def at(name, b, s, p):
        sizes = {"b": b, "s": s, "p": p}
        return tuple(sizes.get(d.dim_param, d.dim_value) for d in shapes[name].dim)

    config = BuilderConfig(progress=False, tf32=False)
    profile = OptimizationProfile()
    for name in shapes:
        profile.set_shape(name, at(name, 1, 1, 1), at(name, 2, 2, 3), at(name, 2, 3, 5))
    config.add_optimization_profile(profile)
    engine = Builder(default_registry()).build_engine(model, config)
    if outputs == 3:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    else:  # (onnxruntime 1.32 refuses a cache without the present outputs: ONNX's reference evaluator)
        from onnx.reference import ReferenceEvaluator

        session = ReferenceEvaluator(model)
    with engine.create_execution_context() as context:
        for b, s, p in ((2, 2, 3), (1, 1, 5), (2, 3, 1)):
            given = {name: rng.standard_normal(at(name, b, s, p)).astype(np.float32) for name in shapes}
            got, want = context.execute(given), session.run(None, given)
            for value, expected in zip(model.graph.output, want):
                np.testing.assert_allclose(got[value.name], expected, rtol=1e-4, atol=1e-5, err_msg=value.name)
