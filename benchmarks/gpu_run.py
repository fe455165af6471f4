"""The GPU run: on a machine with an NVIDIA GPU, export ResNet-18 and a BERT-base encoder
layer, build plugrt engines with and without fusion, check them against onnxruntime, time
them against PyTorch eager at batch 1 and 32, and measure a fused pointwise chain over
1 GiB against the device-to-device copy bandwidth. Results go to ``--out`` (JSON) and a
table is printed last.

Usage: ``python benchmarks/gpu_run.py --out DIR`` (``benchmarks/gpu_run.sh`` also runs the
test suite on the GPU first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def time_cuda(fn, stream_sync, repeats: int = 30, warmup: int = 5) -> float:
    """Median wall time of ``fn`` in ms, synchronizing after each call."""
    for _ in range(warmup):
        fn()
    stream_sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        stream_sync()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def build(path: str, make_input, batches, fusion: bool):
    from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile

    # Heuristic tactics (no timing): fusion's effect alone; tuning_benchmark measures the tuner.
    config = BuilderConfig(fusion=fusion, optimization_level=0)
    low, high = tuple(make_input(1).shape), tuple(make_input(max(batches)).shape)
    config.add_optimization_profile(OptimizationProfile().set_shape("input", low, high, high))
    started = time.perf_counter()
    engine = Builder().build_engine(path, config)
    seconds = time.perf_counter() - started
    plan = path.replace(".onnx", f"{'' if fusion else '-unfused'}.plan")
    engine.save(plan)
    return Engine.load(plan), seconds


def bench_model(name: str, model, make_input, dynamic_dims: dict, out_dir: str, opset: int = 17,
                batches=(1, 32), variants=(True, False)) -> dict:
    import onnxruntime
    import torch

    from models import export
    from plugrt.engine.context import host_seconds_per_launch

    path = export(model, make_input(2), os.path.join(out_dir, f"{name}.onnx"), dynamic_dims, opset)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    x = make_input(2).numpy()
    want = session.run(None, {"input": x})[0]
    result = {"model": name, "opset": opset}
    torch_model = model.cuda()
    for fusion in variants:
        engine, build_s = build(path, make_input, batches, fusion)
        report = engine.inspect()
        with open(os.path.join(out_dir, f"{name}-{'fused' if fusion else 'unfused'}-inspect.json"), "w") as f:
            json.dump(report, f, indent=2)
        context = engine.create_execution_context()
        got = context.execute({"input": x})["output"]
        entry = {"build_s": build_s, "layers": len(report["layers"]),
                 "layer_ops": [layer["op"] for layer in report["layers"]],
                 "max_rel_err_vs_onnxruntime": float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))}
        for batch in batches:
            xt = make_input(batch).cuda()
            with torch.no_grad():
                eager = time_cuda(lambda: torch_model(xt), torch.cuda.synchronize)
            context.execute_async({"input": xt})  # specialize for this shape, inputs in place
            context.stream.synchronize()
            engine_ms = time_cuda(lambda: context.enqueue(), context.stream.synchronize)
            full_ms = time_cuda(lambda: context.execute_async({"input": xt}), context.stream.synchronize)
            spec = context.current
            entry[f"batch{batch}"] = {
                "pytorch_eager_ms": eager, "plugrt_enqueue_ms": engine_ms, "plugrt_execute_ms": full_ms,
                "launches": len(spec.launches), "raw_launches": sum(1 for launch in spec.launches if launch.raw),
                "host_us_per_launch": host_seconds_per_launch(context, repeats=5) * 1e6,
                "specialize_s": spec.prepare_seconds,
            }
        entry["bench"] = plugrt_bench(engine, make_input, batches)
        result["fused" if fusion else "unfused"] = entry
    return result


def plugrt_bench(engine, make_input, batches) -> dict:
    """``plugrt bench``'s measurement (its Python API) at each batch on one stream, and at
    batch 1 on 4 streams (4 contexts, one thread each)."""
    from plugrt.bench import run_benchmark

    runs = {f"batch{b}": ({"input": tuple(make_input(b).shape)}, 1) for b in batches}
    runs["batch1_streams4"] = ({"input": tuple(make_input(1).shape)}, 4)
    return {name: guarded(lambda: run_benchmark(engine, shapes, duration=1.0, streams=streams).as_json())
            for name, (shapes, streams) in runs.items()}


def plugrt_bench_cli(onnx_path: str, out_dir: str) -> dict:
    """``plugrt bench MODEL.onnx`` end to end (it builds the model first); its --json report."""
    import subprocess

    report = os.path.join(out_dir, "resnet18-bench.json")
    command = [sys.executable, "-m", "plugrt", "bench", onnx_path, "--shapes", "input:1x3x224x224",
               "--optimization-level", "0", "--no-progress", "--json", report, "--force"]
    subprocess.run(command, check=True)
    with open(report) as f:
        return json.load(f)


def pointwise_chain_bandwidth(out_dir: str, gib: float = 1.0) -> dict:
    """A 6-op pointwise chain over ``gib`` GiB of float32, fused into one kernel, against a
    device-to-device copy of the same tensor (both move 2 bytes per byte of input)."""
    import onnx
    from numba import cuda
    from onnx import TensorProto, helper, numpy_helper

    from plugrt.engine import Builder

    n = int(gib * (1 << 30)) // 4
    consts = {f"c{k}": np.array(v, np.float32) for k, v in enumerate((1.5, -0.25, 0.75, 2.0))}
    nodes = [helper.make_node("Mul", ["x", "c0"], ["t0"]), helper.make_node("Add", ["t0", "c1"], ["t1"]),
             helper.make_node("Relu", ["t1"], ["t2"]), helper.make_node("Sub", ["t2", "c2"], ["t3"]),
             helper.make_node("Tanh", ["t3"], ["t4"]), helper.make_node("Mul", ["t4", "c3"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = os.path.join(out_dir, "chain.onnx")
    onnx.save(model, path)
    engine = Builder().build_engine(path)
    layers = engine.inspect()["layers"]
    context = engine.create_execution_context()
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    y = context.execute({"x": x})["y"]
    want = np.tanh(np.maximum(x * 1.5 - 0.25, 0) - 0.75) * 2.0
    err = float(np.max(np.abs(y - want)))
    chain_ms = time_events(lambda stream: context.enqueue(stream), context.stream)
    src = cuda.to_device(x)
    dst = cuda.device_array_like(src)
    copy_ms = time_events(lambda stream: dst.copy_to_device(src, stream=stream), context.stream)
    import torch

    tsrc = torch.from_numpy(x).cuda()
    tdst = torch.empty_like(tsrc)
    torch_copy_ms = time_events(lambda stream: tdst.copy_(tsrc), None, torch_events=True)
    moved = 2 * n * 4
    best_copy_ms = min(copy_ms, torch_copy_ms)
    return {"elements": n, "layers": len(layers), "layer_ops": [layer["op"] for layer in layers],
            "max_abs_err": err, "chain_ms": chain_ms, "copy_ms": copy_ms, "torch_copy_ms": torch_copy_ms,
            "chain_tb_s": moved / chain_ms / 1e9, "copy_tb_s": moved / best_copy_ms / 1e9,
            "fraction_of_copy": best_copy_ms / chain_ms}


def time_events(fn, stream, repeats: int = 20, warmup: int = 3, torch_events: bool = False) -> float:
    """Median GPU time of ``fn(stream)`` in ms, between CUDA events on ``stream`` (or
    PyTorch's current stream)."""
    if torch_events:
        import torch

        make, elapsed = (lambda: torch.cuda.Event(enable_timing=True)), (lambda a, b: a.elapsed_time(b))
        record = lambda event: event.record()  # noqa: E731
    else:
        from numba import cuda

        make, elapsed = cuda.event, cuda.event_elapsed_time
        record = lambda event: event.record(stream)  # noqa: E731
    for _ in range(warmup):
        fn(stream)
    times = []
    for _ in range(repeats):
        start, end = make(), make()
        record(start)
        fn(stream)
        record(end)
        end.synchronize()
        times.append(elapsed(start, end))
    return float(np.median(times))


def tuning_benchmark(out_dir: str, onnx_path: str, batch: int = 32) -> dict:
    """The tactic tuner on ResNet-18: heuristic tactics (optimization level 0, the build
    before tuning existed) against tuned ones at ``batch``; cold and warm timing-cache
    builds in fresh processes (``plugrt build``, wall time, imports included), and whether
    the warm build wrote the identical plan."""
    import subprocess

    import torch

    from plugrt.engine import Engine

    shape = f"input:{batch}x3x224x224"
    cache = os.path.join(out_dir, "timing-cache.json")
    if os.path.exists(cache):
        os.unlink(cache)
    result = {"batch": batch}
    for name, extra in (("heuristic", ["--optimization-level", "0"]), ("cold", ["--timing-cache", cache]),
                        ("warm", ["--timing-cache", cache])):
        plan = os.path.join(out_dir, f"resnet18-{name}.plan")
        command = [sys.executable, "-m", "plugrt", "build", onnx_path, "-o", plan, "--min-shapes", "input:1x3x224x224",
                   "--opt-shapes", shape, "--max-shapes", shape, "--no-progress"] + extra
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        result[f"{name}_build_s"] = time.perf_counter() - started
        if done.returncode:
            raise RuntimeError(f"plugrt build ({name}) failed: {done.stderr[-2000:]}")
    with open(os.path.join(out_dir, "resnet18-cold.plan"), "rb") as a, open(os.path.join(out_dir, "resnet18-warm.plan"), "rb") as b:
        result["warm_plan_identical"] = a.read() == b.read()
    x = torch.randn(batch, 3, 224, 224).cuda()
    for name in ("heuristic", "cold"):
        engine = Engine.load(os.path.join(out_dir, f"resnet18-{name}.plan"))
        context = engine.create_execution_context()
        context.execute_async({"input": x})
        context.stream.synchronize()
        result[f"{name}_ms"] = time_cuda(lambda: context.enqueue(), context.stream.synchronize)
        if name == "cold":
            result["layers"] = [{"name": layer["name"][:40], "op": layer["op"], "tactic": layer["tactic"],
                                 "time_ms": layer.get("time_ms"), "runner_up": layer.get("runner_up"),
                                 "tactic_provider": layer.get("tactic_provider")} for layer in engine.inspect()["layers"]]
    return result


PARTS = ("chain", "gemm", "hgemm", "conv", "conv_wgmma", "conv_nhwc", "attention", "attention_fp16", "pool", "tuning",
         "models", "gemm_variants")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    parts = [p for p in args.parts.split(",") if p]
    import torch

    torch.manual_seed(0)
    report: dict = {}

    def save():  # after every part, so a run cut short still returns what it measured
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)

    for part in parts:
        if part == "chain":
            report["pointwise_chain"] = guarded(pointwise_chain_bandwidth, args.out)
        elif part == "gemm":
            report["sgemm"] = guarded(lambda: __import__("gemm_bench").sgemm_benchmark())
        elif part == "tuning":
            report["tuning"] = guarded(tuning_benchmark, args.out, resnet18_onnx(args.out))
        elif part == "models":
            report["models"] = run_models(args.out)
        elif part == "attention":
            report["attention"] = guarded(lambda: __import__("attention_bench").attention_benchmark())
        elif part == "attention_fp16":  # BERT-base's attention in an FP16 engine (batch 32, 128 tokens)
            report["attention_fp16"] = guarded(lambda: __import__("attention_bench").attention_benchmark(
                batch=32, seq=128, dtype="float16"))
        elif part == "hgemm":
            report["hgemm"] = guarded(lambda: __import__("gemm_bench").hgemm_benchmark())
        elif part == "gemm_variants":
            report["gemm_variants"] = guarded(lambda: __import__("gemm_diag").variants_benchmark())
        elif part == "pool":
            report["pool"] = guarded(lambda: __import__("pool_bench").pool_benchmark(args.out))
        elif part == "conv":
            report["conv"] = guarded(lambda: __import__("conv_bench").conv_benchmark())
        elif part == "conv_wgmma":  # the TF32 tensor-core tactics only (mma.sync), beside cuDNN
            report["conv_wgmma"] = guarded(lambda: __import__("conv_bench").conv_benchmark(
                only=("wgmma", "tf32")))
        elif part == "conv_nhwc":  # the channels-last implicit GEMM, FP16 and TF32, beside cuDNN
            report["conv_nhwc"] = guarded(lambda: __import__("conv_nhwc_bench").conv_nhwc_benchmark())
        save()
        print_part(part, report)
    return 0


def resnet18_onnx(out_dir: str) -> str:
    import torch

    from models import export, resnet18

    path = os.path.join(out_dir, "resnet18.onnx")
    if not os.path.exists(path):
        export(resnet18(), torch.randn(2, 3, 224, 224), path, {0: "N"})
    return path


def run_models(out_dir: str) -> list:
    import torch

    from models import BertLayer, resnet18

    runs = [
        ("resnet18", resnet18(), lambda b: torch.randn(b, 3, 224, 224), {0: "N"}, 17, (True, False)),
        ("bert_layer", BertLayer().eval(), lambda b: torch.randn(b, 128, 768), {0: "N"}, 17, (True, False)),
        ("bert_layer_opset14", BertLayer().eval(), lambda b: torch.randn(b, 128, 768), {0: "N"}, 14, (True,)),
    ]
    results = []
    for name, model, make_input, dims, opset, variants in runs:
        entry = guarded(bench_model, name, model, make_input, dims, out_dir, opset, (1, 32), variants)
        results.append({"model": name, **entry})
    results.append({"model": "resnet18 (plugrt bench CLI)", "bench_cli": guarded(plugrt_bench_cli, resnet18_onnx(out_dir),
                                                                                 out_dir)})
    return results


def print_part(part: str, report: dict) -> None:
    if part == "models":
        results = report["models"]
        for r in results:
            for variant in ("fused", "unfused"):
                if variant in r:
                    print(f"{r['model']} {variant}: {r[variant]['layers']} layers: {', '.join(r[variant]['layer_ops'])}")
        print(f"\n{'model':18s} {'variant':8s} {'batch':>5s} {'eager ms':>9s} {'plugrt ms':>9s} {'exec ms':>8s} "
              f"{'launches':>8s} {'layers':>6s} {'rel err':>9s} {'build s':>7s}")
        for r in results:
            if "bench_cli" in r:
                print_bench(r["model"], r["bench_cli"])
                continue
            if "error" in r:
                print(f"{r['model']:18s} ERROR {r['error'][:200]}")
                continue
            for variant in ("fused", "unfused"):
                if variant not in r:
                    continue
                v = r[variant]
                for batch in (1, 32):
                    b = v[f"batch{batch}"]
                    print(f"{r['model']:18s} {variant:8s} {batch:5d} {b['pytorch_eager_ms']:9.3f} "
                          f"{b['plugrt_enqueue_ms']:9.3f} {b['plugrt_execute_ms']:8.3f} {b['launches']:8d} "
                          f"{v['layers']:6d} {v['max_rel_err_vs_onnxruntime']:9.1e} {v['build_s']:7.1f}")
                for run, bench_report in v["bench"].items():
                    print_bench(f"  bench {r['model']} {variant} {run}", bench_report)
    elif part == "chain":
        chain = report["pointwise_chain"]
        if "error" in chain:
            print(f"pointwise chain ERROR {chain['error'][:200]}")
        else:
            print(f"pointwise chain (6 ops, {chain['elements'] * 4 / 2**30:.2f} GiB, {chain['layers']} layer): "
                  f"{chain['chain_ms']:.3f} ms = {chain['chain_tb_s']:.2f} TB/s; D2D copy (Numba {chain['copy_ms']:.3f} ms, "
                  f"PyTorch {chain['torch_copy_ms']:.3f} ms) best {chain['copy_tb_s']:.2f} TB/s; "
                  f"{100 * chain['fraction_of_copy']:.1f}% of copy bandwidth; max abs err {chain['max_abs_err']:.1e}")
    elif part == "tuning":
        tuning = report["tuning"]
        if "error" in tuning:
            print(f"tuning ERROR {tuning['error'][:300]}")
        else:
            print(f"ResNet-18 batch {tuning['batch']}: heuristic tactics {tuning['heuristic_ms']:.2f} ms, tuned "
                  f"{tuning['cold_ms']:.2f} ms; build cold {tuning['cold_build_s']:.1f} s, warm cache "
                  f"{tuning['warm_build_s']:.1f} s (level 0: {tuning['heuristic_build_s']:.1f} s); warm plan identical: "
                  f"{tuning['warm_plan_identical']}")
            for layer in tuning.get("layers", []):
                if layer.get("tactic_provider"):
                    print(f"   {layer['name']} ({layer['op']}): {layer['tactic']} from "
                          f"{layer['tactic_provider']['distribution']}, {layer['time_ms']} ms; runner-up "
                          f"{(layer.get('runner_up') or {}).get('name')} {(layer.get('runner_up') or {}).get('time_ms')} ms")
    elif part in ("gemm", "hgemm", "conv", "conv_wgmma", "conv_nhwc", "attention", "attention_fp16", "gemm_variants",
                  "pool"):
        entry = report["sgemm" if part == "gemm" else part]
        if "error" in entry:
            print(f"{part} ERROR {entry['error'][:300]}")
    sys.stdout.flush()


def print_bench(label: str, report: dict) -> None:
    """One line of a ``plugrt bench`` report."""
    if "error" in report:
        print(f"{label} ERROR {report['error'][:200]}")
        return
    latency, compute, enqueue = report["latency_ms"], report["gpu_compute_ms"], report["host_enqueue_ms"]
    print(f"{label}: latency median {latency['median']:.3f} ms (p99 {latency['p99']:.3f}), GPU compute "
          f"{compute['median']:.3f} ms, host enqueue {enqueue['median']:.3f} ms, "
          f"{report['throughput']['inferences_per_s']:.1f} inferences/s over {report['settings']['streams']} stream(s)")


def guarded(fn, *args) -> dict:
    """``fn(*args)``, or ``{"error": ...}`` with the traceback printed: one failing part
    must not hide the others' numbers."""
    try:
        return fn(*args)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    sys.exit(main())
