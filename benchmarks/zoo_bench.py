"""The model zoo check (issue 17): every torchvision classification architecture family
and the common Hugging Face encoder and decoder families, exported from PyTorch at
realistic sizes (random weights, ``torch.onnx.export`` opset 17, ``dynamo=False``), built
by plugrt in FP32 (``--no-tf32``: the match asked is an FP32 one) and run against
PyTorch's own FP32 output on the same inputs (TF32 off there too).

Per model it records the engine's layers, the relative error ``max|plugrt - torch| /
max|torch|`` (must be <= 1e-4; a model whose own initialization makes its output ignore
its input, as ViT's zeroed head does, gets fresh weights first: see :func:`lively`), plugrt's latency
(CUDA graph replay, preallocated outputs) and PyTorch eager's (FP32), both median wall time
per call with a synchronize, batch 1.

Exports run in this process, one after another, on the GPU; each finished export is built
at once in a ``plugrt build`` subprocess, several at a time (the build's kernel compilation
is CPU work: the GPU machine has 16 cores), all sharing one kernel cache. A time budget
keeps the whole run under the device's per-call limit: what it cannot reach is listed as
not run, never silently dropped.

    python3 benchmarks/zoo_bench.py --out DIR [--models a,b] [--budget 480] [--jobs 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runtime_bench import _median_ms  # noqa: E402 - the benchmarks' one timing loop

SEQ = 128
LEVEL = "1"  # time the first two tactics of each layer: a fair engine at a zoo-sized build time

#: torchvision: one architecture per family (the family's common size), image side.
VISION = {
    "alexnet": 224, "vgg11_bn": 224, "resnet50": 224, "resnext50_32x4d": 224, "wide_resnet50_2": 224,
    "densenet121": 224, "squeezenet1_1": 224, "googlenet": 224, "inception_v3": 299, "mobilenet_v2": 224,
    "mobilenet_v3_large": 224, "mnasnet1_0": 224, "shufflenet_v2_x1_0": 224, "efficientnet_b0": 224,
    "efficientnet_v2_s": 384, "regnet_y_800mf": 224, "convnext_tiny": 224, "vit_b_16": 224, "swin_t": 224,
    "swin_v2_t": 256, "maxvit_t": 224,
}

#: Hugging Face: family -> (model class, config keywords, with attention_mask, decoder).
TEXT = {
    "bert": ("BertModel", {}, True, False),
    "roberta": ("RobertaModel", {}, True, False),
    "distilbert": ("DistilBertModel", {}, True, False),
    "albert": ("AlbertModel", {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
               True, False),  # albert-base
    "electra": ("ElectraModel", {}, True, False),
    "t5_encoder": ("T5EncoderModel", {}, True, False),  # t5-small
    "gpt2": ("GPT2Model", {"use_cache": False}, True, True),
    "opt": ("OPTModel", {"use_cache": False}, True, True),  # opt-125m
    # TinyLlama's and Qwen2-0.5B's layer geometry, 4 layers (their full depth only repeats them)
    "llama": ("LlamaModel", {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 4,
                             "num_attention_heads": 32, "num_key_value_heads": 4, "use_cache": False}, True, True),
    "qwen2": ("Qwen2Model", {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 4,
                             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 32000,
                             "use_cache": False}, True, True),
}


def make_vision(name: str, side: int):
    import torch
    import torchvision

    torch.backends.mha.set_fastpath_enabled(False)
    model = getattr(torchvision.models, name)(weights=None).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, side, side), dtype=np.float32)
    return model, {"input": x}


def lively(model, tensors) -> bool:
    """Give ``model`` weights under which its output depends on its input, if its own
    initialization makes it (near) constant (ViT's zeroed head; GoogLeNet's 0.01-std
    convolutions shrink the signal to nothing, leaving the classifier's bias): a match
    against an output that ignores the input proves nothing. Float inputs are changed
    (images); token ids are shifted. Returns whether it re-initialized."""
    import torch

    other = tuple(torch.randn_like(t) if t.is_floating_point() else
                  (t + 1) % (int(t.max()) + 1) if t.max() > 1 else t for t in tensors)  # ids shift; masks stay

    def ignores_input() -> bool:
        with torch.no_grad():
            a, b = model(*tensors).float(), model(*other).float()
        return float((a - b).abs().max()) <= 1e-3 * max(float(a.abs().max()), 1e-30)

    if not ignores_input():
        return False
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    torch.nn.init.normal_(module.bias, std=0.1)
    if ignores_input():
        raise RuntimeError("the output ignores the input even after re-initializing the weights")
    return True


def make_text(name: str):
    import torch
    import transformers

    cls, overrides, with_mask, decoder = TEXT[name]
    config = getattr(transformers, cls).config_class(**overrides)
    if decoder:
        config._attn_implementation = "eager"  # transformers 5's sdpa mask code exports aten::diff

    class Wrapped(torch.nn.Module):  # tensors in, last_hidden_state out
        def __init__(self):
            super().__init__()
            self.model = getattr(transformers, cls)(config)

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab_size, (1, SEQ)).astype(np.int64)
    mask = np.ones((1, SEQ), np.int64)
    if with_mask:
        mask[0, SEQ - 16:] = 0  # padding at the end, as a batch's shorter sequence has
    return Wrapped().eval(), {"input_ids": ids, "attention_mask": mask}


def export(name: str, work: str) -> dict:
    """Export one model; its PyTorch FP32 output and eager latency on the GPU."""
    import torch

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, feeds = make_vision(name, VISION[name]) if name in VISION else make_text(name)
    path = os.path.join(work, f"{name}.onnx")
    names = list(feeds)
    tensors = tuple(torch.from_numpy(v) for v in feeds.values())
    reinitialized = lively(model, tensors)
    dynamic = {n: ({0: "batch"} if n == "input" else {0: "batch", 1: "sequence"}) for n in names}
    with torch.no_grad():
        torch.onnx.export(model, tensors, path, input_names=names, output_names=["output"], opset_version=17,
                          dynamo=False, dynamic_axes={**dynamic, "output": {0: "batch"}})
        net = model.cuda()
        on_gpu = tuple(t.cuda() for t in tensors)
        want = net(*on_gpu).float().cpu().numpy()
        eager_ms = _median_ms(lambda: net(*on_gpu), torch.cuda.synchronize, repeats=30, warmup=3)
    model.cpu()
    del net
    torch.cuda.empty_cache()
    return {"onnx": path, "feeds": feeds, "want": want, "torch_eager_ms": eager_ms,
            "onnx_mb": round(os.path.getsize(path) / 2**20, 1), "reinitialized": reinitialized,
            "output_std": float(want.std())}


def build(name: str, entry: dict, work: str, cache: str) -> dict:
    shapes = ",".join(f"{k}:{'x'.join(str(d) for d in v.shape)}" for k, v in entry["feeds"].items())
    plan = os.path.join(work, f"{name}.plan")
    command = [sys.executable, "-m", "plugrt", "build", entry["onnx"], "-o", plan, "--no-progress", "--force",
               "--no-tf32", "--optimization-level", LEVEL, "--min-shapes", shapes, "--opt-shapes", shapes,
               "--max-shapes", shapes]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PLUGRT_KERNEL_CACHE=cache))
    report = {"build_s": round(time.perf_counter() - started, 1)}
    if done.returncode:
        report["error"] = "build failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:400]
        report["stderr"] = done.stderr[-3000:]
    else:
        report["plan"] = plan
    return report


def measure(entry: dict) -> dict:
    """Run the plan: relative error against PyTorch, layers, graph-replay latency."""
    from numba import cuda
    from plugrt.engine import Engine

    engine = Engine.load(entry["plan"])
    with engine.create_execution_context() as ctx:
        first = ctx.execute(entry["feeds"])
        got = first[engine.output_names[0]]
        want = entry["want"]
        if got.shape != want.shape:
            return {"error": f"output shape {got.shape} against PyTorch's {want.shape}"}
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        error = float(np.max(diff) / max(float(np.max(np.abs(want))), 1e-30))
        feeds = {k: cuda.to_device(v) for k, v in entry["feeds"].items()}
        outs = {k: cuda.device_array(v.shape, v.dtype) for k, v in first.items()}
        ms = _median_ms(lambda: ctx.execute_async(feeds, outputs=outs), ctx.stream.synchronize, repeats=30, warmup=3)
    kernels = sum(1 for layer in engine.inspect()["layers"] if layer.get("alias") is None)
    return {"layers": len(engine.layers), "kernel_layers": kernels, "rel_err": error, "plugrt_ms": ms,
            "ok": bool(np.isfinite(error) and error <= 1e-4)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--models", default="")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    parser.add_argument("--jobs", type=int, default=8, help="builds at a time")
    args = parser.parse_args()
    began = time.perf_counter()
    names = args.models.split(",") if args.models else [*VISION, *TEXT]
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="plugrt-zoo-")
    cache = os.environ.get("PLUGRT_BENCH_KERNEL_CACHE") or os.path.join(work, "kernel-cache")  # (gpu_run.sh: one shared, kept)
    report: dict = {name: {"status": "not run"} for name in names}
    entries: dict = {}

    def save():
        with open(os.path.join(args.out, "zoo_bench.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    builds = {}
    for name in names:
        if time.perf_counter() - began > args.budget * 0.75:
            break  # leave time for the builds and runs of what was exported
        try:
            started = time.perf_counter()
            entries[name] = export(name, work)
            report[name] = {"status": "exported", "export_s": round(time.perf_counter() - started, 1),
                            **{k: entries[name][k] for k in ("onnx_mb", "torch_eager_ms", "reinitialized",
                                                              "output_std")}}
            builds[name] = pool.submit(build, name, entries[name], work, cache)
        except Exception:  # noqa: BLE001 - one model's export failure must not stop the zoo
            report[name] = {"status": "export failed", "error": traceback.format_exc()[-1500:]}
        print(f"[{time.perf_counter() - began:6.1f} s] {name}: {report[name]['status']}", flush=True)
        save()
    for name, future in builds.items():
        remaining = args.budget - (time.perf_counter() - began)
        try:
            result = future.result(timeout=max(remaining, 1.0))
        except concurrent.futures.TimeoutError:
            report[name]["status"] = "build not finished in the budget"
            continue
        report[name].update(result)
        if "error" in result:
            report[name]["status"] = "build failed"
            print(f"{name}: {result['error']}\n{result['stderr'][-1200:]}", flush=True)
            continue
        entries[name]["plan"] = result["plan"]
        try:
            report[name].update(measure(entries[name]))
            report[name]["status"] = "ok" if report[name].get("ok") else "mismatch"
        except Exception:  # noqa: BLE001
            report[name]["status"] = "run failed"
            report[name]["error"] = traceback.format_exc()[-1500:]
            print(f"{name}: run failed\n{report[name]['error']}", flush=True)
        save()
    pool.shutdown(wait=False, cancel_futures=True)
    save()
    print(f"\n== model zoo (H200, FP32 without TF32, batch 1, seq {SEQ}; level-{LEVEL} builds) ==")
    print(f"{'model':22s} {'status':10s} {'layers':>6s} {'kernels':>7s} {'rel err':>9s} {'plugrt ms':>9s} "
          f"{'torch ms':>9s} {'ratio':>6s} {'build s':>7s}")
    for name in names:
        r = report[name]
        if "plugrt_ms" in r:
            label = name + (" *" if r.get("reinitialized") else "")
            print(f"{label:22s} {r['status']:10s} {r['layers']:6d} {r['kernel_layers']:7d} {r['rel_err']:9.2e} "
                  f"{r['plugrt_ms']:9.3f} {r['torch_eager_ms']:9.3f} {r['plugrt_ms'] / r['torch_eager_ms']:6.2f} "
                  f"{r['build_s']:7.1f}")
        else:
            print(f"{name:22s} {r['status']}: {str(r.get('error', ''))[-300:]}")
    failed = [n for n in names if report[n]["status"] != "ok"]
    print("* re-initialized: under its own initialization the output ignored the input (see lively())")
    print(f"{len(names) - len(failed)} of {len(names)} ok" + (f"; not ok: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
