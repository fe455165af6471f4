"""``com.microsoft::FusedMatMul`` (MatMul with transposed operands and a scale) and the
matmul family's ``fold_transposes`` pass: every tactic against onnxruntime (which implements
the op), the pass folding only what it may, and a folded model's engine against the
unfolded model in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig
from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.registry import default_registry
from plugrt.testing import check_node, node_tactics, single_node_model

MS = "com.microsoft"


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def fused_model(feeds, attrs):
    model = single_node_model("FusedMatMul", feeds, attrs, domain=MS, opset=1)
    return model


def onnxruntime_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("shapes, attrs", [
    ({"a": (2, 3, 5, 8), "b": (2, 3, 6, 8)}, {"transB": 1}),
    ({"a": (8, 5), "b": (3, 8, 6)}, {"transA": 1, "alpha": 0.5}),
    ({"a": (2, 1, 8, 4), "b": (3, 6, 8)}, {"transA": 1, "transB": 1, "alpha": 0.25}),   # broadcast batch
    ({"a": (4, 7), "b": (7, 3)}, {"alpha": 2.0}),
])
def test_fused_matmul_matches_onnxruntime(rng, shapes, attrs):
    feeds = {name: rand(rng, shape) for name, shape in shapes.items()}
    expected = onnxruntime_run(fused_model(feeds, attrs), feeds)
    got = check_node("FusedMatMul", feeds, attrs, domain=MS, opset=1, rtol=1e-5, atol=1e-5)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_unsupported_attributes_are_declared(rng):
    from plugrt.errors import UnsupportedError

    feeds = {"a": rand(rng, (2, 3, 4)), "b": rand(rng, (2, 4, 5))}
    with pytest.raises(UnsupportedError, match="transBatchA"):
        import_model(fused_model(feeds, {"transBatchA": 1}), registry=default_registry())


def test_fp16_with_b_transposed_gets_the_tensor_core_tactic(rng):
    feeds = {"a": rand(rng, (128, 64), np.float16), "b": rand(rng, (128, 64), np.float16)}
    graph = import_model(fused_model(feeds, {"transB": 1}), registry=default_registry())
    names = [t.name for t in node_tactics(graph, default_registry())]
    assert any(name.startswith("wgmma_f16") for name in names), names


def attention_scores(perm, extra_reader=False, rank=4):
    """Q @ Transpose(K, perm) (then a Softmax, so it is no attention pattern), and maybe
    a second reader of the transposed K."""
    shape = [3, 3, 5, 8][-rank:]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], name="kt", **({} if perm is None else {"perm": perm})),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["kt"], ["n"], name="neg"))
        outputs.append(helper.make_tensor_value_info("n", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info("q", TensorProto.FLOAT, shape),
                                                helper.make_tensor_value_info("k", TensorProto.FLOAT, shape)], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: The contrib attention plugin's pass, which claims whole attention subgraphs first.
ATTENTION_PASS = "contrib-attention:fuse_attention"


def ops_after_passes(model, disabled=()):
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry, disabled=["fuse_epilogues", "fuse_pointwise", *disabled])
    return [(n.domain, n.op_type, dict(n.attrs)) for n in graph.nodes]


@pytest.mark.parametrize("perm, rank, fused", [([0, 1, 3, 2], 4, "FusedMatMul"), ([1, 0], 2, "FusedMatMul"),
                                               (None, 2, "FusedMatMul"), ([0, -1, -2], 3, "FusedMatMul"),
                                               ([1, 0, 3, 2], 4, "PermutedMatMul")])
def test_transposes_fold_into_the_product(perm, rank, fused):
    """A last-two-dims swap gives ONNX Runtime's FusedMatMul, any other perm PermutedMatMul."""
    found = ops_after_passes(attention_scores(perm, rank=rank))
    kinds = [t for _, t, _ in found]
    assert fused in kinds and "Transpose" not in kinds and "MatMul" not in kinds, kinds
    attrs = next(a for _, t, a in found if t == fused)
    if fused == "FusedMatMul":
        assert attrs["transB"] == 1 and attrs["transA"] == 0
    else:
        assert list(attrs["perm_b"]) == [1, 0, 3, 2] and not attrs["perm_a"]


def test_a_transpose_read_elsewhere_stays():
    kinds = [(d, t) for d, t, _ in ops_after_passes(attention_scores([0, 1, 3, 2], extra_reader=True))]
    assert (MS, "FusedMatMul") not in kinds and ("", "Transpose") in kinds and ("", "MatMul") in kinds


@pytest.mark.parametrize("fp16", [False, True])
def test_a_folded_model_matches_onnxruntime(rng, fp16):
    model = attention_scores([0, 1, 3, 2])
    feeds = {"q": rand(rng, (3, 3, 5, 8)), "k": rand(rng, (3, 3, 5, 8))}
    config = BuilderConfig(optimization_level=0, progress=False, fp16=fp16)
    engine = Builder().build_engine(model, config)
    assert any(layer["op"].endswith("FusedMatMul") or "FusedMatMul" in layer["op"]
               for layer in engine.inspect()["layers"]), [layer["op"] for layer in engine.inspect()["layers"]]
    got = engine.create_execution_context().execute(feeds)["y"]
    expected = onnxruntime_run(model, feeds)
    tol = 1e-2 if fp16 else 1e-5
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * np.abs(expected).max())


def hf_attention(scale_rank=0):
    """Attention as a transformers (SDPA) export writes it (Q, K and V the projections'
    outputs, here inputs): heads split by Reshape and
    Transpose, Q and K^T each scaled by sqrt(1/sqrt(D)), a mask, Softmax, a NaN guard
    (``Where(IsNaN(p), 0, p)``), P @ V, heads merged."""
    b, s, h, d = 2, 5, 3, 4
    scale = np.full((1,) * scale_rank, (1 / np.sqrt(d)) ** 0.5, np.float32)
    consts = {"shape4": np.array([b, s, h, d], np.int64), "shape3": np.array([b, s, h * d], np.int64),
              "scale": scale, "zero": np.zeros((), np.float32)}
    nodes = [
        helper.make_node("Reshape", ["xq", "shape4"], ["q4"], name="q_split"),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3], name="q_heads"),
        helper.make_node("Mul", ["qt", "scale"], ["qs"], name="q_scale"),
        helper.make_node("Reshape", ["xk", "shape4"], ["k4"], name="k_split"),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="k_heads_t"),
        helper.make_node("Mul", ["kt", "scale"], ["ks"], name="k_scale"),
        helper.make_node("MatMul", ["qs", "ks"], ["scores"], name="scores"),
        helper.make_node("Add", ["scores", "mask"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("IsNaN", ["probs"], ["nan"], name="isnan"),
        helper.make_node("Where", ["nan", "zero", "probs"], ["guarded"], name="guard"),
        helper.make_node("Reshape", ["xv", "shape4"], ["v4"], name="v_split"),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3], name="v_heads"),
        helper.make_node("MatMul", ["guarded", "vt"], ["att"], name="context"),
        helper.make_node("Transpose", ["att"], ["merged"], perm=[0, 2, 1, 3], name="merge"),
        helper.make_node("Reshape", ["merged", "shape3"], ["y"], name="y"),
    ]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [b, s, h * d]) for name in ("xq", "xk", "xv")]
    graph = helper.make_graph(nodes, "hf", inputs + [helper.make_tensor_value_info("mask", TensorProto.FLOAT, [b, 1, 1, s])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, h * d])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_exports_scaled_head_transposes_fold_into_one_product():
    """Without the attention plugin's pass, the products read the head splits in place."""
    found = ops_after_passes(hf_attention(), disabled=[ATTENTION_PASS])
    scores = [(t, a) for _, t, a in found if t == "PermutedMatMul"]
    assert len(scores) == 2, [t for _, t, _ in found]  # Q K^T, and P V (V's head split)
    attrs = scores[0][1]
    assert list(attrs["perm_a"]) == [0, 2, 1, 3] and list(attrs["perm_b"]) == [0, 2, 3, 1]
    assert attrs["alpha"] == pytest.approx(1 / np.sqrt(4))
    assert [t for _, t, _ in found].count("Transpose") == 1  # only the head merge after P V is left


def test_a_scale_that_widens_the_operand_is_not_folded():
    """Mul(Transpose(A), s) with s of shape [1, 1, 1] makes a 2-D A 3-D: not a plain factor."""
    nodes = [helper.make_node("Transpose", ["a"], ["at"], perm=[1, 0], name="t"),
             helper.make_node("Mul", ["at", "s"], ["as"], name="scale"),
             helper.make_node("MatMul", ["as", "b"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "widen", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 5]),
                                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.full((1, 1, 1), 0.5, np.float32), "s")])
    kinds = [t for _, t, _ in ops_after_passes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))]
    assert kinds == ["Transpose", "Mul", "MatMul"], kinds


def test_with_the_attention_plugin_the_guarded_export_is_one_attention_node():
    found = ops_after_passes(hf_attention())
    fused = [(t, a) for _, t, a in found if t == "MultiHeadAttention"]
    assert len(fused) == 1 and fused[0][1]["guard_nan"] == 1, [t for _, t, _ in found]
    assert not {"Softmax", "IsNaN", "Where"} & {t for _, t, _ in found}


@pytest.mark.parametrize("attention", [False, True])
@pytest.mark.parametrize("fp16", [False, True])
def test_a_folded_export_matches_onnxruntime(rng, fp16, attention):
    model = hf_attention()
    feeds = {name: rand(rng, (2, 5, 12)) for name in ("xq", "xk", "xv")}
    feeds["mask"] = np.where(rng.random((2, 1, 1, 5)) < 0.3, -1e4, 0).astype(np.float32)
    config = BuilderConfig(optimization_level=0, progress=False, fp16=fp16,
                           disabled_passes=() if attention else (ATTENTION_PASS,))
    engine = Builder().build_engine(model, config)
    op = "MultiHeadAttention" if attention else "PermutedMatMul"
    assert any(op in layer["op"] for layer in engine.inspect()["layers"])
    got = engine.create_execution_context().execute(feeds)["y"]
    expected = onnxruntime_run(model, feeds)
    tol = 1e-2 if fp16 else 1e-5
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * np.abs(expected).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_permuted_matmul_tactics_match_the_reference(rng, dtype):
    feeds = {"a": rand(rng, (2, 5, 3, 8), dtype), "b": rand(rng, (2, 6, 3, 8), dtype)}
    attrs = {"perm_a": [0, 2, 1, 3], "perm_b": [0, 2, 3, 1], "alpha": 0.5}
    tol = 1e-2 if dtype == np.float16 else 1e-5
    got = check_node("PermutedMatMul", feeds, attrs, domain="plugrt.matmul", opset=1, rtol=tol, atol=tol)[0]
    a = np.transpose(feeds["a"].astype(np.float64), (0, 2, 1, 3))
    b = np.transpose(feeds["b"].astype(np.float64), (0, 2, 3, 1))
    np.testing.assert_allclose(got.astype(np.float64), 0.5 * (a @ b), rtol=tol, atol=tol)


def test_a_plan_with_folded_products_round_trips(rng, tmp_path):
    from plugrt.engine import Engine

    model = hf_attention()
    engine = Builder().build_engine(model, BuilderConfig(optimization_level=0, progress=False))
    path = tmp_path / "hf.plan"
    engine.save(str(path))
    loaded = Engine.load(str(path))
    feeds = {name: rand(rng, (2, 5, 12)) for name in ("xq", "xk", "xv")}
    feeds["mask"] = np.zeros((2, 1, 1, 5), np.float32)
    got = loaded.create_execution_context().execute(feeds)["y"]
    np.testing.assert_allclose(got, onnxruntime_run(model, feeds), rtol=1e-5, atol=1e-5)
    assert [layer["op"] for layer in loaded.inspect()["layers"]] == [layer["op"] for layer in engine.inspect()["layers"]]
