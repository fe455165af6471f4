"""Mixed engines: one ONNX model with built-in ops and both contrib ops (the signal
package's STFTMagnitude, the attention package's MultiHeadAttention) builds, saves a plan
that records both contrib distributions, and loads and runs in a fresh process.

signal [B, N] -> STFTMagnitude -> log(1 + |X|) -> Q, K, V projections (MatMul, Add, Relu)
-> Reshape/Transpose to [B, H, S, D] -> MultiHeadAttention -> Transpose/Reshape -> MatMul
-> Add -> Sigmoid. Checked against a NumPy computation written here, independent of every
plugin's reference, and against the ReferenceExecutor.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, Engine
from plugrt.engine.plan_file import read_plan
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry

SIGNAL_DIST = "plugrt-contrib-signal"
SIGNAL_DOMAIN = "plugrt.signal"
ATTENTION_OP = "MultiHeadAttention"

B, N = 2, 28
FRAME, HOP = 8, 4
S, BINS = 1 + (N - FRAME) // HOP, FRAME // 2 + 1  # 6 frames of 5 bins
H, D = 2, 4
OUT = 3


def contrib_ops():
    """``(signal op, attention op)`` from the installed plugins; skip naming what is missing."""
    registry = default_registry()
    stft = registry.find_op(SIGNAL_DOMAIN, "STFTMagnitude", 1)
    if stft is None:
        pytest.skip(f"{SIGNAL_DIST} is not installed: python3 -m pip install --no-build-isolation --no-deps "
                    "-e contrib_plugins/signal")
    attention = [op for op in registry.ops() if op.op_type == ATTENTION_OP and op.domain]
    if not attention:
        pytest.skip("the contrib attention plugin (contrib_plugins/attention, op MultiHeadAttention) is not "
                    "installed: python3 -m pip install --no-build-isolation --no-deps -e contrib_plugins/attention")
    return stft, attention[0]


def weights(rng):
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return {"wq": w(BINS, H * D), "bq": w(H * D), "wk": w(BINS, H * D), "wv": w(BINS, H * D),
            "wo": w(H * D, OUT), "bo": w(OUT), "one": np.ones(1, np.float32),
            "heads": np.array([B, S, H, D], np.int64), "merged": np.array([B, S, H * D], np.int64)}


def mixed_model(attention_domain: str, params: dict):
    def node(op, ins, outs, **attrs):
        return helper.make_node(op, ins, outs, name=outs[0], **attrs)

    nodes = [
        node("STFTMagnitude", ["signal"], ["spec"], domain=SIGNAL_DOMAIN, frame_length=FRAME, hop_length=HOP,
             window="hann"),
        node("Add", ["spec", "one"], ["spec1"]),
        node("Log", ["spec1"], ["logspec"]),
        node("MatMul", ["logspec", "wq"], ["q0"]),
        node("Add", ["q0", "bq"], ["q1"]),
        node("Relu", ["q1"], ["q2"]),
        node("MatMul", ["logspec", "wk"], ["k0"]),
        node("MatMul", ["logspec", "wv"], ["v0"]),
    ]
    for name in ("q2", "k0", "v0"):
        nodes.append(node("Reshape", [name, "heads"], [name + "_bshd"]))
        nodes.append(node("Transpose", [name + "_bshd"], [name + "_bhsd"], perm=[0, 2, 1, 3]))
    nodes += [
        node(ATTENTION_OP, ["q2_bhsd", "k0_bhsd", "v0_bhsd"], ["ctx"], domain=attention_domain),
        node("Transpose", ["ctx"], ["ctx_bshd"], perm=[0, 2, 1, 3]),
        node("Reshape", ["ctx_bshd", "merged"], ["ctx_flat"]),
        node("MatMul", ["ctx_flat", "wo"], ["o0"]),
        node("Add", ["o0", "bo"], ["o1"]),
        node("Sigmoid", ["o1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "mixed_contrib", [helper.make_tensor_value_info("signal", TensorProto.FLOAT, [B, N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(value, name) for name, value in params.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(SIGNAL_DOMAIN, 1), helper.make_opsetid(attention_domain, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def numpy_forward(x, p):
    """The model in float64 NumPy: periodic Hann STFT, projections, softmax(QK^T/sqrt(D))V."""
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FRAME) / FRAME)
    frames = np.stack([x[:, t * HOP:t * HOP + FRAME] for t in range(S)], axis=1).astype(np.float64) * window
    logspec = np.log(np.abs(np.fft.rfft(frames, axis=-1)) + 1.0)

    def heads(t):
        return t.reshape(B, S, H, D).transpose(0, 2, 1, 3)

    q = heads(np.maximum(logspec @ p["wq"] + p["bq"], 0.0))
    k, v = heads(logspec @ p["wk"]), heads(logspec @ p["wv"])
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    ctx = (scores / scores.sum(axis=-1, keepdims=True)) @ v
    out = ctx.transpose(0, 2, 1, 3).reshape(B, S, H * D) @ p["wo"] + p["bo"]
    return 1.0 / (1.0 + np.exp(-out))


def test_mixed_model_builds_saves_and_runs_in_a_fresh_process(tmp_path):
    stft, attention = contrib_ops()
    rng = np.random.default_rng(6)
    params = weights(rng)
    model = mixed_model(attention.domain, params)
    x = rng.standard_normal((B, N)).astype(np.float32)
    want = numpy_forward(x, params)

    registry = default_registry()
    engine = Builder(registry).build_engine(model, BuilderConfig(tf32=False))  # fp32 math: compared at fp32 tolerance
    plan = tmp_path / "mixed.plan"
    engine.save(str(plan))

    header, _ = read_plan(str(plan))
    recorded = {layer["distribution"]: layer["distribution_version"] for layer in header["layers"]}
    for op in (stft, attention):
        owner = registry.owner(op)
        assert owner.distribution and owner.distribution != "plugrt", f"{op!r} should come from a contrib package"
        assert recorded.get(owner.distribution) == metadata.version(owner.distribution), (
            f"the plan should record {owner.distribution} {metadata.version(owner.distribution)}; it records {recorded}")
    assert "plugrt" in recorded  # the built-in ops' layers
    needs = {entry["distribution"]: entry for entry in Engine.load(str(plan), registry).plugins()}
    for op in (stft, attention):
        entry = needs[registry.owner(op).distribution]
        assert entry["ops"] == {f"{op.domain}::{op.op_type}": op.version}, entry

    np.savez(tmp_path / "inputs.npz", signal=x)
    result = subprocess.run([sys.executable, "-m", "plugrt", "run", str(plan), "--inputs",
                             str(tmp_path / "inputs.npz"), "--save", str(tmp_path / "outputs.npz")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "outputs.npz", allow_pickle=False) as saved:
        got = saved["y"]
    assert got.shape == (B, S, OUT) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    reference = ReferenceExecutor(engine.graph, registry).run({"signal": x})["y"]
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-5)
