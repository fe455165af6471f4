"""Kernels inside plans and the kernel cache, on a GPU: ResNet-50 (torchvision, exported
from PyTorch) built twice in fresh processes with one empty kernel cache (the second build
must compile no kernel), then loaded and run once in a fresh process with another empty
cache (no kernel compiled: they come from the plan), timed.

    python3 benchmarks/plan_load.py --out gpu-results [--optimization-level N] [--batch N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_LOAD_AND_RUN = """
import json, sys, time
started = time.perf_counter()
import numpy as np
from plugrt import binaries
from plugrt.engine import Engine
imported = time.perf_counter()
engine = Engine.load(sys.argv[1])
loaded = time.perf_counter()
context = engine.create_execution_context()
prepared = time.perf_counter()
x = np.load(sys.argv[2])
out = context.execute({"input": x})["output"]
ran = time.perf_counter()
np.save(sys.argv[3], out)
print(json.dumps({"import_s": imported - started, "load_s": loaded - imported, "context_s": prepared - loaded,
                  "first_run_s": ran - prepared, "load_and_first_inference_s": ran - imported,
                  "kernels": binaries.stats()}))
"""


def _run(command: list, cache: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PLUGRT_KERNEL_CACHE=cache)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[:4])} failed:\n{done.stderr[-3000:]}")
    return done, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--optimization-level", default="3")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import numpy as np
    import torch
    import torchvision

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from models import export

    work = tempfile.mkdtemp(prefix="plugrt-plan-load-")
    model = export(torchvision.models.resnet50(weights=None).eval(), torch.randn(args.batch, 3, 224, 224),
                   os.path.join(work, "resnet50.onnx"), {})
    plan = os.path.join(work, "resnet50.plan")
    build_cache, load_cache = os.path.join(work, "build-cache"), os.path.join(work, "load-cache")
    build = [sys.executable, "-m", "plugrt", "build", model, "-o", plan, "--no-progress", "--force",
             "--optimization-level", args.optimization_level]
    report: dict = {"model": "resnet50", "batch": args.batch, "optimization_level": args.optimization_level}
    for name in ("cold_build", "warm_build"):
        done, seconds = _run(build, build_cache)
        report[name] = {"seconds": seconds, "kernel_line": [l for l in done.stdout.splitlines() if l.startswith("kernels:")]}
    report["cache_files"] = len(os.listdir(build_cache))
    report["plan_bytes"] = os.path.getsize(plan)
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224), dtype=np.float32)
    np.save(os.path.join(work, "x.npy"), x)
    done, seconds = _run([sys.executable, "-c", _LOAD_AND_RUN, plan, os.path.join(work, "x.npy"),
                          os.path.join(work, "y.npy")], load_cache)
    report["fresh_load"] = json.loads(done.stdout.strip().splitlines()[-1])
    report["fresh_load"]["process_s"] = seconds
    report["fresh_load"]["warnings"] = [l for l in done.stderr.splitlines() if "arn" in l][:5]
    from plugrt.engine import Engine

    got = np.load(os.path.join(work, "y.npy"))
    again = Engine.load(plan).create_execution_context().execute({"input": x})["output"]
    report["fresh_equals_in_process"] = bool(np.array_equal(got, again))
    print(json.dumps(report, indent=2))
    with open(os.path.join(args.out, "plan_load.json"), "w") as f:
        json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
