"""The build's command-line options, shared by ``plugrt build`` and ``plugrt bench`` (which
builds a model with the same flags before it measures it): the options, the checks of the
files they name, and the build they configure.
"""

from __future__ import annotations

import os

from plugrt.errors import PlugrtError
from plugrt.paths import TIMING_CACHE, check_input, check_output

FORCE_HELP = ("overwrite an existing output file that is not of the kind written (a command never "
              "overwrites its own input)")


def add_shape_options(parser) -> None:
    """``--min-shapes``, ``--opt-shapes``, ``--max-shapes``: the optimization profiles (the
    k-th of each flag makes profile k)."""
    for which in ("min", "opt", "max"):
        parser.add_argument(f"--{which}-shapes", action="append", default=[], metavar="NAME:DxDx..,...",
                            help=f"{which} shapes of dynamic inputs, e.g. input:1x3x224x224 (a shape given "
                                 "for one of min/opt/max stands for the others not given); repeat the flags for "
                                 "several optimization profiles: the k-th --min/--opt/--max-shapes make profile k")
    for which in ("min", "opt", "max"):
        parser.add_argument(f"--{which}-values", action="append", default=[], metavar="NAME:VxVx..,...",
                            help=f"{which} values of shape-tensor inputs (read on the host at run time, e.g. a "
                                 "Reshape's target), e.g. shape:1x-1x64; as the shapes: one given stands for the "
                                 "others, the k-th of each flag is profile k's")


def add_build_options(parser) -> None:
    """Every option of ``plugrt build`` but the model and ``-o``."""
    add_shape_options(parser)
    parser.add_argument("--specialize-shapes", action="append", default=[], metavar="NAME:DxDx..,...",
                        help="also tune every layer at these input shapes (inside a profile; repeatable): a context "
                             "runs those tactics at exactly them, the generic ones at other shapes")
    parser.add_argument("--no-fusion", action="store_true",
                        help="keep every op its own layer (no weight folding, pattern or kernel fusion)")
    parser.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                        help="skip one graph pass (repeatable); `plugrt inspect` lists the passes that ran")
    parser.add_argument("--timing-cache", metavar="FILE",
                        help="a JSON timing cache: read before the build (missing: empty), written after it")
    parser.add_argument("--optimization-level", type=int, default=3, choices=range(6), metavar="N",
                        help="0: each plugin's first tactic, untimed; 1, 2, 3, 4: time the first 2, 3, 3, 6 "
                             "tactics of each layer; 5: time all (default 3)")
    parser.add_argument("--no-tf32", action="store_true", help="no TF32 tensor-core tactics for float32 layers")
    precision = parser  # (bench passes a group already: groups do not nest)
    precision.add_argument("--fp16", action="store_true",
                           help="let each layer run in FP16 where its plugin can and it is faster (FP32 otherwise); "
                                "engine inputs and outputs keep the model's dtypes")
    precision.add_argument("--layer-precision", action="append", default=[], metavar="NAME:PRECISION",
                           help="run ONNX node NAME (the layer holding it) in fp32, fp16 or, with --int8, int8 "
                                "(taken wherever calibration allows, not timed against float; repeatable; "
                                "comma-separated lists work too)")
    precision.add_argument("--precision-constraints", choices=("prefer", "obey", "none"), default=None,
                           help="how --layer-precision binds: prefer (default: followed where the layer's plugin "
                                "can, else a warning), obey (else the build fails), none (ignored)")
    precision.add_argument("--fp16-io", action="store_true",
                           help="the engine's float32 inputs and outputs become FP16 bindings (feed and read "
                                "float16 arrays): no conversion at the ends of an FP16 engine")
    precision.add_argument("--io-format", action="append", default=[], metavar="NAME:FORMAT",
                           help="bind input or output NAME in this memory format: channels_last binds an "
                                "[N, C, H, W] tensor as [N, H, W, C] (give its profile shapes, feed and read it so), "
                                "linear keeps the model's layout; repeatable (TensorRT's --inputIOFormats layouts)")
    precision.add_argument("--strongly-typed", action="store_true",
                           help="build the model exactly as typed (an FP16 model runs in FP16); no --fp16 or "
                                "--layer-precision with it")
    precision.add_argument("--no-accuracy-check", action="store_true",
                           help="skip the build's check of an FP16 or INT8 engine against the model's reference")
    precision.add_argument("--int8", action="store_true",
                           help="let layers run in INT8 where calibration gives their inputs a range (a Q/DQ model "
                                "is quantized where its Q/DQ nodes say, without this flag)")
    precision.add_argument("--calibration-data", metavar="DATA",
                           help="calibration batches for --int8: an .npz file or a folder of them, one batch each, "
                                "keyed by input name")
    precision.add_argument("--calibration-algorithm", choices=("entropy", "minmax", "percentile", "mse"),
                           default="entropy", help="how a tensor's INT8 range is chosen from its histogram "
                                                   "(default entropy, as TensorRT's entropy calibrator 2)")
    precision.add_argument("--calibration-percentile", type=float, default=99.99, metavar="P",
                           help="the percentile of |x| the percentile algorithm keeps (default 99.99)")
    precision.add_argument("--calibration-cache", metavar="FILE",
                           help="a text calibration cache: read when it exists (for this model and algorithm: "
                                "calibration is skipped), else written after calibration")
    precision.add_argument("--accuracy-budget", type=float, metavar="REL",
                           help="keep the most sensitive layers in float until the INT8 engine's outputs are within "
                                "this relative error of the FP32 network's on the calibration data")
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--kernel-cache", metavar="DIR",
                       help="the folder of compiled kernels kept between builds (default: $PLUGRT_KERNEL_CACHE, "
                            "else ~/.cache/plugrt/kernels)")
    cache.add_argument("--no-kernel-cache", action="store_true",
                       help="neither read nor write the kernel cache: every kernel is compiled")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr while it works")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each graph pass and the build steps")
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)


#: The build options that change what is built (``plugrt bench`` refuses them for a plan).
BUILD_ONLY = (("min_shapes", "--min-shapes", []), ("opt_shapes", "--opt-shapes", []), ("max_shapes", "--max-shapes", []),
              ("min_values", "--min-values", []), ("opt_values", "--opt-values", []), ("max_values", "--max-values", []),
              ("specialize_shapes", "--specialize-shapes", []), ("no_fusion", "--no-fusion", False), ("disable_pass", "--disable-pass", []),
              ("timing_cache", "--timing-cache", None), ("optimization_level", "--optimization-level", 3),
              ("no_tf32", "--no-tf32", False), ("fp16", "--fp16", False), ("layer_precision", "--layer-precision", []),
              ("precision_constraints", "--precision-constraints", None), ("strongly_typed", "--strongly-typed", False),
              ("fp16_io", "--fp16-io", False), ("io_format", "--io-format", []),
              ("no_accuracy_check", "--no-accuracy-check", False), ("int8", "--int8", False),
              ("calibration_data", "--calibration-data", None),
              ("calibration_algorithm", "--calibration-algorithm", "entropy"),
              ("calibration_percentile", "--calibration-percentile", 99.99),
              ("calibration_cache", "--calibration-cache", None), ("accuracy_budget", "--accuracy-budget", None))


def given_build_options(args) -> list[str]:
    """The build-only options ``args`` sets to something other than their default."""
    return [flag for attr, flag, default in BUILD_ONLY if getattr(args, attr, default) != default]


def parse_shapes(text: str, flag: str) -> dict[str, tuple[int, ...]]:
    """``"a:1x3x224x224,b:4"`` -> ``{"a": (1, 3, 224, 224), "b": (4,)}``."""
    shapes = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            raise PlugrtError(f"{flag}: {item!r} is not NAME:DxDx... (e.g. input:1x3x224x224)") from None
    return shapes


def parse_values(text: str, flag: str) -> dict[str, list]:
    """``"shape:1x-1x64,k:0.5"`` -> ``{"shape": [1, -1, 64], "k": [0.5]}``."""
    values = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, numbers = item.rpartition(":")
        try:
            if not sep or not name or not numbers:
                raise ValueError
            values[name] = [int(v) if v.lstrip("-").isdigit() else float(v) for v in numbers.split("x")]
        except ValueError:
            raise PlugrtError(f"{flag}: {item!r} is not NAME:VxVx... (e.g. shape:1x-1x64)") from None
    return values


def check_timing_cache(path: str, inputs: dict, force: bool) -> None:
    """``--timing-cache``: read before the build (missing: empty), written after it."""
    from plugrt.tuning import TimingCache

    if os.path.lexists(path):
        check_input(path, "--timing-cache")
        TimingCache.load(path)  # not a cache, or a damaged one: say so before the build
    check_output(path, "--timing-cache", TIMING_CACHE, inputs, force)


def add_profile(config, args, run_shapes: dict | None = None) -> None:
    """The profiles of ``--min/--opt/--max-shapes``, if any is given: the k-th of each flag
    makes profile k (a flag not given at all leaves its shapes to the others). ``run_shapes``
    (bench's ``--shapes``) stand for the first profile's opt shapes of the inputs
    ``--opt-shapes`` does not name."""
    from plugrt.engine import OptimizationProfile

    given = {which: list(getattr(args, f"{which}_shapes") or []) for which in ("min", "opt", "max")}
    count = max(len(texts) for texts in given.values())
    if any(len(texts) not in (0, count) for texts in given.values()):
        counts = ", ".join(f"--{which}-shapes {len(texts)}" for which, texts in given.items())
        raise PlugrtError(f"several optimization profiles take each of --min-shapes, --opt-shapes and --max-shapes "
                          f"once per profile, or not at all; got {counts}")
    values = {which: list(getattr(args, f"{which}_values", None) or []) for which in ("min", "opt", "max")}
    if any(len(texts) not in (0, max(count, 1)) for texts in values.values()):
        raise PlugrtError(f"--min-values, --opt-values and --max-values come once per optimization profile "
                          f"({max(count, 1)}: as many as the --min/--opt/--max-shapes), or not at all")
    for k in range(max(count, 1)):
        low, opt, high = (parse_shapes(texts[k], f"--{which}-shapes") if texts else {}
                          for which, texts in given.items())
        opt = {**(run_shapes or {}), **opt} if k == 0 else opt
        corners = [parse_values(texts[k], f"--{which}-values") if texts else {} for which, texts in values.items()]
        if low or opt or high or any(corners):
            profile = OptimizationProfile.from_given(low, opt, high)
            for name in sorted(set().union(*corners)):
                known = [c[name] for c in corners if name in c]
                triple = [c.get(name, known[-1] if i == 2 else known[0]) for i, c in enumerate(corners)]
                profile.set_shape_input(name, *triple)
            config.add_optimization_profile(profile)
    config.specialize_shapes = [parse_shapes(text, "--specialize-shapes")
                                for text in getattr(args, "specialize_shapes", None) or ()]  # (check has none)


def build_engine(args, model, run_shapes: dict | None = None):
    """Build ``model`` (a path or an imported graph) as the build options in ``args`` say;
    the files they name have been checked."""
    from plugrt.engine import Builder, BuilderConfig

    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    use_kernel_cache(args)
    config = BuilderConfig(fusion=not args.no_fusion, disabled_passes=set(args.disable_pass),
                           optimization_level=args.optimization_level, tf32=not args.no_tf32,
                           timing_cache=args.timing_cache, progress=not args.no_progress, fp16=args.fp16,
                           layer_precisions=parse_layer_precisions(args.layer_precision),
                           precision_constraints=args.precision_constraints or "prefer",
                           strongly_typed=args.strongly_typed, accuracy_check=not args.no_accuracy_check,
                           fp16_io=args.fp16_io, io_formats=parse_io_formats(args.io_format), int8=args.int8, calibration_data=args.calibration_data,
                           calibration_algorithm=args.calibration_algorithm,
                           calibration_percentile=args.calibration_percentile,
                           calibration_cache=args.calibration_cache, accuracy_budget=args.accuracy_budget)
    add_profile(config, args, run_shapes)
    return Builder().build_engine(model, config)


def parse_io_formats(items: list[str]) -> dict[str, str]:
    """``--io-format NAME:FORMAT`` (repeatable) as {name: format}; the formats are checked by the build."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, form = item.rpartition(":")
        if not sep or not name or not form:
            raise PlugrtError(f"--io-format {item!r}: give NAME:FORMAT, e.g. --io-format input:channels_last")
        if name in found and found[name] != form:
            raise PlugrtError(f"--io-format: {name!r} is given two formats, {found[name]} and {form}")
        found[name] = form
    return found


def parse_layer_precisions(items: list[str]) -> dict[str, str]:
    """``--layer-precision`` values (``NAME:fp32``, repeatable, or comma-separated) ->
    ``{name: precision}``. A node name may itself hold ``:``; the last one splits."""
    found: dict[str, str] = {}
    for item in items:
        for part in filter(None, (p.strip() for p in item.split(","))):
            name, sep, precision = part.rpartition(":")
            if not sep or not name or precision not in ("fp32", "fp16", "int8"):
                raise PlugrtError(f"--layer-precision {part!r}: give NAME:fp32, NAME:fp16 or NAME:int8 (an ONNX "
                                  "node name, as `plugrt inspect --json` lists them under onnx_nodes)")
            if found.get(name, precision) != precision:
                raise PlugrtError(f"--layer-precision: node {name!r} is given both {found[name]} and {precision}")
            found[name] = precision
    return found


def precision_report(engine) -> list[str]:
    """What ``plugrt build`` prints about precisions: layer counts and the accuracy check."""
    info = engine.precision
    if info is None:
        return []
    counts: dict[str, int] = {}
    for layer in engine.inspect()["layers"]:
        counts[layer["precision"]] = counts.get(layer["precision"], 0) + 1
    lines = ["precision: " + ", ".join(f"{count} {name}" for name, count in sorted(counts.items())) + " layers"]
    for fallback in info["fallbacks"]:
        lines.append(f"  {fallback['layer']}: {fallback['reason']}")
    accuracy = info["accuracy"]
    if accuracy is not None:
        errors = ", ".join(f"{name} {_error(error)}" for name, error in accuracy["outputs"].items())
        lines.append(f"accuracy against the model's reference at opt shapes (relative error): {errors}")
    return lines


def _error(error) -> str:
    return error if isinstance(error, str) else f"{error:.3g}"


def use_kernel_cache(args) -> None:
    """Apply ``--kernel-cache DIR`` / ``--no-kernel-cache`` (before the build)."""
    from plugrt import kernel_cache

    if args.no_kernel_cache:
        kernel_cache.configure(None)
    elif args.kernel_cache:
        if os.path.exists(args.kernel_cache) and not os.path.isdir(args.kernel_cache):
            raise PlugrtError(f"--kernel-cache {args.kernel_cache!r} is a file, not a folder; name a folder "
                              "(it is made if missing)")
        kernel_cache.configure(args.kernel_cache)


def kernel_report(stats: dict | None = None, simulated: bool | None = None) -> str | None:
    """The line ``build`` prints about kernels (``stats``: this process's
    :func:`plugrt.binaries.stats`); none in the simulator, which compiles none."""
    from plugrt import binaries
    from plugrt.device import simulated as in_simulator

    stats = binaries.stats() if stats is None else stats
    if in_simulator() if simulated is None else simulated:
        return None
    line = f"kernels: {stats['compiled']} compiled, {stats['from_cache']} from the kernel cache"
    if stats["from_plan"]:
        line += f", {stats['from_plan']} from a plan"
    return line
