"""``plugrt export-triton``: a model repository that the real Triton Inference Server (the
``tritonserver`` inside NVIDIA's nvidia-pytriton wheel) loads with its Python backend, on
loopback, with CPU instances running the plan (in the CUDA simulator here). Driven by
``tritonclient``: outputs against onnxruntime, dynamic batching seen in the server's
statistics (fewer executions than requests), a request the engine refuses answered 400
with plugrt's message, and no process left after the server is stopped."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from plugrt.cli import main
from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from serving_helpers import end_session, free_port, triton_env, tritonserver, wait_ready

tritonclient_http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402


def scaled_relu_plan(folder) -> tuple[str, object]:
    """y = Relu(x) * 1.5 over x [batch, n]: batch 1..8, n 2..6 (a width outside it passes
    Triton's config, whose dims are -1, and is refused by the engine)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "k"], ["y"])]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
                              initializer=[helper.make_tensor("k", TensorProto.FLOAT, [], [1.5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = BuilderConfig(progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 2), (2, 4), (8, 6)))
    path = os.path.join(str(folder), "scaled.plan")
    Builder().build_engine(model, config).save(path)
    return path, model


def test_export_triton_writes_the_repository(tmp_path, capsys):
    plan, _ = scaled_relu_plan(tmp_path)
    assert main(["export-triton", plan, "--repo", str(tmp_path / "repo"), "--instances", "2", "--kind", "cpu",
                 "--max-queue-delay-us", "5000"]) == 0
    config = (tmp_path / "repo" / "scaled" / "config.pbtxt").read_text()
    for line in ('backend: "python"', "max_batch_size: 8", "dims: [ -1 ]", "preferred_batch_size: [ 2 ]",
                 "max_queue_delay_microseconds: 5000", "count: 2", "kind: KIND_CPU", "data_type: TYPE_FP32"):
        assert line in config, (line, config)
    assert (tmp_path / "repo" / "scaled" / "1" / "model.plan").read_bytes() == open(plan, "rb").read()
    compile((tmp_path / "repo" / "scaled" / "1" / "model.py").read_text(), "model.py", "exec")
    capsys.readouterr()
    assert main(["export-triton", plan, "--repo", str(tmp_path / "repo"), "--name", "bad name"]) != 0
    assert "a Triton model name is letters, digits" in capsys.readouterr().err


def test_triton_serves_an_exported_plan(tmp_path):
    binary, backends = tritonserver()
    plan, model = scaled_relu_plan(tmp_path)
    repo = tmp_path / "repo"
    assert main(["export-triton", plan, "--repo", str(repo), "--instances", "2", "--kind", "cpu",
                 "--max-queue-delay-us", "20000"]) == 0
    http, grpc = free_port(), free_port()
    command = [binary, f"--model-repository={repo}", f"--backend-directory={backends}", "--http-address=127.0.0.1",
               f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--allow-metrics=false",
               "--exit-timeout-secs=20"]
    log = open(tmp_path / "tritonserver.log", "wb")
    process = subprocess.Popen(command, env=triton_env(), start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", process)
        client = tritonclient_http.InferenceServerClient(f"127.0.0.1:{http}", concurrency=12, network_timeout=300)
        assert client.get_model_config("scaled")["max_batch_size"] == 8
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(5)
        batches = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(12)]

        def infer(x):
            given = tritonclient_http.InferInput("x", list(x.shape), "FP32")
            given.set_data_from_numpy(x)
            return client.async_infer("scaled", [given])

        for x, pending in zip(batches, [infer(x) for x in batches]):
            got = pending.get_result().as_numpy("y")
            np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-6)
        stats = client.get_inference_statistics("scaled")["model_stats"][0]
        assert int(stats["inference_count"]) == 12 and int(stats["execution_count"]) < 12, stats

        wide = tritonclient_http.InferInput("x", [1, 7], "FP32")
        wide.set_data_from_numpy(np.ones((1, 7), np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("scaled", [wide])
        assert refused.value.status() == "400", refused.value
        assert "plugrt: input binding 'x': dim 1 is 7, outside the engine's profile range [2, 6]" in str(refused.value)
        client.close()
    finally:
        left = end_session(process, process.pid)
        log.close()
    assert not left, f"processes left behind: {left}"
    assert process.returncode == 0, (tmp_path / "tritonserver.log").read_text()[-3000:]
