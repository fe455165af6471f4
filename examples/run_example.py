"""The main job: make the example models, run them through plugrt, compare with onnxruntime.

``python examples/run_example.py`` prints one row per model with the largest relative error.
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from make_models import EXAMPLE_SHAPES, main as make_models  # noqa: E402


def compare(path: str, shapes: dict, device: str = "CPU") -> float:
    import onnxruntime as ort

    from plugrt.onnx import backend

    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    got = backend.prepare(path, device).run(feeds)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    return max(float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-12)) for g, w in zip(got, want))


def run(device: str = "CPU") -> int:
    from plugrt import PlugrtError

    failures = 0
    print(f"{'model':10s} {'device':6s} {'max rel err':>12s}")
    for path in make_models(HERE):
        name = os.path.splitext(os.path.basename(path))[0]
        try:
            err = compare(path, EXAMPLE_SHAPES[name], device)
        except PlugrtError as exc:
            failures += 1
            print(f"{name:10s} {device:6s} {'-':>12s} FAILED: {exc}")
            continue
        ok = err <= 1e-4
        failures += not ok
        print(f"{name:10s} {device:6s} {err:12.2e} {'ok' if ok else 'MISMATCH'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1] if len(sys.argv) > 1 else "CPU"))
