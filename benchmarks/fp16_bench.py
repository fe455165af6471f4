"""FP16 engines on real models, on a GPU (issue 16's model figures), in one run:

ResNet-50 (torchvision) and BERT-base (HF ``BertModel``, seq 128), exported from PyTorch
in FP32 with random weights, built by ``plugrt build --fp16`` for batch 1 and 32 (static
shapes, so tactics and precisions are timed at the batch run), and by the default build
(FP32 with TF32 tactics) at batch 32. For each: the build's own precision and accuracy
lines, plugrt's latency (a CUDA graph replay with preallocated outputs, median wall time
with a synchronize), the relative error of its output against PyTorch's FP32 model on the
same input, and beside it in the same run ``torch.compile(mode="reduce-overhead")`` in
FP16 (``model.half()``, channels-last for ResNet-50) and in TF32.

    python3 benchmarks/fp16_bench.py --out DIR [--models resnet50,bert] [--batches 1,32]

With ``PLUGRT_BENCH_TIMING_DIR=DIR`` each build also writes its timing cache there
(``NAME.plan.timing.json``): every tactic the tuner timed for every layer, with its time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runtime_bench import _median_ms, export_models, feeds_for


#: An image model's FP16 engine takes what torch.compile's FP16 run is given: a float16
#: channels-last batch (its conversion is not timed there either): --fp16-io --io-format.
CHANNELS_LAST_IO = ["--fp16-io", "--io-format", "input:channels_last"]


def channels_last_io(model: dict, fp16: bool) -> bool:
    return fp16 and model["input"] == "input"


def build(model: dict, plan: str, cache: str, batch: int, fp16: bool, level: str) -> dict:
    dims = model["shape"].split("x")
    if channels_last_io(model, fp16):
        dims = dims[1:] + dims[:1]
    shape = f"{model['input']}:{batch}x{'x'.join(dims)}"
    command = [sys.executable, "-m", "plugrt", "build", model["onnx"], "-o", plan, "--no-progress", "--force",
               "--optimization-level", level, "--min-shapes", shape, "--opt-shapes", shape, "--max-shapes", shape]
    if fp16:
        command.append("--fp16")
    if os.environ.get("PLUGRT_BENCH_TIMING_DIR"):  # each tactic's time, for a look at what the tuner chose from
        command += ["--timing-cache", os.path.join(os.environ["PLUGRT_BENCH_TIMING_DIR"],
                                                   f"{os.path.basename(plan)}.timing.json")]
    if channels_last_io(model, fp16):
        command += CHANNELS_LAST_IO
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PLUGRT_KERNEL_CACHE=cache))
    if done.returncode:
        raise RuntimeError(f"build failed:\n{done.stderr[-3000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith(("precision", "accuracy", "kernels", "  "))]
    return {"seconds": round(time.perf_counter() - started, 1), "lines": lines,
            "warnings": [line for line in done.stderr.splitlines() if "WARN" in line.upper()][:8]}


def plugrt_run(plan: str, model: dict, batch: int, profile: bool = False) -> tuple[float, np.ndarray, dict | None]:
    """Graph-replay latency, the output, and (``profile``) the per-layer profile summed
    by op with the slowest layers (``plugrt bench --dump-profile``'s)."""
    from numba import cuda
    from plugrt.engine import Engine

    engine = Engine.load(plan)
    x = feeds_for(model, batch)
    binding = engine.graph.info(model["input"])
    if x.ndim == 4 and tuple(binding.shape[1:]) == x.shape[2:] + x.shape[1:2]:  # a channels-last binding (CHANNELS_LAST_IO)
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    x = x.astype(binding.dtype)
    with engine.create_execution_context() as ctx:
        first = ctx.execute({model["input"]: x})
        feed = cuda.to_device(x)
        outs = {name: cuda.device_array(v.shape, v.dtype) for name, v in first.items()}
        ms = _median_ms(lambda: ctx.execute_async({model["input"]: feed}, outputs=outs), ctx.stream.synchronize)
    summary = None
    if profile:
        from plugrt.layer_profile import profile_json, profile_layers

        layers = profile_json(profile_layers(engine, {model["input"]: x}))["layers"]
        by_op: dict = {}
        for row in layers:
            by_op[row["op"]] = by_op.get(row["op"], 0.0) + row["median_ms"]
        summary = {"total_ms": sum(row["median_ms"] for row in layers),
                   "by_op_ms": dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:12]),
                   "slowest": [{k: row[k] for k in ("name", "op", "tactic", "median_ms", "blocks")}
                               for row in sorted(layers, key=lambda row: -row["median_ms"])[:12]],
                   "layers": [{k: row.get(k) for k in ("name", "op", "tactic", "median_ms", "blocks")} for row in layers]}
    return ms, first[model["output"]].astype(np.float32), summary


def record_run(entry: dict, label: str, plan: str, model: dict, batch: int, reference: np.ndarray,
               profile: bool) -> None:
    """``entry[label_ms]``, ``[label_rel_err_vs_torch_fp32]`` (against ``reference``) and,
    with ``profile``, ``[label_profile]`` of the plan run at ``batch`` (:func:`plugrt_run`)."""
    ms, output, layers = plugrt_run(plan, model, batch, profile)
    entry[f"{label}_ms"] = ms
    if layers is not None:
        entry[f"{label}_profile"] = layers
    entry[f"{label}_rel_err_vs_torch_fp32"] = relative_error(output, reference)


def torch_kernels(fn, iterations: int = 5) -> dict:
    """torch.profiler's CUDA kernels of one call of ``fn``: the total, the time per kernel
    name (summed), and the kernels in launch order (name, us) - what plugrt's per-layer
    profile is set beside. ``fn`` must not replay a CUDA graph (the kernels inside one are
    not always traced): the caller hands torch.compile's default mode."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
    kernels = [(e.name, float(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)))
               for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    per_call = kernels[: len(kernels) // iterations]
    by_name: dict = {}
    for name, us in per_call:
        by_name[name] = by_name.get(name, 0.0) + us
    return {"total_ms": sum(us for _, us in per_call) / 1e3, "kernels": len(per_call),
            "by_name_us": dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:25]),
            "in_order": [[name[:90], round(us, 2)] for name, us in per_call]}


def torch_runs(model: dict, batch: int, profile: bool = False) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    x = torch.from_numpy(feeds_for(model, batch)).cuda()
    report = {}
    net = model["torch"].cuda().float()
    with torch.no_grad():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        report["fp32_output"] = net(x).float().cpu().numpy()
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        compiled = torch.compile(net, mode="reduce-overhead")
        report["compile_tf32_ms"] = _median_ms(lambda: compiled(x), torch.cuda.synchronize)
        torch._dynamo.reset()  # the half model is another module: nothing of the FP32 compile may serve it
        half = copy.deepcopy(model["torch"]).cuda().half()
        xh = x.half() if x.is_floating_point() else x
        if model["input"] == "input":
            half = half.to(memory_format=torch.channels_last)
            xh = xh.to(memory_format=torch.channels_last)
        compiled_half = torch.compile(half, mode="reduce-overhead")
        report["compile_fp16_ms"] = _median_ms(lambda: compiled_half(xh), torch.cuda.synchronize)
        report["eager_fp16_ms"] = _median_ms(lambda: half(xh), torch.cuda.synchronize)
        if profile:  # the same compiled kernels, launched without the CUDA graph
            try:
                torch._dynamo.reset()
                plain = torch.compile(half)
                report["compile_fp16_kernels"] = torch_kernels(lambda: plain(xh))
            except Exception as exc:  # a diagnosis only: never the figures
                report["compile_fp16_kernels"] = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
        torch._dynamo.reset()
    model["torch"].cpu()
    return report


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    return float(np.max(np.abs(got - expected)) / max(np.max(np.abs(expected)), 1e-30))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--optimization-level", default="3")
    parser.add_argument("--profile", action="store_true", help="also record each plan's per-layer profile")
    parser.add_argument("--no-tf32", action="store_true", help="FP16 builds only")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="plugrt-fp16-")
    cache = os.environ.get("PLUGRT_BENCH_KERNEL_CACHE") or os.path.join(work, "kernel-cache")  # (gpu_run.sh: one shared, kept)
    models = export_models(work, args.models.split(","))
    batches = [int(b) for b in args.batches.split(",")]
    report: dict = {}

    def save():
        with open(os.path.join(args.out, "fp16_bench.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)

    for name, model in models.items():
        for batch in batches:
            entry = report.setdefault(f"{name}_b{batch}", {})
            torch_report = torch_runs(model, batch, args.profile)
            reference = torch_report.pop("fp32_output")
            entry.update(torch_report)
            variants = [("fp16", True)] + ([("tf32", False)] if batch == max(batches) and not args.no_tf32 else [])
            for label, fp16 in variants:
                plan = os.path.join(work, f"{name}_b{batch}_{label}.plan")
                entry[f"{label}_build"] = build(model, plan, cache, batch, fp16, args.optimization_level)
                record_run(entry, label, plan, model, batch, reference, args.profile)
                save()
    save()
    print("\n== fp16 ==")
    print(f"{'model':14s} {'plugrt fp16':>11s} {'rel err':>8s} {'compile fp16':>12s} {'ratio':>6s} "
          f"{'plugrt tf32':>11s} {'compile tf32':>12s} {'ratio':>6s}")
    for key, entry in report.items():
        fp16, c16 = entry.get("fp16_ms", float("nan")), entry.get("compile_fp16_ms", float("nan"))
        tf32, c32 = entry.get("tf32_ms", float("nan")), entry.get("compile_tf32_ms", float("nan"))
        print(f"{key:14s} {fp16:11.3f} {entry.get('fp16_rel_err_vs_torch_fp32', float('nan')):8.1e} {c16:12.3f} "
              f"{fp16 / c16:6.2f} {tf32:11.3f} {c32:12.3f} {tf32 / c32:6.2f}")
        for label in ("fp16", "tf32"):
            if f"{label}_build" in entry:
                b = entry[f"{label}_build"]
                print(f"   {label} build {b['seconds']} s: " + " | ".join(b["lines"])[:400])
            if f"{label}_profile" in entry:
                p = entry[f"{label}_profile"]
                print(f"   {label} layers {p['total_ms']:.3f} ms: " + ", ".join(f"{op} {t:.3f}" for op, t in p["by_op_ms"].items()))
                for row in p["slowest"][:8]:
                    print(f"      {row['median_ms']:.4f} ms {row['name'][:40]} {row['op'][:40]} {row['tactic']}")
        kernels = entry.get("compile_fp16_kernels")
        if kernels and "total_ms" in kernels:
            print(f"   torch.compile fp16 kernels {kernels['total_ms']:.3f} ms in {kernels['kernels']}: "
                  + ", ".join(f"{n[:40]} {us:.0f}us" for n, us in list(kernels["by_name_us"].items())[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
