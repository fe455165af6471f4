"""``plugrt bench PLAN|MODEL.onnx``: trtexec's measurement loop (:mod:`plugrt.bench`) on a
plan, or on a model built first with ``plugrt build``'s flags (:mod:`plugrt.cli_options`)."""

from __future__ import annotations

import json
import math
import sys

from plugrt.cli_options import add_build_options, build_engine, check_timing_cache, given_build_options, parse_shapes
from plugrt.errors import PlugrtError
from plugrt.files import write_atomically
from plugrt.paths import ONNX, PLAN, check_distinct, check_input, check_output, with_article

#: What :func:`plugrt.paths.file_kind` calls a JSON file that is no timing cache: ``--json``'s kind.
JSON_REPORT = "a JSON file"
#: Layers ``--dump-profile`` prints (the slowest).
PROFILE_ROWS = 25


def add_bench_command(commands) -> None:
    """Register ``plugrt bench`` on the CLI's subparsers."""
    bench = commands.add_parser(
        "bench", help="measure a plan's (or a model's) latency and throughput, trtexec-style",
        description="Run an engine on random inputs and report latency (min/mean/median/p90/p99/max), throughput, "
                    "GPU compute time (CUDA events) against host enqueue time, H2D and D2H copy times. A model is "
                    "built first with the options of `plugrt build`. Each stream runs one untimed query "
                    "(specializing its context and capturing its CUDA graph), the warmup queries, then timed "
                    "queries until it has run --iterations and --duration has passed (both, as trtexec does). "
                    "A query is H2D copies, compute, D2H copies, then a wait for the stream. Throughput is in "
                    "queries/s and inferences/s (batch, dim 0 of the first input, x queries / wall seconds). In "
                    "the CUDA simulator every time is a host time and the numbers are meaningless.")
    bench.add_argument("target", metavar="PLAN|MODEL", help="a .plan file, or an .onnx model to build first")
    bench.add_argument("--shapes", default="", metavar="NAME:DxDx..,...",
                       help="the input shapes to run, e.g. input:8x3x224x224 (default: the profile's opt shapes); "
                            "for a model, also the build's opt shapes of the inputs --opt-shapes does not name; "
                            "several sets separated by ';' make a mix: each stream's queries cycle through them")
    bench.add_argument("--profile", type=int, default=0, metavar="N",
                       help="the optimization profile to run (an engine built with several; default 0)")
    bench.add_argument("--warmup", metavar="N", help="untimed queries per stream before timing: a count of "
                                                     "queries, not trtexec's milliseconds (default 10; 1 simulated)")
    bench.add_argument("--iterations", metavar="N", help="at least N timed queries per stream (default 10; 3 simulated)")
    bench.add_argument("--duration", metavar="S", help="and at least S seconds of timing: each stream stops when both "
                                                       "minimums are met (default 3; 0 simulated: exactly N queries)")
    bench.add_argument("--streams", metavar="N", default="1",
                       help="N execution contexts, one thread and CUDA stream each, run concurrently; throughput "
                            "is their total (default 1)")
    bench.add_argument("--devices", metavar="ID,ID,..",
                       help="run on these GPUs at once (data parallel): the plan loaded once, its weights uploaded "
                            "to each, --streams contexts on each; throughput is their total, and each device's "
                            "name, PCI bus id and share are reported (default: the current device)")
    bench.add_argument("--no-cuda-graph", action="store_true", help="launch kernels directly, no CUDA graph replay")
    bench.add_argument("--no-data-transfers", action="store_true",
                       help="inputs copied in once from device arrays, outputs left on the device: time the compute")
    bench.add_argument("--dump-profile", action="store_true",
                       help="after the timed queries, a separate profiling run: each layer's median GPU time (CUDA "
                            "events between layers, direct launches), its kernels and blocks; prints the slowest "
                            f"{PROFILE_ROWS} layers (--json has them all)")
    bench.add_argument("--server", metavar="URL",
                       help="load-test a KServe v2 server (Triton, plugrt serve) serving this plan instead: "
                            "--concurrency clients for --duration seconds (and at most --iterations requests in "
                            "all), each response checked against the plan run here")
    bench.add_argument("--model", metavar="NAME", help="the model's name on --server (default: the plan's file stem)")
    bench.add_argument("--concurrency", metavar="N", default="8", help="concurrent clients for --server (default 8)")
    bench.add_argument("--json", metavar="FILE", help="also write the results to this JSON file")
    add_build_options(bench.add_argument_group("build options (for a model; --no-progress, -v and --force apply "
                                               "to any bench)"))
    bench.set_defaults(handler=cmd_bench)


def cmd_bench(args) -> int:
    from plugrt.bench import resolve_shapes, run_benchmark
    from plugrt.device import announce_once
    from plugrt.tuning.tuner import Progress

    is_plan = _check_target(args)
    inputs = {"PLAN|MODEL": args.target, "--timing-cache": args.timing_cache}
    if args.json is not None:
        check_output(args.json, "--json", JSON_REPORT, inputs, args.force)
        check_distinct({"--json": args.json, "--timing-cache": args.timing_cache})
    settings = {"warmup": _count(args.warmup, "--warmup", 0), "iterations": _count(args.iterations, "--iterations", 1),
                "duration": _seconds(args.duration, "--duration"), "streams": _count(args.streams, "--streams", 1)}
    mix = [parse_shapes(part, "--shapes") for part in args.shapes.split(";")]
    shapes = mix[0]
    devices = _devices(args.devices) if args.devices is not None else None
    if devices is not None and args.server is not None:
        raise PlugrtError("--devices and --server: a load test runs the plan on the server's GPUs; leave --devices out")
    announce_once()
    engine = _engine(args, is_plan, shapes)
    mix = [resolve_shapes(engine, one, "--shapes", args.profile) for one in mix]
    shapes = mix[0]
    if args.server is not None:
        return _load_test(args, engine, shapes, settings)
    progress = Progress(sys.stderr, not args.no_progress)
    try:
        result = run_benchmark(engine, shapes, use_cuda_graph=not args.no_cuda_graph,
                               data_transfers=not args.no_data_transfers, progress=progress.show,
                               profile=args.profile, mix=mix if len(mix) > 1 else None, devices=devices, **settings)
    finally:
        progress.finish()
    report = {"target": args.target, "built": not is_plan, **result.as_json()}
    report["settings"]["profile"] = args.profile
    print_report(args.target, report)
    if args.dump_profile:
        from plugrt.bench import random_feeds
        from plugrt.layer_profile import print_profile, profile_json, profile_layers

        report["profile"] = profile_json(profile_layers(engine, random_feeds(engine, shapes, 0, args.profile),
                                                        profile=args.profile))
        print_profile(report["profile"], PROFILE_ROWS)
    if args.json is not None:
        write_atomically(args.json, (json.dumps(report, indent=2) + "\n").encode())
    return 0


def _load_test(args, engine, shapes: dict, settings: dict) -> int:
    """``--server``: the load test (:mod:`plugrt.serving.load`); non-zero when a response failed."""
    import os

    from plugrt.serving.load import load_test, reference_inputs

    model = args.model or os.path.splitext(os.path.basename(args.target))[0]
    feeds, expected = reference_inputs(engine, shapes, args.profile)
    report = load_test(args.server, model, feeds, expected, _count(args.concurrency, "--concurrency", 1),
                       settings["duration"] if settings["duration"] is not None else 10.0,
                       settings["iterations"] if settings["iterations"] is not None else 100_000)
    latency = report["latency_ms"]
    print(f"load test {args.server} model {model!r}: {report['concurrency']} clients, {report['requests']} requests "
          f"in {report['seconds']:.2f} s: {report['throughput_rps']:.1f} requests/s")
    print("latency  " + "  ".join(f"{k} {latency[k]:.3f}" for k in ("mean", "p50", "p90", "p99", "max")) + " ms")
    print(f"responses checked against the plan run here: {report['requests'] - report['failed']} right, "
          f"{report['failed']} wrong{': ' + report['first_failure'] if report['failed'] else ''}")
    for by, count in report.get("served_by", {}).items():
        print(f"answered by {by}: {count} responses")
    if args.json is not None:
        write_atomically(args.json, (json.dumps(report, indent=2) + "\n").encode())
    if report["failed"] or not report["requests"]:
        raise PlugrtError(f"--server {args.server}: {report['failed']} of {report['requests']} responses were wrong"
                          f"{': ' + report['first_failure'] if report['failed'] else ''}")
    return 0


def _check_target(args) -> bool:
    """Whether the target is a plan (else a model to build); refuses build flags for a plan."""
    kind = check_input(args.target, "PLAN|MODEL")
    if kind == PLAN:
        given = given_build_options(args)
        if given:
            raise PlugrtError(f"{', '.join(given)}: build options, but PLAN|MODEL {args.target!r} is a plan, built "
                              "already; leave them out, or bench the .onnx model")
        return True
    if kind not in (ONNX, "binary data", "a text file"):
        raise PlugrtError(f"PLAN|MODEL {args.target!r} is {with_article(kind)}; name a plan file or an .onnx model")
    if args.timing_cache:
        check_timing_cache(args.timing_cache, {"PLAN|MODEL": args.target}, args.force)
    return False


def _engine(args, is_plan: bool, shapes: dict):
    from plugrt.engine import Engine
    from plugrt.onnx.importer import import_model

    if is_plan:
        return Engine.load(args.target)
    graph = import_model(args.target)
    for name, shape in shapes.items():
        if name not in graph.inputs:
            raise PlugrtError(f"--shapes: {name!r} is not an input of {args.target!r}; the inputs are "
                              f"{', '.join(map(repr, graph.inputs))}")
        model_shape = graph.info(name).shape
        if len(shape) != len(model_shape) or any(isinstance(d, int) and d != s for d, s in zip(model_shape, shape)):
            raise PlugrtError(f"--shapes {name}:{'x'.join(map(str, shape))}: input {name!r} of the model has shape "
                              f"{list(model_shape)}; give a shape of that rank with its fixed dims")
    return build_engine(args, graph, shapes)


def _devices(text: str) -> list[int]:
    """``--devices 0,1``: the ids, checked against the GPUs this process sees."""
    from plugrt.device import check_devices

    ids = []
    for part in text.split(","):
        try:
            ids.append(int(part.strip()))
        except ValueError:
            raise PlugrtError(f"--devices {text!r}: {part.strip()!r} is not a device id; give ids separated by "
                              "commas, e.g. --devices 0,1") from None
    try:
        return check_devices(ids)
    except PlugrtError as exc:
        raise PlugrtError(f"--devices {text}: {exc}") from None


def _count(text: str | None, flag: str, low: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise PlugrtError(f"{flag} {text!r} is not a whole number; give e.g. {flag} {max(low, 10)}") from None
    if value < low:
        raise PlugrtError(f"{flag} {value} is less than {low}; give a whole number >= {low}")
    return value


def _seconds(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise PlugrtError(f"{flag} {text!r} is not a number of seconds; give e.g. {flag} 3") from None
    if not math.isfinite(value) or value < 0:
        raise PlugrtError(f"{flag} {text!r}: give a finite number of seconds >= 0")
    return value


_ROWS = (("latency", "latency_ms", "per query, H2D + compute + D2H"), ("GPU compute", "gpu_compute_ms", ""),
         ("host enqueue", "host_enqueue_ms", "perf_counter around enqueue"), ("H2D", "h2d_ms", ""),
         ("D2H", "d2h_ms", ""), ("host walltime", "host_walltime_ms", "per query, until the stream is done"))


def print_report(target: str, report: dict) -> None:
    """The human-readable summary of a bench report (:meth:`BenchResult.as_json` and more)."""
    settings = report["settings"]
    shapes = " | ".join(", ".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in one.items())
                        for one in settings.get("mix") or [settings["shapes"]])
    print(f"bench {target}{' (built)' if report['built'] else ''}: shapes {shapes or '(none)'}; "
          f"{settings['streams']} stream(s); CUDA graph {'on' if settings['use_cuda_graph'] else 'off'}; "
          f"data transfers {'on' if settings['data_transfers'] else 'off'}")
    print(f"queries: {report['queries']} timed ({'+'.join(map(str, report['queries_per_stream']))} per stream) "
          f"after {settings['warmup']} warmup each; total host walltime {report['walltime_s']:.3f} s")
    print(f"timing: {report['timing']}")
    throughput = report["throughput"]
    print(f"throughput: {throughput['queries_per_s']:.2f} queries/s, {throughput['inferences_per_s']:.2f} inferences/s "
          f"(batch {throughput['batch']} = dim 0 of the first input{', the first set' if settings.get('mix') else ''}"
          f"{'; inferences count each set' + chr(39) + 's own' if settings.get('mix') else ''}, x queries / wall s)")
    for device in report.get("devices") or []:
        print(f"device {device['id']} ({device['name']}, PCI {device['pci_bus_id']}): {device['contexts']} "
              f"context(s), {device['queries']} queries, {device['inferences_per_s']:.2f} inferences/s")
    if not report.get("simulator", False):
        print(f"kernels compiled while running: {report.get('kernels_compiled', 0)}")
    for label, key, note in _ROWS:
        stats = report[key]
        if key == "latency_ms" and not settings["data_transfers"]:
            note = "per query, the compute alone"
        if stats is None:
            print(f"{label:14s} -  (no data transfers)")
            continue
        values = "  ".join(f"{name} {stats[name]:.4f}" for name in ("min", "mean", "median", "p90", "p99", "max"))
        print(f"{label:14s} {values} ms{f'  ({note})' if note else ''}")
