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
import onnxruntime
import pytest

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

EXPORTS = pathlib.Path(__file__).resolve().parent / "data" / "exports"
ATTENTION = "plugrt.contrib::MultiHeadAttention"

#: name -> attention blocks the export has (every one fused).
MODELS = {"bert": 2, "bert_mask": 2, "gpt2": 2, "llama": 2, "t5_encoder": 2, "swin": 4, "vit": 2}
#: Exports whose attention reads Q, K and V in place from one projection GEMM (contrib-attention's
#: pack_projections: BERT's and T5's three MatMuls packed, GPT-2's Split of c_attn read through).
#: ViT's torchvision in_proj, sequence-first and sliced by layout ops, is read batch-first in place
#: (read_seq_first); Swin's qkv, reshaped to [B, N, 3, H, D], permuted and unbound as in timm's
#: ViT, is read in place too (pack_projections). LLaMA has three, with the rotary embedding
#: between them and the attention.
PACKED = {"bert", "bert_mask", "gpt2", "swin", "t5_encoder", "vit"}
#: Exports whose attention blocks keep no layout kernel: between each block's LayerNorm and
#: its attention only the projection GEMM(s), right after it the output projection's GEMM
#: (ViT: torch.nn.MultiheadAttention's sequence-first form, contrib-attention's read_seq_first;
#: LLaMA: its rotary embeddings run on [B, S, H, D], the head swaps moved below them and taken in).
NO_LAYOUT_KERNELS = {"bert", "bert_mask", "gpt2", "llama", "vit"}
#: Projection GEMMs per attention block.
GEMMS_PER_BLOCK = {"llama": 3}
GEMMS = {"MatMul", "Gemm", "plugrt.matmul::FusedMatMul"}
NORMS = {"LayerNormalization", "RMSNormalization"}
ROTARY = "plugrt.elementwise::RotaryEmbedding"


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


def assert_no_layout_kernels_around_attention(name: str, engine) -> None:
    """The kernels on the way from each attention's LayerNorm (LLaMA: RMSNorm) to its Q, K
    and V are GEMMs (LLaMA: and the RotaryEmbedding on Q and K, followed back through X),
    and the first kernel reading its output is one (the output projection, maybe with the
    residual Add in its epilogue). Alias layers (free Reshapes) are passed over."""
    graph = engine.graph
    kernels = {layer.node_index for layer in engine.layers if layer.alias is None}
    index = {id(node): at for at, node in enumerate(graph.nodes)}
    producers, readers = graph.producers(), graph.consumers()
    for attention in (node for node in graph.nodes if node.qualified_op == ATTENTION):
        pending, seen = [producers.get(value) for value in attention.inputs[:3]], set()
        while pending:
            node = pending.pop()
            if node is None or id(node) in seen or node.op_type in NORMS:
                continue
            seen.add(id(node))
            if node.qualified_op == ROTARY:
                pending.append(producers.get(node.inputs[0]))  # cos and sin: the model's one table, made once
            elif index[id(node)] in kernels:
                assert is_gemm(node), f"{name}: {node.qualified_op} kernel {node.name} before {attention.name}"
                pending.append(producers.get(node.inputs[0]))  # the GEMM's input; its weights are constants
            else:
                pending += [producers.get(value) for value in node.inputs if value in producers]
        node = attention
        while True:
            value = node.outputs[0]  # followed as data (input 0), not as a Shape's or Reshape target's
            node = next((r for r in readers.get(value, ()) if r.op_type != "Shape" and r.inputs[0] == value), None)
            if node is None or index[id(node)] in kernels:
                break
        assert node is not None and is_gemm(node), f"{name}: after {attention.name}: {node and node.qualified_op}"


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
    if name in NO_LAYOUT_KERNELS:
        assert_no_layout_kernels_around_attention(name, engine)


def test_gpt2s_reshaped_linears_fuse_their_gelu_and_residual_adds():
    """HF GPT-2 writes each Linear as Reshape -> Gemm -> Reshape: the Reshape after the Gemm
    moves below its Gelu (c_fc) and its residual Add (both c_proj), which fuse into the Gemm."""
    engine, _, _ = build("gpt2")
    kernels = collections.Counter(layer["op"] for layer in engine.inspect()["layers"] if layer["alias"] is None)
    blocks = MODELS["gpt2"]
    assert kernels["Gemm+Gelu"] == blocks and kernels["Gemm+Add"] == 2 * blocks, dict(kernels)
    # the c_attn Gemm stays alone (the attention reads it); one Add is the embeddings' sum
    assert kernels["Gemm"] == blocks and not kernels["Gelu"] and kernels["Add"] == 1, dict(kernels)


@pytest.mark.parametrize("name", ["gpt2", "llama", "vit"])
def test_a_real_export_at_a_dynamic_batch_matches_onnxruntime(name):
    """Built for batches 1..4 (the exports' batch axis is dynamic), run at batch 3: the
    passes that rely on the profile's sample shapes (the pinned softmax scale, the reshapes
    sunk below pointwise nodes, the sequence-first projections read batch-first) hold at a
    batch none of them saw. The expected output is onnxruntime's on fresh inputs."""
    data = np.load(EXPORTS / f"{name}.npz")
    feeds = {key[3:]: data[key] for key in data.files if key.startswith("in:")}
    config = BuilderConfig(progress=False, tf32=False)
    profile = OptimizationProfile()
    for key, value in feeds.items():
        profile.set_shape(key, (1, *value.shape[1:]), value.shape, (4, *value.shape[1:]))
    config.add_optimization_profile(profile)
    model = onnx.load(EXPORTS / f"{name}.onnx")
    engine = Builder().build_engine(model, config)
    rng = np.random.default_rng()
    given = {}
    for key, value in feeds.items():
        shape = (3, *value.shape[1:])
        if value.dtype.kind == "f":
            given[key] = rng.standard_normal(shape).astype(value.dtype)
        elif key == "attention_mask":
            given[key] = np.ones(shape, value.dtype)
            given[key][-1, -3:] = 0  # the last sequence padded
        else:
            given[key] = rng.integers(0, int(value.max()) + 1, shape).astype(value.dtype)
    with engine.create_execution_context() as context:
        got = context.execute(given)["output"]
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, given)[0]
    error = float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))
    assert error <= 1e-4, f"{name} at batch 3: relative error {error:.3g} against onnxruntime"
