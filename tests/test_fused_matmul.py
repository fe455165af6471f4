"""``com.microsoft::FusedMatMul`` (MatMul with transposed operands and a scale) and the
matmul family's ``fold_transposes`` pass: every tactic against onnxruntime (which implements
the op), the pass folding only what it may, and a folded model's engine against the
unfolded model in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

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


def ops_after_passes(model):
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry, disabled=["fuse_epilogues", "fuse_pointwise"])
    return [(n.domain, n.op_type, dict(n.attrs)) for n in graph.nodes]


@pytest.mark.parametrize("perm, rank, folds", [([0, 1, 3, 2], 4, True), ([1, 0], 2, True), (None, 2, True),
                                               ([0, -1, -2], 3, True), ([1, 0, 3, 2], 4, False)])
def test_only_a_last_two_dims_transpose_folds(perm, rank, folds):
    found = ops_after_passes(attention_scores(perm, rank=rank))
    kinds = [(d, t) for d, t, _ in found]
    if folds:
        assert (MS, "FusedMatMul") in kinds and ("", "Transpose") not in kinds
        attrs = next(a for d, t, a in found if t == "FusedMatMul")
        assert attrs["transB"] == 1 and attrs["transA"] == 0
    else:
        assert (MS, "FusedMatMul") not in kinds and ("", "Transpose") in kinds


def test_a_transpose_read_elsewhere_stays():
    kinds = [(d, t) for d, t, _ in ops_after_passes(attention_scores([0, 1, 3, 2], extra_reader=True))]
    assert (MS, "FusedMatMul") not in kinds and ("", "Transpose") in kinds


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
