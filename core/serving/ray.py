"""A plan behind Ray Serve, speaking KServe v2 over HTTP (``plugrt serve``).

:func:`deployment` makes the application: ``replicas`` replicas, each loading the plan once
(from a path every node can read) with one execution context, its CUDA graphs and a
:class:`plugrt.serving.batching.Batcher`; ``@serve.batch`` gathers up to ``max_batch_size``
requests (waiting at most ``batch_wait_ms``), which run off the event loop. Routes (the
Open Inference Protocol's): ``GET /v2/health/live`` and ``/v2/health/ready``, ``GET
/v2/models/NAME`` (metadata) and ``/v2/models/NAME/ready``, ``POST /v2/models/NAME/infer``,
and ``GET /v2/models/NAME/stats`` (inference and execution counts, as Triton's). A bad
request gets 400 with ``{"error": message}``, an unknown route 404.

Several machines are Ray's business: ``ray start --head`` on one, ``ray start --address
HEAD:6379`` on the others, then ``plugrt serve PLAN --address auto`` (or ``serve deploy``
of a config whose ``import_path`` names an application built by :func:`deployment`).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

#: Environment the replicas need (kept from the caller's): the simulator switch, plugrt's
#: kernel cache, the import path. (Not CUDA_VISIBLE_DEVICES: Ray gives each replica its GPUs.)
PASSED_ENV = ("NUMBA_ENABLE_CUDASIM", "PLUGRT_KERNEL_CACHE", "PYTHONPATH")


def deployment(plan: str, name: str | None = None, replicas: int = 1, gpus_per_replica: float = 0.0,
               cpus_per_replica: float = 1.0, max_batch_size: int = 32, batch_wait_ms: float = 2.0,
               profile: int = 0):
    """The Ray Serve application serving ``plan`` as model ``name`` (default: the plan's
    file stem); bind it with ``serve.run(app, route_prefix="/")``."""
    from ray import serve
    from starlette.responses import JSONResponse

    plan = str(Path(plan).resolve())
    name = name or Path(plan).stem
    env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
    options = {"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica, "runtime_env": {"env_vars": env}}

    @serve.deployment(name=name, num_replicas=int(replicas), ray_actor_options=options,
                      max_ongoing_requests=max(2 * int(max_batch_size), 8))
    class PlanReplica:
        def __init__(self):
            from plugrt.device import identify
            from plugrt.engine import Engine
            from plugrt.serving.batching import Batcher
            from plugrt.serving import kserve

            self.kserve = kserve
            self.engine = Engine.load(plan)
            self.context = self.engine.create_execution_context(profile=profile)
            self.batcher = Batcher(self.context)
            self.inputs = {n: (self.engine.graph.info(n).dtype, len(self.engine.graph.info(n).shape))
                           for n in self.engine.graph.inputs}
            self.metadata = kserve.metadata(name, self.engine)
            #: Where this replica runs (each replica sees the GPU Ray gave it as device 0:
            #: the PCI bus id tells them apart), sent with every response.
            self.device = identify()
            self.served_by = served_by(self.device)

        async def __call__(self, request):
            path, method = request.url.path.rstrip("/"), request.method
            model = f"/v2/models/{name}"
            if method == "GET" and path in ("/v2/health/live", "/v2/health/ready", f"{model}/ready"):
                return JSONResponse({"live": True, "ready": True})
            if method == "GET" and path in (model, f"{model}/versions/1"):
                return JSONResponse(self.metadata)
            if method == "GET" and path == f"{model}/stats":
                return JSONResponse({"model_stats": [{"name": name, "version": "1", **self.batcher.stats.as_json(),
                                                      "served_by": self.served_by, "device": self.device}]})
            if method == "POST" and path in (f"{model}/infer", f"{model}/versions/1/infer"):
                return await self._infer(request)
            return JSONResponse({"error": f"no route {method} {path}; this server serves model {name!r} under "
                                          f"{model}"}, status_code=404)

        async def _infer(self, request):
            from starlette.responses import Response

            header = request.headers.get("inference-header-content-length")
            try:
                body, binary = self.kserve.parse(await request.body(), header)
                feeds, wanted = self.kserve.decode_request(body, self.inputs, binary)
            except self.kserve.RequestError as exc:
                return JSONResponse({"error": f"model {name!r}: {exc}"}, status_code=400)
            outputs = await self.infer(feeds)
            if isinstance(outputs, Exception):
                return JSONResponse({"error": f"model {name!r}: {outputs}"}, status_code=400)
            try:
                payload, length = self.kserve.encode_response(name, outputs, wanted, body.get("id"),
                                                              self.kserve.binary_outputs(body))
            except self.kserve.RequestError as exc:
                return JSONResponse({"error": f"model {name!r}: {exc}"}, status_code=400)
            headers = {self.kserve.SERVED_BY: self.served_by}
            if length is not None:
                headers["Inference-Header-Content-Length"] = str(length)
            media = "application/octet-stream" if length is not None else "application/json"
            return Response(payload, media_type=media, headers=headers)

        @serve.batch(max_batch_size=int(max_batch_size), batch_wait_timeout_s=float(batch_wait_ms) / 1e3)
        async def infer(self, requests: list[dict]) -> list:
            return await asyncio.to_thread(self.batcher.run, requests)

    return PlanReplica.bind()


def served_by(device: dict) -> str:
    """``pid=P device=D pci=BUS`` for a replica process on ``device`` (:func:`plugrt.device.identify`)."""
    return f"pid={os.getpid()} device={device['id']} pci={device['pci_bus_id']}"


def serve_forever(plan: str, name: str | None, replicas: int, gpus_per_replica: float, max_batch_size: int,
                  batch_wait_ms: float, host: str, port: int, address: str | None = None, ready=print) -> None:
    """Start Ray (or join the cluster at ``address``), run the application, call
    ``ready(url)``, and serve until SIGINT or SIGTERM; then shut Serve and Ray down."""
    import signal
    import threading

    import ray
    from ray import serve

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    stop = threading.Event()
    ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    for number in (signal.SIGINT, signal.SIGTERM):  # (after Ray's own handlers: a clean shutdown instead)
        signal.signal(number, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": int(port)})
        app = deployment(plan, name, replicas, gpus_per_replica, max_batch_size=max_batch_size,
                         batch_wait_ms=batch_wait_ms, cpus_per_replica=0.5 if not gpus_per_replica else 1.0)
        serve.run(app, name=name or Path(plan).stem, route_prefix="/")
        ready(f"http://{host}:{port}/v2/models/{name or Path(plan).stem}")
        while not stop.wait(0.5):
            pass
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


__all__ = ["deployment", "serve_forever", "served_by"]
