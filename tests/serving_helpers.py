"""What the serving tests share: a tiny batchable model and its plan, free loopback ports,
waiting for a server, and the processes a server leaves behind."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile


def tiny_model(seed: int = 7):
    """y = Relu(x @ W + b) over a dynamic batch; W and b random."""
    rng = np.random.default_rng(seed)
    w, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                              initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tiny_plan(folder, name: str = "tiny") -> tuple[str, object]:
    model = tiny_model()
    config = BuilderConfig(progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 4), (2, 4), (8, 4)))
    path = os.path.join(str(folder), f"{name}.plan")
    Builder().build_engine(model, config).save(path)
    return path, model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process, timeout: float = 180.0) -> None:
    """Poll ``url`` until it answers 200; fail if the process ends or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server ended (status {process.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not ready after {timeout} s")


def post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def session_processes(sid: int) -> list[str]:
    """The live processes of session ``sid`` (a server started with start_new_session)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found.append(f.read().replace(b"\0", b" ").decode(errors="replace")[:120])
        except (OSError, IndexError, ValueError):
            continue
    return found


def end_session(process, sid: int, grace: float = 60.0) -> list[str]:
    """SIGTERM the server, wait for it; what is left of its session after ``grace``
    seconds (then killed, so that no test leaves a process behind)."""
    import signal

    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except Exception:  # noqa: BLE001 - it did not end: killed below, and reported
        pass
    deadline = time.monotonic() + 15
    left = session_processes(sid)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = session_processes(sid)
    if left or process.poll() is None:
        try:
            os.killpg(sid, signal.SIGKILL)
        except OSError:
            pass
    return left


def processes_naming(text: str) -> list[str]:
    """The live processes whose command line contains ``text`` (a server's scratch folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    line = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in line:
                found.append(line[:120])
    return found
