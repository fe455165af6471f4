"""The GPU run: on a machine with an NVIDIA GPU, export ResNet-18 and a BERT-base encoder
layer, build plugrt engines, check them against onnxruntime, and time plugrt against
PyTorch eager at batch 1 and 32. Results go to ``--out`` (JSON) and a table is printed last.

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


def bench_model(name: str, model, make_input, dynamic_dims: dict, out_dir: str, batches=(1, 32)) -> dict:
    import onnxruntime
    import torch

    from models import export
    from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile
    from plugrt.engine.context import host_seconds_per_launch

    path = export(model, make_input(2), os.path.join(out_dir, f"{name}.onnx"), dynamic_dims)
    result = {"model": name}
    config = BuilderConfig()
    shapes = {b: tuple(make_input(b).shape) for b in (1, 2) + tuple(batches)}
    low, high = shapes[1], shapes[max(batches)]
    config.add_optimization_profile(OptimizationProfile().set_shape("input", low, high, high))
    started = time.perf_counter()
    engine = Builder().build_engine(path, config)
    result["build_s"] = time.perf_counter() - started
    plan = os.path.join(out_dir, f"{name}.plan")
    engine.save(plan)
    engine = Engine.load(plan)
    report = engine.inspect()
    result["layers"] = len(report["layers"])
    context = engine.create_execution_context()

    x = make_input(2).numpy()
    got = context.execute({"input": x})["output"]
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = session.run(None, {"input": x})[0]
    result["max_rel_err_vs_onnxruntime"] = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))

    model = model.cuda()
    for batch in batches:
        xt = make_input(batch).cuda()
        with torch.no_grad():
            eager = time_cuda(lambda: model(xt), torch.cuda.synchronize)
        context.execute_async({"input": xt})  # specialize for this shape, inputs in place
        context.stream.synchronize()
        engine_ms = time_cuda(lambda: context.enqueue(), context.stream.synchronize)
        full_ms = time_cuda(lambda: context.execute_async({"input": xt}), context.stream.synchronize)
        spec = context.current
        result[f"batch{batch}"] = {
            "pytorch_eager_ms": eager, "plugrt_enqueue_ms": engine_ms, "plugrt_execute_ms": full_ms,
            "launches": len(spec.launches), "raw_launches": sum(1 for l in spec.launches if l.raw),
            "host_us_per_launch": host_seconds_per_launch(context, repeats=5) * 1e6,
            "specialize_s": spec.prepare_seconds,
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import torch

    from models import BertLayer, resnet18

    torch.manual_seed(0)
    results = []
    runs = [
        ("resnet18", resnet18(), lambda b: torch.randn(b, 3, 224, 224), {0: "N"}),
        ("bert_layer", BertLayer().eval(), lambda b: torch.randn(b, 128, 768), {0: "N"}),
    ]
    for name, model, make_input, dims in runs:
        try:
            results.append(bench_model(name, model, make_input, dims, args.out))
        except Exception as exc:  # report and go on to the next model
            import traceback

            traceback.print_exc()
            results.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
    with open(os.path.join(args.out, "models.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"\n{'model':11s} {'batch':>5s} {'eager ms':>9s} {'plugrt ms':>9s} {'exec ms':>8s} "
          f"{'launches':>8s} {'host us/launch':>14s} {'rel err':>9s} {'build s':>7s}")
    for r in results:
        if "error" in r:
            print(f"{r['model']:11s} ERROR {r['error'][:200]}")
            continue
        for batch in (1, 32):
            b = r[f"batch{batch}"]
            print(f"{r['model']:11s} {batch:5d} {b['pytorch_eager_ms']:9.3f} {b['plugrt_enqueue_ms']:9.3f} "
                  f"{b['plugrt_execute_ms']:8.3f} {b['launches']:8d} {b['host_us_per_launch']:14.1f} "
                  f"{r['max_rel_err_vs_onnxruntime']:9.1e} {r['build_s']:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
