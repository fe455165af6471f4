"""Fused attention benchmark (GPU only): plugrt-contrib-attention's MultiHeadAttention
against the unfused subgraph and PyTorch's scaled_dot_product_attention, float32 (or
float16: ``--fp16``).

At batch 8, 12 heads, 512 tokens, head size 64 (BERT-base attention), one ONNX model,
``softmax(Q K^T / sqrt(64)) V`` written as exporters write it (MatMul, Transpose, Div,
Softmax, MatMul; Q, K, V inputs ``[B, H, S, D]``), is built three ways:

- ``fused`` and ``fused_fp32``: the plugin's ``fuse_attention`` pass on; one
  MultiHeadAttention layer, its tactic chosen by the tuner among the TF32 tensor-core and
  SIMT kernels (TF32 allowed: plugrt's default, as TensorRT's) or among the SIMT ones;
- ``unfused_tf32`` and ``unfused_fp32``: the pass disabled (``--disable-pass
  contrib-attention:fuse_attention``): Transpose, MatMul (+ scale epilogue), Softmax,
  MatMul layers, TF32 allowed or not.

Each engine is timed over its enqueue (the kernels only; inputs already in its arena) with
CUDA events, median of ``repeats``, and its output checked against torch's fp32
``scaled_dot_product_attention`` (max |difference| / max |reference|: ``1e-4`` for fp32
math, ``5e-3`` where TF32 is allowed). torch SDPA itself is timed too, and every tactic of
the fused op is timed and checked on its own (what the tuner chose from).

``attention_benchmark()`` returns ``{"shape", "gflop", "fused", "fused_fp32",
"unfused_tf32", "unfused_fp32", "torch_sdpa", "tactics", "speedup_vs_unfused_tf32", ...}``
(times in ms; each engine entry names the tactic the tuner chose per layer) and prints a
short table.

``attention_benchmark(dtype="float16")`` (``--fp16``; ``--bert`` for BERT-base's batch 32,
128 tokens) builds the float32 model as an FP16 engine: ``fused_fp16`` (TF32 allowed),
``fused_fp16_no_tf32`` and ``unfused_fp16``, checked at ``1e-2`` of torch's fp32 result,
against torch SDPA on float16 tensors; the tactic sweep runs every tactic of the fused op
on float16 tensors (the FP16 tensor-core ones first).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN_SOURCE = os.path.join(os.path.dirname(HERE), "contrib_plugins", "attention")
FUSE_PASS = "contrib-attention:fuse_attention"
FP32_TOL = 1e-4
TF32_TOL = 5e-3
FP16_TOL = 1e-2


def attention_model(batch: int, heads: int, seq: int, head: int, mask: bool = False):
    """``softmax(Q K^T / sqrt(head) [+ mask]) V`` in ONNX ops; inputs q, k, v (and mask
    ``[B, 1, 1, S]``), output y."""
    from onnx import TensorProto, helper, numpy_helper

    shape = [batch, heads, seq, head]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name in "qkv"]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Div", ["scores", "root_d"], ["scaled"])]
    logits = "scaled"
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [batch, 1, 1, seq]))
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"]))
        logits = "masked"
    nodes += [helper.make_node("Softmax", [logits], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["y"])]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "attention", inputs, [output],
                              initializer=[numpy_helper.from_array(np.array(math.sqrt(head), np.float32), "root_d")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _registry():
    """The installed plugins; the attention plugin registered from the source tree when it
    is not installed (``pip install -e contrib_plugins/attention`` installs it)."""
    from plugrt.registry import default_registry

    registry = default_registry()
    if "contrib-attention" not in registry.plugins:
        sys.path.insert(0, PLUGIN_SOURCE)
        import plugrt_contrib_attention

        registry.register(plugrt_contrib_attention, name="contrib-attention",
                          distribution="plugrt-contrib-attention", version=plugrt_contrib_attention.__version__)
    return registry


def _events_ms(fn, stream, repeats: int, warmup: int) -> float:
    """Median milliseconds of ``fn()`` between CUDA events recorded on a Numba ``stream``."""
    from gemm_bench import _median_ms

    return _median_ms(fn, repeats, warmup, stream)


def _rel_err(got, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))


def _engine_result(model, registry, feeds: dict, want: np.ndarray, tolerance: float, repeats: int, warmup: int,
                   **config) -> dict:
    """Build one engine, check it and time its enqueue."""
    import time

    from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

    config = BuilderConfig(**config)
    profile = OptimizationProfile()
    for name, tensor in feeds.items():
        shape = tuple(tensor.shape)
        profile.set_shape(name, shape, shape, shape)
    config.add_optimization_profile(profile)
    started = time.perf_counter()
    engine = Builder(registry).build_engine(model, config)
    build_s = time.perf_counter() - started
    layers = engine.inspect()["layers"]
    context = engine.create_execution_context()
    outputs = context.execute_async(feeds)  # specializes, copies the inputs in, runs once
    context.stream.synchronize()
    got = outputs["y"]
    err = _rel_err(got.copy_to_host() if hasattr(got, "copy_to_host") else got, want)
    ms = _events_ms(lambda: context.enqueue(), context.stream, repeats, warmup)
    return {"ms": ms, "max_rel_err": err, "ok": err <= tolerance, "build_s": build_s, "layers": len(layers),
            "layer_ops": [layer["op"] for layer in layers],
            "tactics": [{"op": layer["op"], "tactic": layer["tactic"], "time_ms": layer.get("time_ms"),
                         "runner_up": layer.get("runner_up")} for layer in layers]}


def _tactic_sweep(registry, tensors: list, want: np.ndarray, repeats: int, warmup: int) -> list[dict]:
    """Every tactic of the fused op at this shape and the tensors' dtype, launched directly,
    checked and timed."""
    from numba import cuda

    from plugrt.launcher import PreparedLaunch
    from plugrt.ir.graph import Node
    from plugrt.plugin import TensorInfo

    op = registry.find_op("plugrt.contrib", "MultiHeadAttention", 1)
    names = ["q", "k", "v", "mask"][:len(tensors)]
    node = Node("bench", "MultiHeadAttention", "plugrt.contrib", tuple(names), ("y",), {"scale": None}, opset=1)
    dtype = np.dtype(str(tensors[0].dtype).replace("torch.", ""))
    ins = [TensorInfo(dtype, tuple(t.shape)) for t in tensors]
    outs = op.infer(node, ins)
    stream = cuda.stream()
    device_ins = [cuda.as_cuda_array(t) for t in tensors]
    out = cuda.device_array(outs[0].shape, dtype, stream=stream)
    rows = []
    for tactic in op.tactics(node, ins, outs):
        row = {"name": tactic.name, "params": dict(tactic.params)}
        try:
            workspace = cuda.device_array(tactic.workspace_bytes, np.uint8) if tactic.workspace_bytes else None
            launches = [PreparedLaunch(launch) for launch in tactic.launches(device_ins, [out], workspace)]

            def run(launches=launches):
                for launch in launches:
                    launch(stream)

            run()
            stream.synchronize()
            row["max_rel_err"] = _rel_err(out.copy_to_host(), want)
            row["math"] = tactic.math or dtype.name.replace("float", "fp")
            tolerance = FP16_TOL if dtype == np.float16 else TF32_TOL if tactic.math == "tf32" else FP32_TOL
            row["ok"] = row["max_rel_err"] <= tolerance
            row["ms"] = _events_ms(run, stream, repeats, warmup)
        except Exception as error:  # one broken tactic must not hide the others' numbers
            row.update(ok=False, error=f"{type(error).__name__}: {error}"[:500])
        rows.append(row)
    return rows


def attention_benchmark(batch: int = 8, heads: int = 12, seq: int = 512, head: int = 64, repeats: int = 20,
                        warmup: int = 3, mask: bool = False, dtype: str = "float32") -> dict:
    """Time and check the fused op, the unfused subgraph and torch SDPA; see the module doc."""
    import torch

    from gemm_bench import _torch_ms

    registry = _registry()
    shape = (batch, heads, seq, head)
    gflop = 4.0 * batch * heads * seq * seq * head / 1e9
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float32, generator=generator) for _ in range(3))
    attn_mask = None
    feeds = {"q": q, "k": k, "v": v}
    if mask:  # a key-padding mask: the last eighth of every sequence masked out
        attn_mask = torch.zeros((batch, 1, 1, seq), device="cuda", dtype=torch.float32)
        attn_mask[..., seq - seq // 8:] = torch.finfo(torch.float32).min
        feeds["mask"] = attn_mask
    half = dtype == "float16"
    if half:  # float16 inputs; torch's fp32 result on the same (rounded) values is the reference
        q, k, v = (x.half().float() for x in (q, k, v))
        feeds = {"q": q, "k": k, "v": v, **({"mask": attn_mask} if mask else {})}
    timed = [x.half() if half and x is not None else x for x in (q, k, v, attn_mask)]
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.no_grad():
            reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            torch.cuda.synchronize()
            sdpa = torch.nn.functional.scaled_dot_product_attention
            sdpa_ms = _torch_ms(lambda: sdpa(*timed[:3], attn_mask=timed[3]), repeats, warmup)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    want = reference.double().cpu().numpy()
    model = attention_model(batch, heads, seq, head, mask)

    result = {"shape": {"batch": batch, "heads": heads, "seq": seq, "head": head, "mask": mask, "dtype": dtype},
              "gflop": gflop, "torch_sdpa": {"ms": sdpa_ms, "tflops": gflop / sdpa_ms}}
    variants = (("fused", TF32_TOL, {}),
                ("fused_fp32", FP32_TOL, {"tf32": False}),
                ("unfused_tf32", TF32_TOL, {"disabled_passes": {FUSE_PASS}}),
                ("unfused_fp32", FP32_TOL, {"disabled_passes": {FUSE_PASS}, "tf32": False}))
    if half:
        variants = (("fused_fp16", FP16_TOL, {"fp16": True}),
                    ("fused_fp16_no_tf32", FP16_TOL, {"fp16": True, "tf32": False}),
                    ("unfused_fp16", FP16_TOL, {"fp16": True, "disabled_passes": {FUSE_PASS}}))
    for name, tolerance, config in variants:
        try:
            entry = _engine_result(model, registry, feeds, want, tolerance, repeats, warmup, progress=False, **config)
            entry["tflops"] = gflop / entry["ms"]
        except Exception as error:
            entry = {"ok": False, "error": f"{type(error).__name__}: {error}"[:800]}
        result[name] = entry
    fused_ops = result[variants[0][0]].get("layer_ops", [])
    result["fused_has_attention_layer"] = "plugrt.contrib::MultiHeadAttention" in fused_ops
    try:
        swept = [x.half() for x in feeds.values()] if half else list(feeds.values())
        result["tactics"] = _tactic_sweep(registry, swept, want, repeats, warmup)
    except Exception as error:
        result["tactics"] = [{"ok": False, "error": f"{type(error).__name__}: {error}"[:800]}]
    pairs = ((("fused_fp16", ("unfused_fp16", "torch_sdpa")),) if half else
             (("fused", ("unfused_tf32", "torch_sdpa")), ("fused_fp32", ("unfused_fp32", "torch_sdpa"))))
    for fused, others in pairs:
        for name in others:
            if "ms" in result[fused] and "ms" in result[name]:
                result[f"speedup_{fused}_vs_{name}"] = result[name]["ms"] / result[fused]["ms"]
    _print(result)
    return result


def _print(result: dict) -> None:
    s = result["shape"]
    print(f"attention B={s['batch']} H={s['heads']} S={s['seq']} D={s['head']} {s['dtype'].replace('float', 'fp')}"
          f"{' masked' if s['mask'] else ''} ({result['gflop']:.2f} GFLOP; median ms, CUDA events)")
    print(f"{'variant':28} {'ms':>9} {'TFLOP/s':>8} {'rel err':>9} {'layers':>6} ok")
    names = ("fused", "fused_fp32", "unfused_tf32", "unfused_fp32", "fused_fp16", "fused_fp16_no_tf32", "unfused_fp16")
    for name in (n for n in names if n in result):
        entry = result[name]
        if "ms" in entry:
            chosen = ", ".join(layer["tactic"] for layer in entry["tactics"]
                               if layer["op"].startswith("plugrt.contrib"))
            print(f"{name:28} {entry['ms']:9.3f} {entry['tflops']:8.2f} {entry['max_rel_err']:9.2e} "
                  f"{entry['layers']:6d} {entry['ok']} {chosen}")
        else:
            print(f"{name:28} failed: {entry.get('error')}")
    print(f"{'torch_sdpa':28} {result['torch_sdpa']['ms']:9.3f} {result['torch_sdpa']['tflops']:8.2f}")
    for row in result.get("tactics", []):
        if "ms" in row:
            print(f"  {row['name']:26} {row['ms']:9.3f} {result['gflop'] / row['ms']:8.2f} {row['max_rel_err']:9.2e}"
                  f" {row['math']:>6} {row['ok']}")
        else:
            print(f"  {row.get('name', 'tactics'):26} failed: {row.get('error')}")


if __name__ == "__main__":
    import json

    shape = dict(batch=32, seq=128) if "--bert" in sys.argv else {}
    result = attention_benchmark(mask="--mask" in sys.argv, dtype="float16" if "--fp16" in sys.argv else "float32",
                                 **shape)
    print(json.dumps(result, indent=1, default=str))
