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
    config = BuilderConfig(progress=False, tf32=False)  # (the tests compare with onnxruntime at FP32 tolerances)
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


#: The Triton server the tests run: the one inside NVIDIA's nvidia-pytriton wheel (PyPI has
#: no tritonserver package), unpacked once into this folder.
PYTRITON = "nvidia-pytriton==0.7.0"
TRITON_HOME = os.path.expanduser(os.environ.get("PLUGRT_TRITON_HOME", "~/.cache/plugrt-tests/pytriton-0.7.0"))


def tritonserver() -> tuple[str, str]:
    """``(tritonserver binary, backend directory)``, unpacked from the wheel on first use
    (``pip download``); the Python backend's folder gets the stub for this Python."""
    import subprocess
    import sys
    import zipfile

    import pytest

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    root = os.path.join(TRITON_HOME, "pytriton", "tritonserver")
    binary, backends = os.path.join(root, "bin", "tritonserver"), os.path.join(root, "backends")
    stub = os.path.join(backends, "python", "triton_python_backend_stub")
    if not os.path.exists(stub):
        wheels = os.path.join(TRITON_HOME, "wheel")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", PYTRITON, "-d", wheels],
                              capture_output=True, text=True, timeout=600)
        found = [f for f in os.listdir(wheels) if f.endswith(".whl")] if os.path.isdir(wheels) else []
        if done.returncode or not found:
            pytest.skip(f"could not download {PYTRITON} for its tritonserver: {done.stderr.strip()[-300:]}")
        with zipfile.ZipFile(os.path.join(wheels, found[0])) as wheel:
            for member in wheel.namelist():
                if member.startswith(("pytriton/tritonserver/", "nvidia_pytriton.libs/")):
                    wheel.extract(member, TRITON_HOME)
        source = os.path.join(root, "python_backend_stubs", version, "triton_python_backend_stub")
        if not os.path.exists(source):
            pytest.skip(f"{PYTRITON} has no Python backend stub for Python {version}")
        import shutil

        shutil.copyfile(source, stub + ".tmp")
        os.chmod(stub + ".tmp", 0o755)
        os.chmod(binary, 0o755)
        os.replace(stub + ".tmp", stub)
    return binary, backends


def triton_env(extra: dict | None = None) -> dict:
    """The environment tritonserver runs with: the Python backend's stub must find this
    Python's libpython (not the system's); the exported model.py finds plugrt itself."""
    import sys
    import sysconfig

    libdir = sysconfig.get_config_var("LIBDIR") or os.path.join(sys.base_prefix, "lib")
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [libdir, os.environ.get("LD_LIBRARY_PATH")])))
    env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env
