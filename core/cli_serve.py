"""``plugrt serve PLAN`` (Ray Serve, :mod:`plugrt.serving.ray`) and ``plugrt export-triton
PLAN --repo DIR`` (a Triton model repository, :mod:`plugrt.serving.triton`)."""

from __future__ import annotations

from plugrt.errors import PlugrtError
from plugrt.paths import check_plan_input


def add_serve_commands(commands) -> None:
    serve = commands.add_parser(
        "serve", help="serve a plan over HTTP (KServe v2) with Ray Serve",
        description="Start Ray (or join a cluster with --address) and serve the plan as a KServe v2 / Open Inference "
                    "Protocol model: GET /v2/health/ready, GET /v2/models/NAME, POST /v2/models/NAME/infer (JSON "
                    "tensors). Each replica loads the plan once; requests are batched up to --max-batch-size. "
                    "Runs until interrupted (SIGINT or SIGTERM), then shuts Serve and Ray down.")
    serve.add_argument("plan", metavar="PLAN")
    serve.add_argument("--name", help="the model's name (default: the plan's file stem)")
    serve.add_argument("--replicas", type=int, default=1, metavar="N", help="replicas, each with its own engine")
    serve.add_argument("--gpus-per-replica", type=float, default=0.0, metavar="G",
                       help="GPUs Ray gives each replica (1 on a GPU machine: one replica per GPU; default 0)")
    serve.add_argument("--max-batch-size", type=int, default=32, metavar="B",
                       help="requests batched together at most (the engine runs at most its profile's max batch)")
    serve.add_argument("--batch-wait-ms", type=float, default=2.0, metavar="MS",
                       help="how long a batch waits for more requests (default 2)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--address", help="a running Ray cluster to join (e.g. auto), instead of starting one")
    serve.set_defaults(handler=cmd_serve)

    triton = commands.add_parser(
        "export-triton", help="write a Triton Inference Server model repository (Python backend) for a plan",
        description="Write REPO/NAME/config.pbtxt (bindings, max_batch_size and dynamic batching from the profile, "
                    "the instance group) and REPO/NAME/1/model.py with a copy of the plan beside it. Start "
                    "tritonserver --model-repository REPO with plugrt importable by its Python backend.")
    triton.add_argument("plan", metavar="PLAN")
    triton.add_argument("--repo", required=True, metavar="DIR", help="the model repository (created if missing)")
    triton.add_argument("--name", help="the model's name (default: the plan's file stem)")
    triton.add_argument("--instances", type=int, default=1, metavar="N", help="model instances (default 1)")
    triton.add_argument("--max-queue-delay-us", type=int, default=100, metavar="US",
                        help="how long Triton's dynamic batcher waits for more requests (default 100)")
    triton.add_argument("--kind", choices=("gpu", "cpu"), default="gpu", help="instance kind (default gpu)")
    triton.add_argument("--profile", type=int, default=0, metavar="N", help="the optimization profile to serve")
    triton.set_defaults(handler=cmd_export_triton)


def cmd_serve(args) -> int:
    import sys

    check_plan_input(args.plan, "PLAN")
    if args.replicas < 1 or args.max_batch_size < 1 or args.batch_wait_ms < 0 or args.gpus_per_replica < 0:
        raise PlugrtError("--replicas and --max-batch-size must be at least 1, --batch-wait-ms and "
                          "--gpus-per-replica at least 0")
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise PlugrtError("plugrt serve needs Ray Serve: pip install 'plugrt[serve]'")
    from plugrt.serving.ray import serve_forever

    serve_forever(args.plan, args.name, args.replicas, args.gpus_per_replica, args.max_batch_size, args.batch_wait_ms,
                  args.host, args.port, args.address,
                  ready=lambda url: print(f"serving {args.plan} at {url}", file=sys.stderr, flush=True))
    return 0


def cmd_export_triton(args) -> int:
    from plugrt.serving.triton import export

    check_plan_input(args.plan, "PLAN")
    folder = export(args.plan, args.repo, args.name, args.instances, args.kind, args.max_queue_delay_us, args.profile)
    print(f"wrote {folder}/config.pbtxt and {folder}/1/model.py (with {folder}/1/model.plan)")
    return 0
