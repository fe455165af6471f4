"""The runtime on real models, on a GPU (issue 15's figures), in one run:

- latency: ResNet-50 (torchvision) and BERT-base (HF ``BertModel``, seq 128), exported from
  PyTorch, at batch 1 and 32: plugrt with direct launches ("before") and with CUDA graphs,
  beside PyTorch eager and ``torch.compile(mode="reduce-overhead")``, median wall time per
  call with a synchronize; the host time of a graph-replayed ``execute_async`` against
  30 us + 1.5 us per kernel (the median of 200 calls, the garbage collector paused as
  ``timeit`` pauses it: a collection of the builds' garbage is not the call's cost);
- builds: ResNet-50 built twice in fresh processes with one kernel cache (the second must
  compile nothing); a fresh process's ``Engine.load`` + first inference (no cache: the
  kernels come from the plan);
- concurrency: 4 contexts on 4 streams against one, batch 1; 8 threads x N requests over a
  ContextPool, bit-identical to serial runs; 10,000 runs without memory growth;
- ``plugrt bench`` on the plan.

    python3 benchmarks/runtime_bench.py --out DIR [--parts ...] [--models resnet50,bert]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

PARTS = ("build", "load", "latency", "concurrency", "threads", "memory", "bench")
SEQ = 128

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
out = context.execute({engine.input_names[0]: x})
ran = time.perf_counter()
np.save(sys.argv[3], out[engine.output_names[0]])
print(json.dumps({"import_s": imported - started, "load_s": loaded - imported, "context_s": prepared - loaded,
                  "first_run_s": ran - prepared, "load_and_first_inference_s": ran - imported,
                  "kernels": binaries.stats()}))
"""


def export_models(work: str, names: list[str]) -> dict:
    import torch

    torch.backends.mha.set_fastpath_enabled(False)
    found = {}
    for name in names:
        path = os.path.join(work, f"{name}.onnx")
        torch.manual_seed(0)  # the same weights in every run: a plan kept from an earlier run still matches
        if name == "resnet50":
            import torchvision

            model = torchvision.models.resnet50(weights=None).eval()
            example, input_name, output_name = torch.randn(1, 3, 224, 224), "input", "output"
        else:
            from transformers import BertConfig, BertModel

            class Bert(torch.nn.Module):  # input_ids in, last_hidden_state out (keywords for transformers 5)
                def __init__(self):
                    super().__init__()
                    self.bert = BertModel(BertConfig(), add_pooling_layer=False)

                def forward(self, input_ids):
                    return self.bert(input_ids=input_ids).last_hidden_state

            model = Bert().eval()
            example, input_name, output_name = torch.randint(0, 30522, (1, SEQ)), "input_ids", "last_hidden_state"
        with torch.no_grad():
            torch.onnx.export(model, (example,), path, input_names=[input_name], output_names=[output_name],
                              opset_version=17, dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}},
                              dynamo=False)
        shape = "x".join(str(d) for d in example.shape[1:])
        found[name] = {"torch": model, "onnx": path, "input": input_name, "output": output_name, "shape": shape,
                       "example": example}
    return found


def feeds_for(model: dict, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if model["input"] == "input_ids":
        return rng.integers(0, 30522, (batch, SEQ), dtype=np.int64)
    return rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)


def build(model: dict, plan: str, cache: str, level: str) -> dict:
    shapes = model["shape"]
    command = [sys.executable, "-m", "plugrt", "build", model["onnx"], "-o", plan, "--no-progress", "--force",
               "--optimization-level", level, "--min-shapes", f"{model['input']}:1x{shapes}",
               "--opt-shapes", f"{model['input']}:1x{shapes}", "--max-shapes", f"{model['input']}:32x{shapes}"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PLUGRT_KERNEL_CACHE=cache))
    if done.returncode:
        raise RuntimeError(f"build failed:\n{done.stderr[-3000:]}")
    return {"seconds": round(time.perf_counter() - started, 1),
            "kernels": [line for line in done.stdout.splitlines() if line.startswith("kernels:")]}


def fresh_load(plan: str, x: np.ndarray, work: str) -> dict:
    np.save(os.path.join(work, "x.npy"), x)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, plan, os.path.join(work, "x.npy"),
                           os.path.join(work, "y.npy")], capture_output=True, text=True,
                          env=dict(os.environ, PLUGRT_KERNEL_CACHE="off"))
    if done.returncode:
        raise RuntimeError(f"fresh load failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["process_s"] = time.perf_counter() - started
    report["warnings"] = [line for line in done.stderr.splitlines() if "arn" in line][:5]
    return report


def _median_ms(fn, sync, repeats: int = 50, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1e3)


def plugrt_latency(engine, model: dict, batch: int) -> dict:
    from numba import cuda

    x = feeds_for(model, batch)
    feed = cuda.to_device(x)
    report = {}
    for label, graphs in (("direct", False), ("graph", True)):
        with engine.create_execution_context(use_cuda_graph=graphs) as ctx:
            stream = ctx.stream
            spec_out = ctx.execute({model["input"]: x})
            outs = {name: cuda.device_array(v.shape, v.dtype) for name, v in spec_out.items()}

            def call():
                ctx.execute_async({model["input"]: feed}, stream=stream, outputs=outs)

            report[f"{label}_ms"] = _median_ms(call, stream.synchronize)
            host = []
            gc.collect()  # as timeit does: no collection of the builds' garbage inside a timed call
            gc.disable()
            try:
                for _ in range(200):
                    started = time.perf_counter()
                    call()
                    host.append(time.perf_counter() - started)
                    stream.synchronize()
            finally:
                gc.enable()
            report[f"{label}_host_us"] = float(np.median(host) * 1e6)
            if graphs and batch == 1:
                report["graph_host_profile"] = _profile(call, stream.synchronize)
            report["kernels"] = len(ctx.current.launches)
            report[f"{label}_graph"] = ctx.current.cuda_graph is not None
            np.testing.assert_allclose(outs[model["output"]].copy_to_host(), spec_out[model["output"]], rtol=1e-5,
                                       atol=1e-5)
    report["host_budget_us"] = 30 + 1.5 * report["kernels"]
    return report


def _profile(call, sync, calls: int = 300) -> str:
    """Where a graph-replayed execute_async spends its host time (cProfile, top functions)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    for _ in range(calls):
        profiler.enable()
        call()
        profiler.disable()
        sync()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
    return text.getvalue()[-3500:]


def torch_latency(model: dict, batch: int, compile_too: bool) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    net = model["torch"].cuda()
    x = torch.from_numpy(feeds_for(model, batch)).cuda()
    report = {}
    with torch.no_grad():
        report["eager_ms"] = _median_ms(lambda: net(x), torch.cuda.synchronize)
        if compile_too:
            compiled = torch.compile(net, mode="reduce-overhead")
            started = time.perf_counter()
            for _ in range(3):
                compiled(x)
            torch.cuda.synchronize()
            report["compile_seconds"] = time.perf_counter() - started
            report["compile_ms"] = _median_ms(lambda: compiled(x), torch.cuda.synchronize)
    net.cpu()
    return report


def concurrency(engine, model: dict, contexts: int, seconds: float = 3.0, graphs: bool = True) -> dict:
    from numba import cuda

    x = feeds_for(model, 1)
    counts = [0] * contexts
    start, stop = threading.Barrier(contexts + 1), threading.Event()

    def worker(i):
        ctx = engine.create_execution_context(use_cuda_graph=graphs)
        feed = cuda.to_device(x)
        first = ctx.execute({model["input"]: x})
        outs = {name: cuda.device_array(v.shape, v.dtype) for name, v in first.items()}  # a server's buffers
        for _ in range(3):
            ctx.execute_async({model["input"]: feed}, outputs=outs)
        ctx.stream.synchronize()
        start.wait()
        while not stop.is_set():
            ctx.execute_async({model["input"]: feed}, outputs=outs)
            ctx.stream.synchronize()
            counts[i] += 1
        ctx.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(contexts)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    return {"contexts": contexts, "requests": sum(counts), "per_second": sum(counts) / elapsed}


def threads_bit_identical(engine, model: dict, threads: int = 8, requests: int = 1000) -> dict:

    from plugrt.engine import ContextPool

    inputs = [feeds_for(model, 1, seed) for seed in range(16)]
    with engine.create_execution_context() as ctx:
        serial = [ctx.execute({model["input"]: x})[model["output"]] for x in inputs]
    mismatches, errors = [0], []
    with ContextPool(engine, size=4) as pool:
        def worker(t):
            try:
                for r in range(requests):
                    k = (t * requests + r) % len(inputs)
                    got = pool.execute({model["input"]: inputs[k]})[model["output"]]
                    if not np.array_equal(got, serial[k]):
                        mismatches[0] += 1
            except Exception as exc:  # noqa: BLE001 - reported
                errors.append(repr(exc))

        started = time.perf_counter()
        workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    return {"threads": threads, "requests": threads * requests, "mismatches": mismatches[0], "errors": errors[:3],
            "seconds": time.perf_counter() - started}


def memory_growth(engine, model: dict, runs: int = 10000) -> dict:
    from numba import cuda

    x = feeds_for(model, 1)
    with engine.create_execution_context() as ctx:
        feed = cuda.to_device(x)
        for _ in range(100):
            ctx.execute_async({model["input"]: feed})
            ctx.execute({model["input"]: x})
        cuda.synchronize()
        free_before = cuda.current_context().get_memory_info().free
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for i in range(runs):
            ctx.execute_async({model["input"]: feed})
            if i % 2:
                ctx.execute({model["input"]: x})
        cuda.synchronize()
        free_after = cuda.current_context().get_memory_info().free
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"runs": runs, "device_free_change_bytes": int(free_after) - int(free_before),
            "max_rss_growth_kib": rss_after - rss_before}


def bench_cli(plan: str, model: dict, out: str) -> dict:
    report = {}
    for streams in (1, 4):
        path = os.path.join(out, f"bench_{streams}.json")
        profile = ["--dump-profile"] if streams == 1 else []  # which layers a batch-1 query spends its time in
        done = subprocess.run([sys.executable, "-m", "plugrt", "bench", plan, "--shapes",
                               f"{model['input']}:1x{model['shape']}", "--streams", str(streams), "--duration", "2",
                               "--json", path, "--force", "--no-progress", *profile], capture_output=True, text=True)
        with open(os.path.join(out, f"bench_{streams}.txt"), "w") as f:
            f.write(done.stdout + done.stderr)
        report[f"streams_{streams}"] = {"rc": done.returncode, "stdout": done.stdout[-1500:],
                                        "stderr": done.stderr[-800:]}
    return report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--optimization-level", default="3")
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="plugrt-runtime-")
    cache = os.path.join(work, "kernel-cache")
    models = export_models(work, args.models.split(","))
    report: dict = {"optimization_level": args.optimization_level}

    def save():
        with open(os.path.join(args.out, "runtime_bench.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)

    from plugrt.engine import Engine

    for name, model in models.items():
        plan = os.path.join(work, f"{name}.plan")
        entry = report.setdefault(name, {})
        entry["cold_build"] = build(model, plan, cache, args.optimization_level)
        if "build" in parts:
            entry["warm_build"] = build(model, plan, cache, args.optimization_level)
        save()
        if "load" in parts:
            entry["fresh_load"] = fresh_load(plan, feeds_for(model, 1), work)
            save()
        engine = Engine.load(plan)
        if "latency" in parts:
            for batch in (1, 32):
                entry[f"b{batch}"] = {**plugrt_latency(engine, model, batch),
                                      **torch_latency(model, batch, not args.no_torch_compile)}
                save()
        if "concurrency" in parts:
            one = concurrency(engine, model, 1)
            four = concurrency(engine, model, 4)
            entry["concurrency"] = {"one": one, "four": four, "ratio": four["per_second"] / one["per_second"]}
            for contexts in (2, 8):  # the scaling around the figure
                entry["concurrency"][f"ratio_{contexts}"] = concurrency(engine, model, contexts)["per_second"] \
                    / one["per_second"]
            save()
        if name == "resnet50":
            if "threads" in parts:
                entry["threads"] = threads_bit_identical(engine, model, requests=args.requests)
                save()
            if "memory" in parts:
                entry["memory"] = memory_growth(engine, model)
                save()
            if "bench" in parts:
                entry["bench_cli"] = bench_cli(plan, model, args.out)
                save()
    save()
    print("\n== runtime ==")
    for name in models:
        entry = report[name]
        print(f"{name}: cold build {entry['cold_build']}, warm build {entry.get('warm_build')}")
        if "fresh_load" in entry:
            load = entry["fresh_load"]
            print(f"  fresh load+first inference {load['load_and_first_inference_s']:.2f} s (import "
                  f"{load['import_s']:.2f} s, process {load['process_s']:.2f} s), kernels {load['kernels']}")
        for batch in (1, 32):
            b = entry.get(f"b{batch}")
            if b:
                print(f"  b{batch}: direct {b['direct_ms']:.3f} ms, graph {b['graph_ms']:.3f} ms, eager "
                      f"{b['eager_ms']:.3f} ms, compile {b.get('compile_ms', float('nan')):.3f} ms; host "
                      f"{b['graph_host_us']:.1f} us (direct {b['direct_host_us']:.1f}) for {b['kernels']} kernels, "
                      f"budget {b['host_budget_us']:.1f} us")
        if "graph_host_profile" in entry.get("b1", {}):
            print(entry["b1"]["graph_host_profile"][-1800:])
        for key in ("concurrency", "threads", "memory"):
            if key in entry:
                print(f"  {key}: {entry[key]}")
        if "bench_cli" in entry:
            for streams, result in entry["bench_cli"].items():
                print(f"  plugrt bench {streams}: rc {result['rc']}\n{result['stdout'][-700:]}")
                print(f"  (whole output: bench_{streams[len('streams_'):]}.txt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
