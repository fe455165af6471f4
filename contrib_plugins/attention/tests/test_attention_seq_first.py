"""The read_seq_first pass: torch.nn.MultiheadAttention's sequence-first packed projection
and out-projection (as torchvision's ViT exports them) around a fused attention become one
batch-first QKV MatMul read in place and one MatMul on the [B, S, E] output; no layout
node is left. Engines match onnxruntime on fresh inputs; near misses stay and -v says why."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from plugrt.engine import Builder, BuilderConfig
from plugrt.onnx.importer import import_model
from plugrt.passes import optimize
from plugrt.registry import default_registry
from plugrt_contrib_attention import seq_first

from .exports import B, D, H, S, Graph

ort = pytest.importorskip("onnxruntime")
E = H * D


def mha(kind="torchvision", seed=0):
    """``y = x + out_proj(attention(in_proj(x^T)))^T`` written as nn.MultiheadAttention's export
    (static shapes, the scale split over Q and K^T); near misses: ``seq_input`` (x already
    ``[S, B, E]``, no Transpose before the projection nor after the out-projection),
    ``weight_input`` (the in-projection's weight a graph input), ``swapped`` (Q and K taken
    as parts 1 and 0)."""
    g, rng = Graph(), np.random.default_rng(seed)
    x = g.input("x", (S, B, E) if kind == "seq_input" else (B, S, E))
    rows = x if kind == "seq_input" else g.op("Transpose", x, perm=[1, 0, 2])
    weight = g.input("w", (E, 3 * E)) if kind == "weight_input" else \
        g.const("w", rng.standard_normal((E, 3 * E)) / np.sqrt(E))
    p = g.op("Add", g.op("MatMul", rows, weight), g.const("b", 0.5 * rng.standard_normal(3 * E)))
    parts = g.op("Reshape", p, g.const("to_parts", [S, B, 3, E], np.int64))
    stacked = g.op("Squeeze", g.op("Transpose", g.op("Unsqueeze", parts, g.const("ax0", [0], np.int64)),
                                   perm=[3, 1, 2, 0, 4]), g.const("ax3", [3], np.int64))
    order = (1, 0, 2) if kind == "swapped" else (0, 1, 2)
    heads = []
    for index in order:
        part = g.op("Gather", stacked, g.const(f"part{index}", index, np.int64), axis=0)
        flat = g.op("Reshape", part, g.const(f"flat{index}", [S, B * H, D], np.int64))
        heads.append(g.op("Reshape", g.op("Transpose", flat, perm=[1, 0, 2]),
                          g.const(f"bhsd{index}", [B, H, S, D], np.int64)))
    q, k, v = heads
    c = g.const("c", np.sqrt(1 / np.sqrt(D)))
    scores = g.op("MatMul", g.op("Mul", q, c), g.op("Mul", g.op("Transpose", k, perm=[0, 1, 3, 2]), c))
    o = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    merged = g.op("Reshape", g.op("Transpose", o, perm=[2, 0, 1, 3]), g.const("merged", [S * B, E], np.int64))
    out = g.op("Gemm", merged, g.const("wo", rng.standard_normal((E, E)) / np.sqrt(E)),
               g.const("bo", 0.5 * rng.standard_normal(E)), transB=1)
    out = g.op("Reshape", out, g.const("unmerged", [S, B, E], np.int64))
    if kind != "seq_input":
        out = g.op("Transpose", out, perm=[1, 0, 2])
    g.op("Add", out, x)
    return g.model()


def optimized(model):
    registry = default_registry()
    graph = import_model(model, registry=registry)
    optimize(graph, registry)
    return graph


def ops(graph):
    return [node.op_type for node in graph.nodes]


def check_against_onnxruntime(model, rng, tol=1e-4):
    engine = Builder(default_registry()).build_engine(model, BuilderConfig(progress=False, tf32=False))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = (rng.standard_normal(shape) / (np.sqrt(E) if value.name == "w" else 1)).astype(np.float32)
    got = engine.create_execution_context().execute(feeds)["y"]
    np.testing.assert_allclose(got, session.run(None, feeds)[0], rtol=tol, atol=tol)


def test_the_sequence_first_block_becomes_two_matmuls_around_the_attention(rng):
    model = mha()
    graph = optimized(model)
    layout_ops = {"Transpose", "Reshape", "Gather", "Squeeze", "Unsqueeze", "Mul", "Gemm"}
    assert not layout_ops & set(ops(graph)), ops(graph)
    attention = next(node for node in graph.nodes if node.op_type == "MultiHeadAttention")
    assert attention.attrs["layout"] == "bsh,bsh,bsh,bsh" and list(attention.attrs["packed"]) == [E] * 3
    assert attention.attrs["num_heads"] == H and abs(attention.attrs["scale"] - 1 / np.sqrt(D)) < 1e-6
    assert len(ops(graph)) < len(model.graph.node) // 4, ops(graph)
    check_against_onnxruntime(model, rng)


@pytest.mark.parametrize("kind, why", [
    ("seq_input", "no Transpose [1, 0, 2] made"),
    ("weight_input", "not a constant 2-D matrix"),
    ("swapped", "do not pick Q as part 0 of 3"),
])
def test_near_misses_stay_and_say_why(kind, why, caplog, rng):
    model = mha(kind)
    with caplog.at_level(logging.INFO, logger=seq_first.log.name):
        optimized(model)
    assert why in caplog.text, caplog.text
    check_against_onnxruntime(model, rng)
