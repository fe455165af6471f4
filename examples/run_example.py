"""The main job: make the example models, build plugrt engines, run them, compare with onnxruntime.

``python examples/run_example.py`` builds each model into a plan file (dynamic batch,
profile 1..4), loads the plan, runs it on the GPU (or in Numba's CUDA simulator when
there is none) and prints one row per model with the largest relative error against
onnxruntime. ``python examples/run_example.py CPU`` runs the plugins' references instead.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from make_models import EXAMPLE_SHAPES, main as make_models  # noqa: E402


def run_engine(path: str, shapes: dict, feeds: dict) -> dict:
    """Build a plan for ``path`` (batch 1..4), save it, load it and run ``feeds``."""
    from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile

    profile = OptimizationProfile()
    for name, shape in shapes.items():
        profile.set_shape(name, (1,) + shape[1:], shape, (4,) + shape[1:])
    config = BuilderConfig()
    config.add_optimization_profile(profile)
    plan = os.path.splitext(path)[0] + ".plan"
    Builder().build_engine(path, config).save(plan)
    return Engine.load(plan).create_execution_context().execute(feeds)


def compare(path: str, shapes: dict, device: str = "CUDA") -> float:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    if device == "CPU":
        from plugrt.onnx import backend

        got = dict(zip(want, backend.prepare(path, "CPU").run(feeds)))
    else:
        got = run_engine(path, shapes, feeds)
    return max(float(np.max(np.abs(got[n] - w)) / (np.max(np.abs(w)) + 1e-12)) for n, w in want.items())


def run(device: str = "CUDA") -> int:
    from plugrt import PlugrtError
    from plugrt.device import announce_once, simulated

    if device != "CPU":
        announce_once()
        device = "CUDA-sim" if simulated() else "CUDA"
    failures = 0
    print(f"{'model':10s} {'device':8s} {'max rel err':>12s} {'seconds':>8s}")
    for path in make_models(HERE):
        name = os.path.splitext(os.path.basename(path))[0]
        started = time.perf_counter()
        try:
            err = compare(path, EXAMPLE_SHAPES[name], "CPU" if device == "CPU" else "CUDA")
        except PlugrtError as exc:
            failures += 1
            print(f"{name:10s} {device:8s} {'-':>12s} FAILED: {exc}")
            continue
        ok = err <= 1e-4
        failures += not ok
        print(f"{name:10s} {device:8s} {err:12.2e} {time.perf_counter() - started:8.1f} {'ok' if ok else 'MISMATCH'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1].upper() if len(sys.argv) > 1 else "CUDA"))
