"""Issue 19's figures on a GPU: BERT-base (HF ``BertModel``, random weights) exported with a
dynamic batch and sequence, built for batch 1 and sequence 1..512 (opt 128), and beside it
a static engine at sequence 128; then, in a fresh process with no kernel cache (so every
kernel comes from the plan or is compiled there):

- for each sequence length of ``--seqs``, none seen before by the context: the first
  request's latency (specialization, kernels loaded from the plan) and the steady latency
  (median of ``--runs`` after it), their ratio (asked: at most 2);
- the kernels compiled after ``Engine.load`` (asked: none);
- at the opt shape, the dynamic engine's steady latency against the static engine's
  (asked: within 10%); with ``--diagnose``, both engines' per-layer times there.

    python3 benchmarks/dynamic_bench.py --out DIR [--seqs 1,7,64,100,128,200,333,512] [--fp16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_MEASURE = r"""
import json, sys, time
import numpy as np
from plugrt import binaries
from plugrt.engine import Engine

plan, seqs, runs = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
started = time.perf_counter()
engine = Engine.load(plan)
context = engine.create_execution_context()
loaded = time.perf_counter() - started
after_load = binaries.stats()["compiled"]
rng = np.random.default_rng(0)
rows = []
for seq in seqs:
    feeds = {"input_ids": rng.integers(0, 30522, (1, seq), dtype=np.int64)}
    started = time.perf_counter()
    context.execute(feeds)
    first = (time.perf_counter() - started) * 1e3
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        context.execute(feeds)
        times.append((time.perf_counter() - started) * 1e3)
    prepared = context.specialize({"input_ids": (1, seq)})  # (the one the first request made: kept)
    rows.append({"seq": seq, "first_ms": first, "steady_ms": float(np.median(times)),
                 "prepare_ms": prepared.prepare_seconds * 1e3, "launches": len(prepared.launches),
                 "raw": prepared.raw, "graph": prepared.cuda_graph is not None})
print(json.dumps({"load_s": loaded, "compiled_at_load": after_load,
                  "compiled_after_load": binaries.stats()["compiled"] - after_load, "rows": rows}))
"""


_DIAGNOSE = r"""
import cProfile, io, json, pstats, sys, time
import numpy as np
from plugrt.engine import Engine
from plugrt.layer_profile import profile_json, profile_layers

plan, seqs = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
engine = Engine.load(plan)
rng = np.random.default_rng(1)
report = {"profiles": {}}
for seq in seqs:
    feeds = {"input_ids": rng.integers(0, 30522, (1, seq), dtype=np.int64)}
    rows = profile_json(profile_layers(engine, feeds, runs=5))
    layers = sorted(rows["layers"], key=lambda r: -r["median_ms"])
    report["profiles"][seq] = {"total_ms": rows["total_median_ms"], "layers": len(rows["layers"]),
                               "slowest": [{k: r.get(k) for k in ("name", "op", "tactic", "median_ms", "blocks")}
                                           for r in layers[:10]]}
context = engine.create_execution_context()
feeds = {"input_ids": rng.integers(0, 30522, (1, 77), dtype=np.int64)}
profiler = cProfile.Profile()
profiler.enable()
context.execute(feeds)
profiler.disable()
text = io.StringIO()
pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
report["first_request_cumulative"] = text.getvalue()[-9000:]
text = io.StringIO()
pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
report["first_request_tottime"] = text.getvalue()[-6000:]
print(json.dumps(report))
"""


_COMPARE = r"""
import json, sys
import numpy as np
from plugrt.engine import Engine
from plugrt.layer_profile import profile_json, profile_layers

rng = np.random.default_rng(2)
feeds = {"input_ids": rng.integers(0, 30522, (1, 128), dtype=np.int64)}
found = {}
for label, plan in zip(("dynamic", "static"), sys.argv[1:3]):
    rows = profile_json(profile_layers(Engine.load(plan), feeds, runs=20))
    found[label] = {"total_ms": rows["total_median_ms"],
                    "layers": {r["name"]: [r["op"], r["tactic"], r["median_ms"]] for r in rows["layers"]}}
print(json.dumps(found))
"""


def compare_at_opt(dynamic: str, static: str) -> dict:
    """Both engines' per-layer times at the opt shape (seq 128): the layers only one has,
    and those whose tactic or time differs most (what the 10% is made of)."""
    done = subprocess.run([sys.executable, "-c", _COMPARE, dynamic, static], capture_output=True, text=True,
                          env=dict(os.environ, PLUGRT_KERNEL_CACHE="off"))
    if done.returncode:
        return {"failed": done.stderr[-2000:]}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    dyn, sta = found["dynamic"]["layers"], found["static"]["layers"]
    both = sorted(set(dyn) & set(sta), key=lambda n: -abs(dyn[n][2] - sta[n][2]))
    return {"total_ms": {k: v["total_ms"] for k, v in found.items()},
            "only_dynamic": {n: dyn[n] for n in dyn if n not in sta},
            "only_static": {n: sta[n] for n in sta if n not in dyn},
            "differing": [{"name": n, "dynamic": dyn[n], "static": sta[n]} for n in both[:15]]}


def diagnose(plan: str, seqs: list[int]) -> dict:
    """Per-layer profiles at ``seqs`` and a profile of a never-seen length's first request."""
    done = subprocess.run([sys.executable, "-c", _DIAGNOSE, plan, ",".join(map(str, seqs))],
                          capture_output=True, text=True, env=dict(os.environ, PLUGRT_KERNEL_CACHE="off"))
    if done.returncode:
        return {"failed": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def export(work: str) -> str:
    import torch
    from transformers import BertConfig, BertModel

    torch.backends.mha.set_fastpath_enabled(False)

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(BertConfig(), add_pooling_layer=False)

        def forward(self, input_ids):
            return self.bert(input_ids=input_ids).last_hidden_state

    path = os.path.join(work, "bert.onnx")
    with torch.no_grad():
        torch.onnx.export(Bert().eval(), (torch.randint(0, 30522, (1, 128)),), path, input_names=["input_ids"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "last_hidden_state": {0: "batch", 1: "seq"}})
    return path


def build(model: str, plan: str, cache: str, low: int, opt: int, high: int, flags: list[str]) -> dict:
    command = [sys.executable, "-m", "plugrt", "build", model, "-o", plan, "--no-progress", "--force",
               "--min-shapes", f"input_ids:1x{low}", "--opt-shapes", f"input_ids:1x{opt}",
               "--max-shapes", f"input_ids:1x{high}"] + flags
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PLUGRT_KERNEL_CACHE=cache))
    if done.returncode:
        return {"failed": done.stderr[-2000:]}
    warnings = [line for line in done.stderr.splitlines() if "same kernels" in line]
    return {"seconds": round(time.perf_counter() - started, 1), "generic_warning": warnings[:1]}


def measure(plan: str, seqs: list[int], runs: int) -> dict:
    done = subprocess.run([sys.executable, "-c", _MEASURE, plan, ",".join(map(str, seqs)), str(runs)],
                          capture_output=True, text=True, env=dict(os.environ, PLUGRT_KERNEL_CACHE="off"))
    if done.returncode:
        return {"failed": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--seqs", default="1,7,64,100,128,200,333,512")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--diagnose", default="", help="lengths to profile per layer (and a first request's host profile)")
    parser.add_argument("--static", type=int, default=1, help="0: no static engine")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="plugrt-dynamic-")
    cache = os.environ.get("PLUGRT_BENCH_KERNEL_CACHE") or os.path.join(work, "kernel-cache")  # (gpu_run.sh: one shared, kept)
    flags = ["--fp16"] if args.fp16 else []
    model = export(work)
    report: dict = {"precision": "fp16" if args.fp16 else "fp32/tf32"}
    seqs = [int(s) for s in args.seqs.split(",")]
    builds = (("dynamic", (1, 128, 512)), ("static", (128, 128, 128)))[:2 if args.static else 1]
    for label, (low, opt, high) in builds:
        plan = os.path.join(work, f"{label}.plan")
        report[f"{label}_build"] = build(model, plan, cache, low, opt, high, flags)
        if "failed" not in report[f"{label}_build"]:
            report[label] = measure(plan, seqs if label == "dynamic" else [128], args.runs)
            if label == "dynamic" and args.diagnose:
                report["diagnose"] = diagnose(plan, [int(s) for s in args.diagnose.split(",")])
        if label == "static" and args.diagnose and "failed" not in report.get("dynamic_build", {"failed": 1}):
            report["at_opt"] = compare_at_opt(os.path.join(work, "dynamic.plan"), plan)
        with open(os.path.join(args.out, "dynamic_bench.json"), "w") as f:
            json.dump(report, f, indent=2)
    print("\n== dynamic shapes (BERT-base, batch 1; first request of a never-seen length vs steady) ==")
    for label, _ in builds:
        entry = report.get(label) or report.get(f"{label}_build")
        if "failed" in entry:
            print(f"{label}: failed: {entry['failed'][-400:]}")
            continue
        print(f"{label}: load {entry['load_s']:.2f} s, kernels compiled after load: {entry['compiled_after_load']}")
        for row in entry["rows"]:
            print(f"  seq {row['seq']:4d}: first {row['first_ms']:8.2f} ms, steady {row['steady_ms']:7.3f} ms, "
                  f"ratio {row['first_ms'] / row['steady_ms']:5.2f} (preparing {row.get('prepare_ms', float('nan')):.1f} ms "
                  f"of {row.get('launches', 0)} launches; graph {row.get('graph')})")
    if "at_opt" in report and "failed" not in report["at_opt"]:
        cmp = report["at_opt"]
        print(f"at opt, per layer: {cmp['total_ms']}; only dynamic: {list(cmp['only_dynamic'])[:6]}, "
              f"only static: {list(cmp['only_static'])[:6]}")
        for row in cmp["differing"][:6]:
            print(f"  {row['name'][:60]}: dynamic {row['dynamic']}, static {row['static']}")
    if "dynamic" in report and "static" in report and "rows" in report["static"]:
        opt = next(r for r in report["dynamic"]["rows"] if r["seq"] == 128)["steady_ms"]
        static = report["static"]["rows"][0]["steady_ms"]
        print(f"opt shape (seq 128): dynamic {opt:.3f} ms, static {static:.3f} ms, ratio {opt / static:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
