"""Real exports, tiny: models exported by ``torch.onnx.export`` from transformers and
torchvision (``benchmarks/export_tiny.py``: random weights, hidden 32, two layers, opset
17) build, match PyTorch's own outputs, and have their attention fused.

The exports keep every quirk of the full-size ones (PyTorch SDPA's NaN guard and boolean
mask, merged K transposes, T5's position bias, Swin's windows and shifted-window mask),
so the pattern passes are tested on what users feed them, not on hand-built graphs.
(ViT's classifier head, zeroed by torchvision's initialization, was given random weights
after its export; its expected output is onnxruntime's on that file.)
"""

from __future__ import annotations

import collections
import pathlib

import numpy as np
import onnx
import pytest

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

EXPORTS = pathlib.Path(__file__).resolve().parent / "data" / "exports"
ATTENTION = "plugrt.contrib::MultiHeadAttention"

#: name -> attention blocks the export has (every one fused).
MODELS = {"bert": 2, "bert_mask": 2, "gpt2": 2, "llama": 2, "t5_encoder": 2, "swin": 4, "vit": 2}
#: Exports whose attention reads Q, K and V in place from one projection GEMM (contrib-attention's
#: pack_projections: BERT's and T5's three MatMuls packed, GPT-2's Split of c_attn read through).
#: The rest also have one projection GEMM per block but slice it with layout ops (torchvision's
#: in_proj), or three, with the rotary embedding between them and the attention (LLaMA).
PACKED = {"bert", "bert_mask", "gpt2", "t5_encoder"}
#: Projection GEMMs per attention block.
GEMMS_PER_BLOCK = {"llama": 3}
GEMMS = {"MatMul", "Gemm", "plugrt.matmul::FusedMatMul"}


def build(name: str):
    data = np.load(EXPORTS / f"{name}.npz")
    feeds = {key[3:]: data[key] for key in data.files if key.startswith("in:")}
    config = BuilderConfig(progress=False, tf32=False)  # FP32 as exported: the 1e-4 match is an FP32 one
    profile = OptimizationProfile()
    for key, value in feeds.items():
        profile.set_shape(key, value.shape, value.shape, value.shape)
    config.add_optimization_profile(profile)
    engine = Builder().build_engine(onnx.load(EXPORTS / f"{name}.onnx"), config)
    return engine, feeds, data["out:output"]


def layer_ops(engine) -> collections.Counter:
    return collections.Counter(engine.graph.nodes[layer.node_index].qualified_op for layer in engine.layers)


def is_gemm(node) -> bool:
    if node.qualified_op == "plugrt.fused::Fused":
        return node.attrs["body"][0]["op_type"] in ("MatMul", "Gemm")
    return node.qualified_op in GEMMS


def projection_gemms(graph, attention) -> set:
    """The GEMM nodes Q, K and V come from (back through each node's first input)."""
    producers, found = graph.producers(), set()
    for name in attention.inputs[:3]:
        node = producers.get(name)
        for _ in range(12):
            if node is None or is_gemm(node):
                break
            node = producers.get(node.inputs[0])
        assert node is not None, f"{attention.name}: input {name!r} comes from no GEMM"
        found.add(node.name)
    return found


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_real_export_builds_matches_pytorch_and_fuses_its_attention(name):
    engine, feeds, want = build(name)
    ops = layer_ops(engine)
    with engine.create_execution_context() as context:
        got = context.execute(feeds)["output"]
    assert got.shape == want.shape
    error = float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))
    assert error <= 1e-4, f"{name}: relative error {error:.3g} against PyTorch"
    assert ops[ATTENTION] == MODELS[name] and not ops["Softmax"], f"{name}: attention not all fused: {dict(ops)}"
    attentions = [node for node in engine.graph.nodes if node.qualified_op == ATTENTION]
    for node in attentions:
        gemms = projection_gemms(engine.graph, node)
        assert len(gemms) == GEMMS_PER_BLOCK.get(name, 1), f"{name}: {node.name} reads projections {gemms}"
        packed = len(set(node.inputs[:3])) == 1 and bool(node.attrs.get("packed"))
        assert packed == (name in PACKED), f"{name}: {node.name} inputs {node.inputs[:3]}, {node.attrs}"
    assert not ops["Split"], f"{name}: a Split left: {dict(ops)}"


def test_gpt2s_reshaped_linears_fuse_their_gelu_and_residual_adds():
    """HF GPT-2 writes each Linear as Reshape -> Gemm -> Reshape: the Reshape after the Gemm
    moves below its Gelu (c_fc) and its residual Add (both c_proj), which fuse into the Gemm."""
    engine, _, _ = build("gpt2")
    kernels = collections.Counter(layer["op"] for layer in engine.inspect()["layers"] if layer["alias"] is None)
    blocks = MODELS["gpt2"]
    assert kernels["Gemm+Gelu"] == blocks and kernels["Gemm+Add"] == 2 * blocks, dict(kernels)
    # the c_attn Gemm stays alone (the attention reads it); one Add is the embeddings' sum
    assert kernels["Gemm"] == blocks and not kernels["Gelu"] and kernels["Add"] == 1, dict(kernels)
