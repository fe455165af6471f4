"""The options of ``plugrt build`` that shape the build (passes, tactics, timing and kernel
caches, output), for every command that builds an engine from a model first."""

from __future__ import annotations

import os

from plugrt.errors import PlugrtError


def add_build_options(parser) -> None:
    """Add the build's options to an argparse parser."""
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
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--kernel-cache", metavar="DIR",
                       help="the folder of compiled kernels kept between builds (default: $PLUGRT_KERNEL_CACHE, "
                            "else ~/.cache/plugrt/kernels)")
    cache.add_argument("--no-kernel-cache", action="store_true",
                       help="neither read nor write the kernel cache: every kernel is compiled")
    parser.add_argument("--no-progress", action="store_true", help="no progress line while tactics are timed")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each graph pass and the build steps")


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
