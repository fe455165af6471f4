"""``plugrt serve``: a plan behind Ray Serve, speaking KServe v2 on loopback, driven by
Triton's own HTTP client (clients written for Triton work unchanged) and by ``plugrt bench
--server``; outputs against onnxruntime, batching seen in the server's statistics, bad
requests answered 400 with plugrt's message, and no process left after SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import numpy as np
import onnxruntime
import pytest

from serving_helpers import end_session, free_port, post, processes_naming, tiny_plan, wait_ready

ray = pytest.importorskip("ray")
tritonclient_http = pytest.importorskip("tritonclient.http")


def test_a_plan_behind_ray_serve(tmp_path):
    plan, model = tiny_plan(tmp_path)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    port, scratch = free_port(), tempfile.mkdtemp(prefix="rt", dir="/tmp")  # (short: Ray's socket paths)
    env = dict(os.environ, RAY_TMPDIR=scratch, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    command = [sys.executable, "-m", "plugrt", "serve", plan, "--port", str(port), "--replicas", "1",
               "--max-batch-size", "8", "--batch-wait-ms", "50"]
    process = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{base}/v2/health/ready", process)
        client = tritonclient_http.InferenceServerClient(f"127.0.0.1:{port}", concurrency=8, network_timeout=300)
        assert client.is_server_ready() and client.is_model_ready("tiny")
        meta = client.get_model_metadata("tiny")
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        rng = np.random.default_rng(3)
        batches = [rng.standard_normal((int(rng.integers(1, 4)), 4)).astype(np.float32) for _ in range(16)]

        def infer(x, binary):
            given = tritonclient_http.InferInput("x", list(x.shape), "FP32")
            given.set_data_from_numpy(x, binary_data=binary)  # Triton's binary extension, or JSON numbers
            wanted = [tritonclient_http.InferRequestedOutput("y", binary_data=binary)]
            return client.async_infer("tiny", [given], outputs=wanted)

        pending = [infer(x, k % 2 == 0) for k, x in enumerate(batches)]  # all in flight: the server batches them
        for x, request in zip(batches, pending):
            got = request.get_result().as_numpy("y")
            np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        with urllib.request.urlopen(f"{base}/v2/models/tiny/stats", timeout=30) as response:
            stats = json.loads(response.read())["model_stats"][0]
        assert stats["inference_count"] >= 16 and stats["execution_count"] < stats["inference_count"], stats
        assert stats["served_by"].startswith("pid=") and stats["device"]["id"] == 0, stats  # (the replica's GPU)

        status, body = post(f"{base}/v2/models/tiny/infer",
                            {"inputs": [{"name": "x", "shape": [2, 5], "datatype": "FP32", "data": [0.5] * 10}]})
        assert status == 400 and "input binding 'x': dim 1 must be 4, got 5" in body["error"], body
        status, body = post(f"{base}/v2/models/tiny/infer", b"{not json")
        assert status == 400 and "model 'tiny'" in body["error"], body
        status, body = post(f"{base}/v2/models/tiny/infer",
                            {"inputs": [{"name": "x", "shape": [9, 4], "datatype": "FP32", "data": [0.5] * 36}]})
        assert status == 400 and "outside the engine's profile range [1, 8]" in body["error"], body
        status, body = post(f"{base}/v2/models/other/infer", {"inputs": []})
        assert status == 404 and "serves model 'tiny'" in body["error"], body

        done = subprocess.run([sys.executable, "-m", "plugrt", "bench", plan, "--server", base, "--concurrency", "4",
                               "--duration", "240", "--iterations", "12"], capture_output=True, text=True, timeout=300)
        # (The 12 requests end it: a duration that bound it would make the count depend on the machine's speed.)
        assert done.returncode == 0, done.stderr
        assert "12 right, 0 wrong" in done.stdout, done.stdout
        assert f"answered by {stats['served_by']}: 12 responses" in done.stdout, done.stdout
        client.close()
    finally:
        left = end_session(process, process.pid)
        leftovers = processes_naming(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    assert not left and not leftovers, f"processes left behind: {left + leftovers}"
    assert process.returncode == 0, process.stderr.read().decode()[-2000:]


def test_serve_refuses_bad_arguments(tmp_path, capsys):
    from plugrt.cli import main

    plan, _ = tiny_plan(tmp_path)
    assert main(["serve", plan, "--replicas", "0"]) != 0
    assert "--replicas and --max-batch-size must be at least 1" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "missing.plan")]) != 0
    assert "missing.plan" in capsys.readouterr().err
