"""Run :mod:`run_model` over many architectures, each in its own process, and print a table.

    python3 benchmarks/sweep/sweep.py [--models a,b,...] [--exporter legacy|dynamo] [--opset N] [--fp16] [--jobs 2]

Without ``--models``: every architecture :func:`run_model.catalog` lists. Needs PyTorch,
transformers and onnxruntime (the GPU machine has them; here ``pip install torch==2.13.0
transformers``); a failing model never stops the others. The 2026-12-07 results are in
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="")
    parser.add_argument("--exporter", choices=("legacy", "dynamo"), default="legacy")
    parser.add_argument("--opset", type=int, default=0, help="the export's opset (0: run_model's default)")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    from run_model import catalog

    names = args.models.split(",") if args.models else sorted(catalog())

    def one(name: str) -> str:
        command = [sys.executable, os.path.join(HERE, "run_model.py"), name, "--exporter", args.exporter]
        command += ["--opset", str(args.opset)] if args.opset else []
        command += ["--fp16"] if args.fp16 else []
        command += ["--int8"] if args.int8 else []
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return f"{name}: TIMEOUT after {args.timeout} s"
        lines = [line for line in done.stdout.splitlines() if line.startswith(name)]
        return lines[-1] if lines else f"{name}: CRASHED (exit {done.returncode}) {done.stderr[-300:]}"

    results = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(one, names):  # (in order, each as soon as it and those before it end)
            print(line, flush=True)
            results.append(line)
    failed = [line for line in results if ": OK" not in line]
    print(f"{len(results) - len(failed)} of {len(results)} OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
