"""Tactic plugins on the GPU: ResNet-18's MaxPool (3x3, stride 2, pad 1 on 64x112x112 at
batch 32) built by the real builder with the tuner on, so the built-in pooling plugin's
tactics and those the contributing distribution ``plugrt-contrib-pool2d`` offers (found by
its entry point) are verified and timed side by side. Reports every timed candidate (from
the timing cache the build wrote), the tactic the plan recorded and who supplied it, the
engine's latency, and torch's ``max_pool2d`` in the same run; the engine's output is
compared with torch's.
"""

from __future__ import annotations

import json
import os

import numpy as np

from gemm_bench import _torch_ms

SHAPE = (32, 64, 112, 112)
ATTRS = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}


def pool_benchmark(out_dir: str, repeats: int = 20, warmup: int = 3) -> dict:
    import torch

    from plugrt.engine import Builder, BuilderConfig, Engine
    from plugrt.registry import default_registry
    from plugrt.testing import single_node_model
    from plugrt.tuning import TimingCache

    registry = default_registry()
    providers = {record.name: [p.op_type for p in record.providers] for record in registry.plugins.values()
                 if record.providers}
    x = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)
    model = single_node_model("MaxPool", {"x": x}, ATTRS, opset=12)
    cache_path = os.path.join(out_dir, "pool-timing-cache.json")
    if os.path.exists(cache_path):
        os.unlink(cache_path)
    engine = Builder(registry).build_engine(model, BuilderConfig(progress=False, timing_cache=cache_path))
    cache = TimingCache.load(cache_path)
    plan = os.path.join(out_dir, "maxpool.plan")
    engine.save(plan)
    engine = Engine.load(plan, registry)
    (layer,) = engine.inspect()["layers"]
    timed = []
    for times in cache.entries.values():
        for key, ms in times.items():
            tactic = json.loads(key)
            timed.append({"name": tactic["name"], "provider": (tactic.get("source") or {}).get("plugin"),
                          "ms": None if ms == float("inf") else ms})
    timed.sort(key=lambda row: (row["ms"] is None, row["ms"] or 0))

    xt = torch.from_numpy(x).cuda()
    want = torch.nn.functional.max_pool2d(xt, 3, 2, 1)
    torch_ms = _torch_ms(lambda: torch.nn.functional.max_pool2d(xt, 3, 2, 1), repeats, warmup)
    context = engine.create_execution_context()
    got = context.execute_async({"x": xt})["out0"]
    context.stream.synchronize()
    exact = bool(torch.equal(torch.as_tensor(got, device="cuda"), want))
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(warmup + repeats):
        start.record()
        context.execute_async({"x": xt})
        stop.record()
        stop.synchronize()
        if i >= warmup:
            samples.append(start.elapsed_time(stop))
    gbytes = (x.nbytes + x.nbytes // 4) / 1e9
    result = {"shape": list(SHAPE), "providers": providers, "candidates": timed, "chosen": layer["tactic"],
              "chosen_provider": layer.get("tactic_provider"), "engine_ms": float(np.median(samples)),
              "torch_ms": torch_ms, "matches_torch_exactly": exact, "min_bytes_gb": gbytes}
    print(f"MaxPool 3x3/2 on {'x'.join(map(str, SHAPE))} (tactic plugins found: {providers})")
    for row in timed:
        who = row["provider"] or "owner (builtin-pooling)"
        print(f"   {row['name']:16} {who:26} {'failed' if row['ms'] is None else '%.4f ms' % row['ms']}")
    supplier = (layer.get("tactic_provider") or {}).get("distribution") or layer["distribution"]
    print(f"plan: {layer['tactic']} from {supplier}; engine {result['engine_ms']:.4f} ms (execute_async, events), "
          f"torch max_pool2d {torch_ms:.4f} ms; output equals torch's: {exact}")
    return result


if __name__ == "__main__":
    print(json.dumps(pool_benchmark("."), indent=1, default=str))
