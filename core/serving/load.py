"""A load test of a KServe v2 server (Triton, ``plugrt serve``): ``plugrt bench PLAN
--server URL``.

Concurrent clients (one thread and one keep-alive HTTP connection each, on loopback or the
address given) send inference requests for a bounded time and a bounded count, cycling
through a few inputs drawn at the plan's shapes; the plan runs each of those inputs once in
process first, and every response is checked against that result (names, shapes, dtypes,
values within a tolerance that covers another batch's kernels). Reported: requests/s,
latency percentiles, failures with the first message.
"""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

import numpy as np

from plugrt.errors import PlugrtError
from plugrt.serving import kserve

#: Distinct inputs the clients cycle through.
DISTINCT = 4
#: A response matches the in-process result when its largest difference is at most this
#: much of the result's largest magnitude (another batch may run other tactics).
TOLERANCE = 1e-3


def load_test(url: str, model: str, feeds: list[dict], expected: list[dict], concurrency: int = 8,
              duration: float = 10.0, max_requests: int = 100_000, timeout: float = 60.0, binary: bool = True) -> dict:
    """Run the clients (``binary``: tensors in Triton's binary extension, as tritonclient
    sends them, else JSON numbers); a report (JSON-safe)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise PlugrtError(f"--server {url!r}: give an http://HOST:PORT address")
    bodies = [kserve.encode_request(f, binary) for f in feeds]
    path = f"/v2/models/{model}/infer"
    latencies: list[float] = []
    failures: list[str] = []
    served: dict[str, int] = {}
    budget = [int(max_requests)]
    lock = threading.Lock()
    deadline = time.perf_counter() + float(duration)

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
        k = index
        try:
            while time.perf_counter() < deadline:
                with lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                which = k % len(bodies)
                k += 1
                started = time.perf_counter()
                problem, by = _one(connection, path, bodies[which], expected[which])
                elapsed = (time.perf_counter() - started) * 1e3
                with lock:
                    latencies.append(elapsed)
                    if by is not None:
                        served[by] = served.get(by, 0) + 1
                    if problem:
                        failures.append(problem)
                if problem and "connection" in problem:
                    connection.close()
                    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
        finally:
            connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(int(concurrency))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    ordered = np.sort(np.array(latencies)) if latencies else np.zeros(1)
    return {"url": url, "model": model, "concurrency": int(concurrency), "binary": bool(binary), "seconds": round(wall, 3),
            "requests": len(latencies), "failed": len(failures), "first_failure": failures[0] if failures else None,
            "throughput_rps": len(latencies) / wall if wall > 0 else 0.0,
            "served_by": dict(sorted(served.items())),
            "latency_ms": {"mean": float(ordered.mean()), "p50": float(np.percentile(ordered, 50)),
                           "p90": float(np.percentile(ordered, 90)), "p99": float(np.percentile(ordered, 99)),
                           "max": float(ordered.max())}}


def _one(connection, path: str, request: tuple[bytes, int | None], expected: dict) -> tuple[str | None, str | None]:
    """Send one request: what is wrong with its answer (or ``None``), and the replica that
    answered where the server says (``plugrt serve``'s :data:`plugrt.serving.kserve.SERVED_BY` header)."""
    body, length = request
    headers = {"Content-Type": "application/json" if length is None else "application/octet-stream"}
    if length is not None:
        headers["Inference-Header-Content-Length"] = str(length)
    try:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:
        return f"connection: {type(exc).__name__}: {exc}", None
    by = response.getheader(kserve.SERVED_BY)
    if response.status != 200:
        return f"HTTP {response.status}: {data[:300].decode('utf-8', 'replace')}", by
    try:
        outputs = kserve.decode_response(data, response.getheader("Inference-Header-Content-Length"))
    except (ValueError, KeyError, TypeError, kserve.RequestError) as exc:
        return f"not a v2 response ({type(exc).__name__}: {exc})", by
    for name, want in expected.items():
        got = outputs.get(name)
        if got is None or got.shape != want.shape or got.dtype != want.dtype:
            return (f"output {name!r}: {None if got is None else f'{got.dtype}{list(got.shape)}'}, "
                    f"expected {want.dtype}{list(want.shape)}"), by
        scale = float(np.max(np.abs(want.astype(np.float64)), initial=0.0))
        error = float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))
        if not error <= TOLERANCE * scale + 1e-6:
            return f"output {name!r}: off by {error:.3g} (largest value {scale:.3g})", by
    return None, by


def reference_inputs(engine, shapes: dict, profile: int = 0) -> tuple[list[dict], list[dict]]:
    """:data:`DISTINCT` random feeds at ``shapes`` and the plan's outputs for each, in process."""
    from plugrt.bench import random_feeds

    feeds = [random_feeds(engine, shapes, seed=seed, profile=profile) for seed in range(DISTINCT)]
    with engine.create_execution_context(profile=profile) as context:
        expected = [context.execute(f) for f in feeds]
    return feeds, expected


__all__ = ["load_test", "reference_inputs", "DISTINCT", "TOLERANCE"]
