"""INT8 engines on a GPU (issue 18's model figures), in one run:

- the digits CNN (:mod:`plugrt.testing.digits`: trained on scikit-learn's digits in NumPy)
  built INT8 with each calibrator: held-out accuracy of the engine itself (all 497 images)
  against FP32;
- ResNet-50 (torchvision) and BERT-base (HF ``BertModel``, seq 128), random weights,
  built ``--int8`` (calibrated on random batches: what these random-weight models see) for
  batches 1..``--batch``, tuned and run at ``--batch``, ``--int8 --fp16`` (float layers in FP16), and
  ``--fp16`` for the ratio, with and without ``--accuracy-budget``: the build's lines,
  each plan's latency (CUDA graph replay), its relative error against PyTorch's FP32 model,
  and ``torch.compile(mode="reduce-overhead")`` FP16 in the same run.

    python3 benchmarks/int8_bench.py --out DIR [--models digits,resnet50,bert] [--batch 32]
           [--budget 0.05] [--calibration-batches 4] [--variants fp16,int8,...] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp16_bench import record_run, torch_runs
from runtime_bench import export_models, feeds_for


def build(model: dict, plan: str, cache: str, batch: int, flags: list[str]) -> dict:
    shape, low = f"{model['input']}:{batch}x{model['shape']}", f"{model['input']}:1x{model['shape']}"
    command = [sys.executable, "-m", "plugrt", "build", model["onnx"], "-o", plan, "--no-progress", "--force",
               "--min-shapes", low, "--opt-shapes", shape, "--max-shapes", shape] + flags
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PLUGRT_KERNEL_CACHE=cache))
    if done.returncode:
        return {"failed": done.stderr[-2000:], "seconds": round(time.perf_counter() - started, 1)}
    lines = [line for line in done.stdout.splitlines() if line.startswith(("precision", "accuracy", "kernels", "  "))]
    return {"seconds": round(time.perf_counter() - started, 1), "lines": lines[:40]}


def calibration_folder(work: str, model: dict, batch: int, count: int) -> str:
    folder = os.path.join(work, f"{os.path.basename(model['onnx'])}-calibration")
    os.makedirs(folder, exist_ok=True)
    for index in range(count):
        np.savez(os.path.join(folder, f"batch{index:03d}.npz"), **{model["input"]: feeds_for(model, batch, 100 + index)})
    return folder


def digits_report(cache: str) -> dict:
    """Held-out accuracy of INT8 engines of the digits CNN, one per calibrator."""
    from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
    from plugrt.testing.digits import accuracy, load_digits_split, train_digits_cnn

    _, _, x_calib, x_test, y_test = load_digits_split()
    model, fp32_accuracy = train_digits_cnn()
    report = {"fp32_accuracy": fp32_accuracy}
    for algorithm in ("entropy", "minmax", "percentile", "mse"):
        profile = OptimizationProfile()
        profile.set_shape("input", (1, 1, 8, 8), (len(x_test), 1, 8, 8), (len(x_test), 1, 8, 8))
        batches = [{"input": x_calib[i:i + 50]} for i in range(0, len(x_calib), 50)]
        config = BuilderConfig(int8=True, calibration_data=batches, calibration_algorithm=algorithm, progress=False,
                               profiles=[profile])
        engine = Builder().build_engine(model, config)
        with engine.create_execution_context() as context:
            logits = context.execute({"input": x_test})["logits"]
        report[algorithm] = {"accuracy": accuracy(logits, y_test), "layers": engine.precision["int8"]["layers"]}
    return report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--models", default="digits,resnet50,bert")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--budget", type=float, default=0.05)
    parser.add_argument("--calibration-batches", type=int, default=4)
    parser.add_argument("--calibration-batch", type=int, default=4, help="images (sequences) per calibration batch")
    parser.add_argument("--level", default="3")
    parser.add_argument("--variants", default="fp16,int8,int8_fp16,int8_budget",
                        help="builds of each model, of fp16, int8, int8_fp16, int8_budget")
    parser.add_argument("--profile", action="store_true", help="also record each plan's per-layer profile")
    parser.add_argument("--work", default="", help="a folder kept between runs (plans, kernel cache): a plan built "
                        "there before is reused, so a long run can go on in a second call")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="plugrt-int8-")
    os.makedirs(work, exist_ok=True)
    cache = os.environ.get("PLUGRT_BENCH_KERNEL_CACHE") or os.path.join(work, "kernel-cache")  # (gpu_run.sh: one shared, kept)
    names = args.models.split(",")
    report: dict = {}

    def save():
        with open(os.path.join(args.out, "int8_bench.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)

    if "digits" in names:
        report["digits"] = digits_report(cache)
        save()
    models = export_models(work, [n for n in names if n != "digits"])
    for name, model in models.items():
        entry = report.setdefault(f"{name}_b{args.batch}", {})
        torch_report = torch_runs(model, args.batch)
        reference = torch_report.pop("fp32_output")
        entry.update({k: v for k, v in torch_report.items() if k.startswith("compile_fp16")})
        # Calibration batches at their own (smaller) batch, inside the profile (1..--batch):
        # the references that calibrate (and measure the budget) run on the CPU.
        folder = calibration_folder(work, model, args.calibration_batch, args.calibration_batches)
        variants = {"fp16": ["--fp16"], "int8": ["--int8", "--calibration-data", folder],
                    "int8_fp16": ["--int8", "--fp16", "--calibration-data", folder],
                    "int8_budget": ["--int8", "--fp16", "--calibration-data", folder, "--accuracy-budget",
                                    str(args.budget)]}
        for label, flags in variants.items():
            if label not in args.variants.split(","):
                continue
            plan = os.path.join(work, f"{name}_{label}.plan")
            record = plan + ".build.json"
            if args.work and os.path.exists(plan) and os.path.exists(record):
                entry[f"{label}_build"] = dict(json.load(open(record)), reused=True)
            else:
                entry[f"{label}_build"] = build(model, plan, cache, args.batch, ["--optimization-level", args.level] + flags)
                with open(record, "w") as f:
                    json.dump(entry[f"{label}_build"], f)
            if "failed" in entry[f"{label}_build"]:
                save()
                continue
            record_run(entry, label, plan, model, args.batch, reference, args.profile)
            save()
    save()
    print("\n== int8 ==")
    if "digits" in report:
        d = report["digits"]
        print(f"digits CNN held-out accuracy: fp32 {d['fp32_accuracy']:.2f}% | " +
              " | ".join(f"{a} {d[a]['accuracy']:.2f}% ({d[a]['layers']} int8 layers)"
                         for a in ("entropy", "minmax", "percentile", "mse") if a in d))
    print(f"{'model':14s} {'variant':12s} {'ms':>8s} {'rel err':>8s} {'vs fp16':>8s} {'compile fp16':>12s}")
    for key, entry in report.items():
        if key == "digits":
            continue
        fp16 = entry.get("fp16_ms", float("nan"))
        for label in ("fp16", "int8", "int8_fp16", "int8_budget"):
            if f"{label}_build" not in entry:
                continue
            if "failed" in entry[f"{label}_build"]:
                print(f"{key:14s} {label:12s} build failed: {entry[f'{label}_build']['failed'][-300:]}")
                continue
            ms = entry.get(f"{label}_ms", float("nan"))
            print(f"{key:14s} {label:12s} {ms:8.3f} {entry.get(f'{label}_rel_err_vs_torch_fp32', float('nan')):8.1e} "
                  f"{ms / fp16:8.2f} {entry.get('compile_fp16_ms', float('nan')):12.3f}")
            lines = entry[f"{label}_build"]["lines"]
            print("   " + " | ".join(line for line in lines if not line.startswith("  "))[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())
