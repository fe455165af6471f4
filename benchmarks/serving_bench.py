"""Issue 20's GPU figures: ResNet-50 FP16 served, under many concurrent clients, beside the
same plan benchmarked in process, in one run.

ResNet-50 (torchvision, random weights) is exported with a dynamic batch and built with
``--fp16`` for batch 1..32 (opt 32). Then:

- in process: ``plugrt bench PLAN --shapes input:32x3x224x224`` (images/s, latency);
- Triton: ``plugrt export-triton --kind gpu`` served by the ``tritonserver`` of the
  nvidia-pytriton wheel (found in site-packages, e.g. installed from a carried wheel), and
- Ray Serve: ``plugrt serve --gpus-per-replica 1`` (when Ray is installed),

each load-tested by ``plugrt bench --server`` with ``--clients`` concurrent clients sending
one image per request in Triton's binary tensor format for ``--seconds``: requests/s (=
images/s), p50/p99 latency, and every response checked against the plan run in process.

    python3 benchmarks/serving_bench.py --out DIR [--clients 64] [--seconds 30] [--gpus N]

With ``--gpus N`` (issue 21, on a machine of N GPUs) the plan also runs in process on all N
at once (``plugrt bench --devices 0,..``) beside one, and Ray Serve runs N replicas of one
GPU each: the scaling of throughput, and which GPU answered (each replica names its
process and PCI bus id in a response header, counted by the load test).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runtime_bench import export_models


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, process, timeout: float = 600) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


def stop(process) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def load(plan: str, url: str, model: str, clients: int, seconds: float, out: str, label: str) -> dict:
    report = os.path.join(out, f"serving_{label}.json")
    done = subprocess.run([sys.executable, "-m", "plugrt", "bench", plan, "--server", url, "--model", model,
                           "--shapes", "input:1x3x224x224", "--concurrency", str(clients), "--duration", str(seconds),
                           "--json", report, "--force"], capture_output=True, text=True)
    if done.returncode:
        return {"failed": (done.stdout + done.stderr)[-1500:]}
    return json.load(open(report))


def tritonserver_home() -> str | None:
    for folder in sys.path:
        candidate = os.path.join(folder, "pytriton", "tritonserver")
        if os.path.exists(os.path.join(candidate, "bin", "tritonserver")):
            return candidate
    return None


def run_triton(plan: str, work: str, args) -> dict:
    home = tritonserver_home()
    if home is None:
        return {"skipped": "no tritonserver (carry the nvidia-pytriton wheel in .whl)"}
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    backends = os.path.join(work, "backends")
    os.makedirs(os.path.join(backends, "python"), exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        target = os.path.join(backends, "python", name)
        if not os.path.exists(target):
            os.symlink(os.path.join(home, "backends", "python", name), target)
    stub = os.path.join(backends, "python", "triton_python_backend_stub")
    if not os.path.exists(stub):
        os.symlink(os.path.join(home, "python_backend_stubs", version, "triton_python_backend_stub"), stub)
    for path in (os.path.join(home, "bin", "tritonserver"), os.path.realpath(stub)):
        os.chmod(path, 0o755)
    repo = os.path.join(work, "repo")
    subprocess.run([sys.executable, "-m", "plugrt", "export-triton", plan, "--repo", repo, "--name", "resnet50",
                    "--kind", "gpu", "--instances", str(args.instances), "--max-queue-delay-us", "2000"], check=True)
    http, grpc = port(), port()
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [sysconfig.get_config_var("LIBDIR"),
                                                                           os.environ.get("LD_LIBRARY_PATH")])))
    log = open(os.path.join(args.out, "tritonserver.log"), "wb")
    process = subprocess.Popen([os.path.join(home, "bin", "tritonserver"), f"--model-repository={repo}",
                                f"--backend-directory={backends}", "--http-address=127.0.0.1", f"--http-port={http}",
                                "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--allow-metrics=false"],
                               env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        if not wait(f"http://127.0.0.1:{http}/v2/health/ready", process):
            return {"failed": "tritonserver did not get ready (see tritonserver.log)"}
        return load(plan, f"http://127.0.0.1:{http}", "resnet50", args.clients, args.seconds, args.out, "triton")
    finally:
        stop(process)


def in_process(plan: str, out: str, label: str, devices: str) -> dict:
    """``plugrt bench`` of the plan at batch 32 on ``devices`` (two contexts on each)."""
    report = os.path.join(out, f"serving_inprocess_{label}.json")
    done = subprocess.run([sys.executable, "-m", "plugrt", "bench", plan, "--shapes", "input:32x3x224x224",
                           "--duration", "10", "--streams", "2", "--devices", devices, "--json", report, "--force",
                           "--no-progress"], capture_output=True, text=True)
    return json.load(open(report)) if not done.returncode else {"failed": done.stderr[-1500:]}


def run_ray(plan: str, args) -> dict:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return {"skipped": "Ray is not installed here"}
    http = port()
    process = subprocess.Popen([sys.executable, "-m", "plugrt", "serve", plan, "--name", "resnet50", "--port", str(http),
                                "--replicas", str(args.gpus), "--gpus-per-replica", "1", "--max-batch-size", "32", "--batch-wait-ms", "2"],
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    try:
        if not wait(f"http://127.0.0.1:{http}/v2/health/ready", process):
            return {"failed": "plugrt serve did not get ready"}
        return load(plan, f"http://127.0.0.1:{http}", "resnet50", args.clients, args.seconds, args.out, "ray")
    finally:
        stop(process)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gpu-results")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--servers", default="triton,ray")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs to spread over (in process and Ray replicas)")
    parser.add_argument("--work", default="", help="a folder kept between runs: a plan built there before is "
                        "served again (one call builds and measures in process, the next serves)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="plugrt-serving-")
    os.makedirs(work, exist_ok=True)
    plan = os.path.join(work, "resnet50.plan")
    if not os.path.exists(plan):
        model = export_models(work, ["resnet50"])["resnet50"]
        subprocess.run([sys.executable, "-m", "plugrt", "build", model["onnx"], "-o", plan, "--fp16", "--no-progress",
                        "--optimization-level", "2", "--min-shapes", "input:1x3x224x224", "--opt-shapes",
                        "input:32x3x224x224", "--max-shapes", "input:32x3x224x224"], check=True,
                       env=dict(os.environ, **({"PLUGRT_KERNEL_CACHE": os.environ["PLUGRT_BENCH_KERNEL_CACHE"]}
                                               if os.environ.get("PLUGRT_BENCH_KERNEL_CACHE") else {})))
    report = {"in_process": in_process(plan, args.out, "1gpu", "0")}
    if args.gpus > 1:
        report["in_process_all"] = in_process(plan, args.out, f"{args.gpus}gpu", ",".join(map(str, range(args.gpus))))
    if "triton" in args.servers:
        report["triton"] = run_triton(plan, work, args)
    if "ray" in args.servers:
        report["ray"] = run_ray(plan, args)
    with open(os.path.join(args.out, "serving_bench.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"\n== ResNet-50 FP16 served ({args.clients} clients, 1 image a request) ==")
    for key in ("in_process", "in_process_all"):
        inner = report.get(key)
        if inner is None or "failed" in inner:
            print(f"{key}: {inner}")
            continue
        print(f"{key} (batch 32, devices {[d['id'] for d in inner['devices']]}): "
              f"{inner['throughput']['inferences_per_s']:.0f} images/s, median latency "
              f"{inner['latency_ms']['median']:.3f} ms, p99 {inner['latency_ms']['p99']:.3f} ms; " +
              "; ".join(f"GPU {d['id']} {d['pci_bus_id']} {d['inferences_per_s']:.0f}/s" for d in inner["devices"]))
    if "throughput" in report.get("in_process_all", {}) and "throughput" in report["in_process"]:
        print(f"scaling on {args.gpus} GPUs: {report['in_process_all']['throughput']['inferences_per_s'] / report['in_process']['throughput']['inferences_per_s']:.2f}x one")
    for label in ("triton", "ray"):
        entry = report.get(label)
        if entry is None:
            continue
        if "requests" in entry:
            lat = entry["latency_ms"]
            print(f"{label}: {entry['throughput_rps']:.0f} images/s, p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, "
                  f"{entry['failed']} wrong of {entry['requests']}; answered by {entry.get('served_by') or '-'}")
        else:
            print(f"{label}: {entry}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
