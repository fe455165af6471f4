"""The ``plugrt`` command line.

Every :class:`PlugrtError` becomes one ``plugrt: error: ...`` message on stderr and exit
status 2; no traceback for user errors. Every file a command names is checked before the
work starts (:mod:`plugrt.paths`): no command overwrites its own input, or without
``--force`` a file of another kind. Output piped into a reader that stops early (``| head``)
ends the command quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from plugrt import API_VERSION, __version__
from plugrt.cli_bench import add_bench_command
from plugrt.cli_serve import add_serve_commands
from plugrt.cli_options import (FORCE_HELP, add_build_options, add_profile, add_shape_options, build_engine,
                                check_timing_cache, kernel_report, precision_report)
from plugrt.errors import PlugrtError
from plugrt.files import write_atomically
from plugrt.paths import (NPZ, PLAN, TIMING_CACHE, check_distinct, check_input, check_model_input, check_new_folder,
                          check_output, check_plan_input)

EXIT_USER_ERROR = 2
EXIT_UNSUPPORTED = 1
#: A shell's status for a command whose reader closed the pipe (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    try:
        code = _dispatch(argv)
        sys.stdout.flush()
        return code
    except SystemExit:
        _flush_stdout()  # --help or a usage error: argparse has printed, the reader may be gone
        raise
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE


def _dispatch(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return int(args.handler(args) or 0)
    except PlugrtError as exc:
        print(f"plugrt: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        raise
    except OSError as exc:
        # What the checks before the work cannot foresee: a full disk, a file removed meanwhile.
        where = f" {exc.filename!r}" if exc.filename else ""
        print(f"plugrt: error: cannot read or write{where}: {exc.strerror or exc}; check the path, its "
              "permissions and the free space", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()


def _stdout_to_devnull() -> None:
    """Python's recipe for a closed pipe: point stdout at devnull, so the flush at exit
    finds somewhere to write instead of printing another BrokenPipeError."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing is flushed at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plugrt", description="Build and run ONNX inference engines; every op is a plugin.")
    parser.add_argument("--version", action="version", version=f"plugrt {__version__}")
    commands = parser.add_subparsers(title="commands")

    plugins = commands.add_parser("plugins", help="list installed plugins and their ops")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(handler=cmd_plugins)

    check = commands.add_parser("check", help="report which nodes of a model the installed plugins support, "
                                              "and run the build's checks short of timing tactics")
    check.add_argument("model", help="an .onnx file")
    check.add_argument("--json", action="store_true", help="print JSON")
    add_shape_options(check)
    check.set_defaults(handler=cmd_check)

    build = commands.add_parser("build", help="build an engine from an ONNX model and save it as a plan file")
    build.add_argument("model", help="an .onnx file")
    build.add_argument("-o", "--output", required=True, help="the plan file to write")
    add_build_options(build)
    build.set_defaults(handler=cmd_build)

    run = commands.add_parser("run", help="run a plan file")
    run.add_argument("plan", help="a .plan file")
    run.add_argument("--inputs", help="an .npz file of inputs (default: random inputs at the opt shapes)")
    run.add_argument("--save", help="write the outputs to this .npz file")
    run.add_argument("--profile", type=int, default=0, metavar="N",
                     help="the optimization profile to run (an engine built with several; default 0)")
    run.add_argument("--compare-onnxruntime", metavar="MODEL", help="compare with onnxruntime on this model")
    run.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of --compare-onnxruntime")
    run.add_argument("--force", action="store_true", help=FORCE_HELP)
    run.set_defaults(handler=cmd_run)

    add_bench_command(commands)
    add_serve_commands(commands)

    inspect = commands.add_parser("inspect", help="show a plan's layers, tactics and memory")
    inspect.add_argument("plan", help="a .plan file")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(handler=cmd_inspect)

    new = commands.add_parser("new-plugin", help="create a new op plugin package from the template",
                              description="Render the plugin template into a new package: pyproject.toml with the "
                                          "plugrt.plugins entry point, the op (infer, NumPy reference, CUDA tactics), "
                                          "tests using the conformance kit, a README.")
    new.add_argument("name", metavar="NAME", help="the plugin's name: distribution plugrt-NAME, module plugrt_NAME")
    new.add_argument("--op", required=True, metavar="OPTYPE",
                     help="the ONNX op type it provides (e.g. SoftClip), or with --kind tactic serves (e.g. Relu)")
    new.add_argument("--domain", metavar="DOMAIN",
                     help="the op's ONNX domain (default com.NAME; '' or ai.onnx for the default ONNX domain)")
    new.add_argument("--kind", choices=("pointwise", "custom", "tactic"), default="pointwise",
                     help="pointwise: a scalar device function the core fuses, and a hand-written kernel (default); "
                          "custom: explicit @cuda.jit kernels using a workspace; tactic: no op, more tactics for "
                          "an installed op another plugin owns (--domain defaults to the default ONNX domain)")
    new.add_argument("--dest", metavar="DIR", help="the folder to create (default ./plugrt-NAME); must be new or empty")
    new.set_defaults(handler=cmd_new_plugin)

    cache = commands.add_parser("timing-cache", help="work with tactic timing caches")
    cache_commands = cache.add_subparsers(title="timing-cache commands")
    merge = cache_commands.add_parser("merge", help="merge timing caches into one (a failure or the smaller "
                                                     "time wins where two timed the same tactic)")
    merge.add_argument("caches", nargs="+", metavar="CACHE", help="timing cache files")
    merge.add_argument("-o", "--output", required=True, help="the merged cache to write (may be one of the inputs)")
    merge.add_argument("--force", action="store_true", help=FORCE_HELP)
    merge.set_defaults(handler=cmd_timing_cache_merge)
    return parser


def cmd_plugins(args) -> int:
    from plugrt.registry import default_registry

    registry = default_registry()
    records = [r.as_json() for r in registry.plugins.values()]
    failures = [vars(f) for f in registry.failures]
    if args.json:
        print(json.dumps({"plugrt_version": __version__, "api_version": API_VERSION, "plugins": records,
                          "failures": failures}, indent=2))
        return 0
    print(f"plugrt {__version__}, plugin API {API_VERSION}")
    for record in records:
        ops = ", ".join(_op_label(op) for op in record["ops"])
        print(f"{record['name']}  ({record['distribution'] or '-'} {record['version'] or ''})".rstrip())
        print(f"    module: {record['module']}")
        low, high = record["api"]
        assumed = "" if record["api_stated"] else " (assumed: it states no PLUGRT_API)"
        print(f"    plugrt API: {low}..{high}{assumed}")
        if ops:
            print(f"    ops: {ops}")
        if record["passes"]:
            print(f"    passes: {', '.join(record['passes'])}")
        for provider in record["tactics"]:
            print(f"    tactics for {_op_label(provider)}: {', '.join(provider['tactic_names'])}")
    for failure in failures:
        print(f"FAILED {failure['name']} ({failure['distribution']} {failure['version']}): {failure['error']}")
    return 0


def cmd_new_plugin(args) -> int:
    from plugrt.registry import default_registry
    from plugrt.scaffold import check_registry, default_dest, plugin_spec, render_plugin

    spec = plugin_spec(args.name, args.op, args.domain, args.kind)
    spec = check_registry(spec, default_registry())
    dest = args.dest if args.dest is not None else default_dest(spec)
    check_new_folder(str(dest), "--dest")
    files = render_plugin(spec, dest)
    print(f"created {spec.distribution} ({spec.qualified_op}, {spec.kind}) in {dest}: {len(files)} files")
    for path in files:
        print(f"    {path.as_posix()}")
    print(f"next: cd {dest} && python3 -m pip install -e \".[test]\" && python3 -m pytest -q")
    return 0


def _op_label(op: dict) -> str:
    prefix = f"{op['domain']}::" if op["domain"] else ""
    return prefix + op["op_type"]


def cmd_check(args) -> int:
    """Per node support, then (all supported) what ``build`` checks before timing tactics."""
    from plugrt.engine import Builder, BuilderConfig
    from plugrt.onnx.importer import support_report

    check_model_input(args.model, "MODEL")
    config = BuilderConfig()
    add_profile(config, args)
    report = support_report(args.model)
    bad = [entry for entry in report if entry["status"] != "supported"]
    build = "not checked: unsupported nodes" if bad else "ok"
    if not bad:
        try:
            Builder().check_model(args.model, config, dynamic_dim=1)
        except PlugrtError as exc:
            build = f"refused: {exc}"
    if args.json:
        print(json.dumps({"model": args.model, "nodes": report, "unsupported": len(bad), "build": build}, indent=2))
    else:
        for entry in report:
            mark = {"supported": "ok", "unsupported": "UNSUPPORTED", "not checked": "not checked"}[entry["status"]]
            line = f"{mark:12s} {entry['name']}  {entry['op_type']} (domain {entry['domain']}, opset {entry['opset']})"
            if entry.get("reason"):
                line += f": {entry['reason']}"
            print(line)
        print(f"{len(report) - len(bad)} of {len(report)} nodes supported")
        print(f"build checks (import, profile, graph passes, shapes, a tactic for every layer): {build}")
        if build == "ok" and not config.profiles:
            print("dynamic input dims, if any, were checked at 1; give --opt-shapes to check at yours")
    return EXIT_UNSUPPORTED if bad or build != "ok" else 0



# ---------------------------------------------------------------------------- engines


def cmd_build(args) -> int:
    from plugrt.device import announce_once

    check_model_input(args.model, "MODEL")
    if args.timing_cache:
        check_timing_cache(args.timing_cache, {"MODEL": args.model}, args.force)
    check_output(args.output, "-o", PLAN, {"MODEL": args.model, "--timing-cache": args.timing_cache}, args.force)
    check_distinct({"-o": args.output, "--timing-cache": args.timing_cache})
    announce_once()
    engine = build_engine(args, args.model)
    engine.save(args.output)
    report = engine.inspect()
    aliases = sum(layer["alias"] is not None for layer in report["layers"])
    print(f"built {args.output}: {len(report['layers'])} layers ({aliases} aliases, no kernel), "
          f"{len(report['host_nodes'])} host nodes; "
          f"weights {report['memory']['weights_bytes']} B, arena {report['memory']['arena_bytes']} B, "
          f"workspace {report['memory']['workspace_bytes']} B")
    for line in precision_report(engine):
        print(line)
    if line := kernel_report():
        print(line)
    return 0


def cmd_run(args) -> int:
    from plugrt.bench import random_feeds
    from plugrt.device import announce_once
    from plugrt.engine import Engine
    from plugrt.onnxruntime_compare import compare_onnxruntime, onnxruntime_session

    check_plan_input(args.plan, "PLAN")
    if args.inputs:
        check_input(args.inputs, "--inputs", NPZ,
                    "save the inputs as named arrays with numpy.savez('inputs.npz', input=array)")
    if args.compare_onnxruntime:
        check_model_input(args.compare_onnxruntime, "--compare-onnxruntime")
    if args.save:
        check_output(args.save, "--save", NPZ, {"PLAN": args.plan, "--inputs": args.inputs,
                                                "--compare-onnxruntime": args.compare_onnxruntime}, args.force)
    announce_once()
    engine = Engine.load(args.plan)
    session = onnxruntime_session(args.compare_onnxruntime, engine) if args.compare_onnxruntime else None
    feeds = _load_npz(args.inputs) if args.inputs else random_feeds(engine, profile=args.profile)
    outputs = engine.create_execution_context(profile=args.profile).execute(feeds)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype}{list(value.shape)}")
    if args.save:
        _save_npz(args.save, outputs)
    if session is not None:
        return compare_onnxruntime(session, args.compare_onnxruntime, feeds, outputs, args.rtol)
    return 0


def _load_npz(path: str) -> dict:
    import zipfile
    import zlib

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise PlugrtError(f"--inputs {path!r} is not a readable .npz file ({exc}); save the inputs with "
                          "numpy.savez('inputs.npz', input=array)") from None


def _save_npz(path: str, arrays: dict) -> None:
    import io

    import numpy as np


    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_atomically(path, buffer.getvalue())


def cmd_inspect(args) -> int:
    from plugrt.engine import Engine

    check_plan_input(args.plan, "PLAN")
    report = Engine.load(args.plan).inspect()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    memory = report["memory"]
    print(f"device built on: {report['device'].get('name')}")
    for name, entry in report["inputs"].items():
        ranges = "; ".join(f"profile {k} {p.get(name)}" for k, p in enumerate(report["profiles"]))
        print(f"input  {name}: {entry['dtype']}{entry['shape']}  {ranges if len(report['profiles']) > 1 else ranges[10:]}")
    for name, entry in report["outputs"].items():
        print(f"output {name}: {entry['dtype']}{entry['shape']}")
    aliases = sum(layer["alias"] is not None for layer in report["layers"])
    print(f"{len(report['layers'])} layers ({aliases} of them aliases, running no kernel; "
          f"{len(report['host_nodes'])} nodes computed on the host):")
    for layer in report["layers"]:
        outs = ", ".join(f"{n}{s}" for n, s in layer["outputs"].items())
        provider = layer.get("tactic_provider")
        supplier = f"; tactic from {provider['plugin']} ({provider['distribution']})" if provider else ""
        tactic = layer["tactic"] if layer["alias"] is None else f"alias of {layer['alias']}"
        print(f"  {layer['name']:30s} {layer['op']:22s} {tactic:18s} {layer['precision']:8s} -> {outs}"
              f"  [{layer['plugin']} ({layer['distribution']}){supplier}]")
        if len(layer["onnx_nodes"]) > 1:
            print(f"      covers ONNX nodes: {', '.join(layer['onnx_nodes'])}")
        if layer.get("data_dependent"):
            print("      data-dependent: its outputs' sizes are data (shown: their bounds); the run reads them after it")
        others = [f"profile {k + 1}: {name}" for k, name in enumerate(layer.get("profile_tactics") or ())]
        others += [f"profile {k} at other shapes: {name}" for k, name in enumerate(layer.get("generic_tactics") or ())
                   if name]
        others += [f"at {entry['shapes']}: {name}"
                   for entry, name in zip(report["specialized"], layer.get("specialized_tactics") or ())]
        if others:
            print(f"      also runs {'; '.join(others)}")
        if layer.get("time_ms") is not None:
            line = f"      time {layer['time_ms']:.4f} ms"
            runner_up = layer.get("runner_up")
            if runner_up:
                line += f"; runner-up {runner_up['name']} {runner_up['params']} {runner_up['time_ms']:.4f} ms"
            print(line)
    print("plugins the plan needs:")
    for entry in report["plugins"]:
        ops = ", ".join([f"{op} (op version {v})" for op, v in entry["ops"].items()] +
                        [f"tactics for {op} (provider version {v})" for op, v in entry.get("tactics", {}).items()])
        print(f"  {entry['plugin']:30s} {entry['distribution'] or '(no distribution)'} {entry['version'] or ''}: {ops}")
    if report["passes"]:
        print("graph passes (nodes before -> after):")
        for entry in report["passes"]:
            if entry["rewrites"]:
                print(f"  {entry['name']:34s} {entry['nodes_before']:5d} -> {entry['nodes_after']:5d}")
    precision = report.get("precision")
    if precision:
        flags = [name for name in ("fp16", "fp16_io", "strongly_typed") if precision.get(name)]
        print(f"precision: built with {', '.join(flags) or 'the model types'}; {precision['casts']} conversions "
              f"inserted; constraints {precision['constraints']}")
        for fallback in precision["fallbacks"]:
            print(f"  {fallback['layer']}: {fallback['reason']}")
        if precision["accuracy"]:
            errors = ", ".join(f"{name} {error if isinstance(error, str) else f'{error:.3g}'}"
                               for name, error in precision["accuracy"]["outputs"].items())
            print(f"  the build's accuracy check (relative error against the model's reference): {errors}")
    print(f"memory: weights {memory['weights_bytes']} B, arena {memory['arena_bytes']} B, "
          f"workspace {memory['workspace_bytes']} B")
    return 0


def cmd_timing_cache_merge(args) -> int:
    from plugrt.tuning import TimingCache, TimingCacheError

    for path in args.caches:
        if not os.path.lexists(path):
            raise TimingCacheError(f"timing cache {path!r} does not exist; name existing cache files")
        check_input(path, "CACHE")
    # -o may name one of the caches: the merge holds every timing of each, nothing is lost.
    check_output(args.output, "-o", TIMING_CACHE, force=args.force)
    merged = TimingCache()
    for path in args.caches:
        merged.merge(TimingCache.load(path))
    merged.save(args.output)
    print(f"merged {len(args.caches)} timing caches into {args.output}: {len(merged.entries)} layers, "
          f"{len(merged)} timings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
