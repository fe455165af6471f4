"""End to end: the example models against onnxruntime, through the CPU backend (the
plugins' references) and through GPU engines (the CUDA simulator without a GPU)."""

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from make_models import MODELS  # noqa: E402

from conftest import skip_unless_ops  # noqa: E402
from plugrt.onnx import backend  # noqa: E402

SHAPES = {"convnet": [(1, 3, 8, 8), (3, 3, 8, 8)], "encoder": [(1, 5, 32), (2, 8, 32)]}
#: The simulator runs one shape of each (the convnet is the slowest test there).
SIM_SHAPES = {"convnet": [(1, 3, 8, 8)], "encoder": [(2, 8, 32)]}


@pytest.mark.parametrize("device", ["CPU", "CUDA"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_example_model_matches_onnxruntime(name, device, rng):
    from plugrt.device import simulated

    model = MODELS[name]()
    skip_unless_ops(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rep = backend.prepare(model, device, **({"tf32": False} if device == "CUDA" else {}))  # fp32 math: fp32 tolerance
    input_name = model.graph.input[0].name
    shapes = SIM_SHAPES[name] if device == "CUDA" and simulated() else SHAPES[name]
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        (want,) = session.run(None, {input_name: x})
        (got,) = rep.run([x])
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_backend_supports_cpu_and_cuda():
    assert backend.supports_device("CPU") and backend.supports_device("CUDA")
    assert not backend.supports_device("TPU")


def test_main_job_script(tmp_path):
    import subprocess

    script = Path(__file__).resolve().parents[1] / "examples" / "make_models.py"
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, check=True)
    for path in out.stdout.split():
        onnx.checker.check_model(onnx.load(path))
