"""The fuse_attention pass on small attention graphs: node counts, and outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.registry import default_registry
from plugrt.testing import check_pass, random_feeds
from plugrt_contrib_attention import fuse
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE

B, H, S, D = 2, 3, 5, 4
PASS = f"contrib-attention:{fuse.NAME}"


class Graph:
    """A tiny ONNX graph under construction: inputs, constants and nodes."""

    def __init__(self):
        self.nodes, self.inits, self.inputs = [], [], []

    def input(self, name, shape):
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def op(self, op_type, *inputs, **attrs):
        out = f"{op_type.lower()}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"{op_type}_{len(self.nodes)}", **attrs))
        return out

    def model(self, output, opset=17):
        self.nodes[-1].output[0] = "y"
        graph = helper.make_graph(self.nodes, "attention", self.inputs,
                                  [helper.make_empty_tensor_value_info("y")], initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def torch_style(scale="div", mask=None, softmax_axis=-1, q_scale=None, k_scale=None, guard=None):
    """Attention as torch.onnx exports it from [B, S, H, D] projections: Transpose(q,
    [0,2,1,3]); K's permute and transpose(-1, -2); the scale; the mask; Softmax; MatMul."""
    g = Graph()
    q = g.op("Transpose", g.input("q", (B, S, H, D)), perm=[0, 2, 1, 3])
    k = g.op("Transpose", g.input("k", (B, S, H, D)), perm=[0, 2, 1, 3])
    v = g.op("Transpose", g.input("v", (B, S, H, D)), perm=[0, 2, 1, 3])
    if q_scale is not None:
        q = g.op("Mul", q, g.const("q_scale", q_scale))
    kt = g.op("Transpose", k, perm=[0, 1, 3, 2])
    if k_scale is not None:
        kt = g.op("Mul", kt, g.const("k_scale", k_scale))
    scores = g.op("MatMul", q, kt)
    if scale == "div":
        scores = g.op("Div", scores, g.const("root_d", np.sqrt(D)))
    elif scale == "mul":
        scores = g.op("Mul", g.const("inv_root_d", 1 / np.sqrt(D)), scores)
    elif scale == "per_head":
        scores = g.op("Mul", scores, g.const("per_head", np.linspace(0.2, 0.6, H).reshape(1, H, 1, 1)))
    if mask is not None:
        scores = g.op("Add", scores, g.input("mask", mask))
    probs = g.op("Softmax", scores, axis=softmax_axis)
    if guard is not None:  # PyTorch's SDPA export: Where(IsNaN(p), 0, p)
        probs = g.op("Where", g.op("IsNaN", probs), g.const("fill", guard), probs)
    g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    return g.model("y")


def ops_of(graph):
    return [node.op_type for node in graph.nodes]


def through_pipeline(model, disabled=()):
    """The graph as the builder's pass pipeline leaves it (plugin passes included)."""
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry, disabled=disabled)
    return graph


def fused_node(graph):
    found = [node for node in graph.nodes if (node.domain, node.op_type) == (DOMAIN, OP_TYPE)]
    assert len(found) == 1, ops_of(graph)
    return found[0]


def merged_k(model):
    """The model as the built-in pair pass leaves K (its two Transposes merged into [0,2,3,1])."""
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry, disabled=[name for name in ("fold_scales", "fuse_softmax", "fuse_epilogues",
                                                          "fuse_pointwise", "fold_transposes", PASS)])
    return graph


@pytest.mark.parametrize("scale", ["div", "mul", None])
def test_torch_export_form_is_fused(scale):
    before, after = check_pass(merged_k(torch_style(scale)), fuse.run, rtol=1e-5, atol=1e-6)
    # the product, the scale, Softmax, the product and every head transpose around them: one op
    assert ops_of(after) == [OP_TYPE] and len(before.nodes) == (7 if scale is None else 8)
    node = fused_node(after)
    assert node.attrs["scale"] == pytest.approx(1.0 if scale is None else 1 / np.sqrt(D))
    assert node.attrs["layout"] == "bshd,bshd,bshd,bshd" and node.inputs == ("q", "k", "v")


def test_mask_and_scale_on_q_and_k():
    """The SDPA export form: sqrt(scale) on Q and on K^T, an additive [B, 1, 1, S] mask."""
    model = torch_style(None, mask=(B, 1, 1, S), q_scale=0.5, k_scale=0.25)
    before, after = check_pass(merged_k(model), fuse.run, rtol=1e-5, atol=1e-6)
    node = fused_node(after)
    assert node.attrs["scale"] == pytest.approx(0.125)
    assert len(node.inputs) == 4 and node.inputs[3] == "mask"
    assert not {"Mul", "Add", "Softmax", "MatMul"} & set(ops_of(after))


def test_the_nan_guard_of_the_sdpa_export_is_fused_and_kept():
    """Where(IsNaN(softmax), 0, softmax): fused with ``guard_nan``; a fully masked row
    (every score -inf) gives zeros, as the guarded subgraph does, in the reference and on
    the device."""
    model = torch_style(None, mask=(B, 1, S, S), q_scale=0.5, k_scale=0.5, guard=0.0)
    before, after = check_pass(merged_k(model), fuse.run, rtol=1e-5, atol=1e-6)
    node = fused_node(after)
    assert node.attrs["guard_nan"] == 1 and not {"Where", "IsNaN", "Softmax"} & set(ops_of(after))
    from plugrt.engine import Builder, BuilderConfig
    from plugrt.reference import ReferenceExecutor

    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((B, S, H, D)).astype(np.float32) for n in "qkv"}
    mask = np.zeros((B, 1, S, S), np.float32)
    mask[0, 0, 1, :] = -np.inf  # a fully masked query row
    mask[1, 0, :, 2] = -np.inf  # a masked key
    feeds["mask"] = mask
    want = ReferenceExecutor(before, default_registry()).run(feeds)["y"]
    assert np.all(want[0, 1] == 0) and np.isfinite(want).all()
    got = Builder().build_engine(model, BuilderConfig(progress=False, tf32=False)).create_execution_context().execute(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_where_that_is_not_the_nan_guard_is_not_fused():
    graph = merged_k(torch_style(None, guard=1.0))
    assert OP_TYPE not in ops_of(check_pass(graph, fuse.run)[1])


def test_whole_pipeline_fuses_the_torch_export_form():
    graph = through_pipeline(torch_style("div", mask=(1, 1, S, S)))
    node = fused_node(graph)
    assert ops_of(graph) == [OP_TYPE] and node.inputs == ("q", "k", "v", "mask")  # K read as [B, S, H, D]
    assert node.attrs["layout"] == "bshd,bshd,bshd,bshd"
    assert OP_TYPE not in ops_of(through_pipeline(torch_style("div"), disabled=[PASS]))


def test_k_already_in_bhsd_needs_no_transpose():
    g = Graph()
    q, k, v = (g.input(n, (B, H, S, D)) for n in "qkv")
    g.op("MatMul", g.op("Softmax", g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                                        g.const("c", 0.5)), axis=3), v)
    before, after = check_pass(g.model("y"), fuse.run)
    assert ops_of(after) == [OP_TYPE] and fused_node(after).inputs[:3] == ("q", "k", "v")


def test_keys_and_values_shared_by_the_heads():
    g = Graph()
    q, k, v = g.input("q", (B, H, S, D)), g.input("k", (B, 1, S, D)), g.input("v", (1, 1, S, D))
    g.op("MatMul", g.op("Softmax", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))), v)
    before, after = check_pass(g.model("y"), fuse.run)
    assert ops_of(after) == [OP_TYPE]


@pytest.mark.parametrize("case", ["softmax_axis", "per_head_scale", "mask_widens_scores", "scores_read_twice",
                                  "head_too_big", "no_heads_axis"])
def test_not_fused(case):
    if case == "no_heads_axis":  # [B, S, D] attention, K transposed with a rank-3 perm
        g = Graph()
        q, k, v = (g.input(n, (B, S, D)) for n in "qkv")
        g.op("MatMul", g.op("Softmax", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 1]))), v)
        model = g.model("y")
    elif case == "head_too_big":  # no kernel's tiles fit in shared memory
        g = Graph()
        q, k, v = (g.input(n, (1, 1, 2, 1024)) for n in "qkv")
        g.op("MatMul", g.op("Softmax", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))), v)
        model = g.model("y")
    elif case == "softmax_axis":
        model = torch_style(softmax_axis=2)
    elif case == "per_head_scale":
        model = torch_style("per_head")
    else:
        g = Graph()
        q, k, v = (g.input(n, (B, H, S, D)) for n in "qkv")
        scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
        if case == "mask_widens_scores":
            g.op("MatMul", g.op("Softmax", g.op("Add", scores, g.input("mask", (2, B, H, S, S)))), v)
        else:
            g.op("Add", g.op("MatMul", g.op("Softmax", scores), v), g.op("ReduceMax", scores, axes=[-1]))
        model = g.model("y")
    before, after = check_pass(model, fuse.run)
    assert OP_TYPE not in ops_of(after) and ops_of(after) == ops_of(before)


def test_random_feeds_cover_the_mask():
    graph = merged_k(torch_style(mask=(B, 1, 1, S)))
    assert set(random_feeds(graph)) == {"q", "k", "v", "mask"}


def test_the_matmul_familys_transpose_fold_leaves_the_pattern_to_this_pass():
    """The built-in ``fold_transposes`` (priority 200) runs after this pass (100): the
    K transpose is still there when attention is matched."""
    graph = through_pipeline(torch_style())
    kinds = ops_of(graph)
    assert OP_TYPE in kinds and "FusedMatMul" not in kinds


def masked_by_where(fill):
    """torch_style attention whose scores go through Where(mask, scores, fill), the mask a
    [B, 1, S, S] bool input."""
    g = Graph()
    q, k, v = (g.input(n, (B, H, S, D)) for n in "qkv")
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    g.inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [B, 1, S, S]))
    g.op("MatMul", g.op("Softmax", g.op("Where", "keep", scores, g.const("fill", fill))), v)
    return g.model("y")


def test_a_where_over_an_input_mask_with_a_minus_inf_fill_is_an_additive_mask(caplog):
    """Where(keep, s, -inf) is s + Where(keep, 0, -inf): fused, the Where moved out of the op;
    with a finite fill (a row it masks whole averages V) it is not, and -v says why."""
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in "qkv"}
    feeds["keep"] = rng.random((B, 1, S, S)) < 0.7
    feeds["keep"][..., 0] = True  # no row masked whole (the graph would give NaN there)
    before, after = check_pass(masked_by_where(-np.inf), fuse.run, feeds=feeds, rtol=1e-5, atol=1e-6)
    node = fused_node(after)
    assert node.attrs["causal"] == 0 and ops_of(after) == ["Where", OP_TYPE]
    assert after.producers()[node.inputs[3]].op_type == "Where"
    with caplog.at_level("INFO", logger="plugrt.passes.fuse_attention"):
        before, after = check_pass(masked_by_where(-1e9), fuse.run, feeds=feeds)
    assert ops_of(after) == ops_of(before) and "fill -1e+09" in caplog.text


def test_a_head_transpose_read_elsewhere_stays():
    """Q's head transpose has a second reader: the op reads Q as [B, H, S, D] and the
    Transpose stays for the other reader; K, V and the output are taken in."""
    g = Graph()
    q, k, v = (g.op("Transpose", g.input(n, (B, S, H, D)), perm=[0, 2, 1, 3]) for n in "qkv")
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    out = g.op("Transpose", g.op("MatMul", g.op("Softmax", scores), v), perm=[0, 2, 1, 3])
    g.op("Add", out, g.op("Transpose", g.op("Neg", q), perm=[0, 2, 1, 3]))
    before, after = check_pass(g.model("y"), fuse.run)
    node = fused_node(after)
    assert node.attrs["layout"] == "bhsd,bshd,bshd,bshd" and ops_of(after).count("Transpose") == 2
