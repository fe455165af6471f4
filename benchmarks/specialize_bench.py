"""Host cost of a never-seen input shape (issue 19): how long a context takes to prepare
a new sequence length's launches, without a GPU.

A new shape's first request pays, on the host, for its specialization
(:class:`plugrt.engine.specialization.Specialization`): shapes inferred again, each
layer's recorded tactic found again, its launches made. This times that on the tiny
dynamic-sequence BERT the tests use (two encoder layers; BERT-base has twelve, so about
six times the layers) in the CUDA simulator, where no kernel runs during preparation, and
reports milliseconds per shape and per launching layer. On a GPU, ``dynamic_bench.py``
measures the whole first request.

    NUMBA_ENABLE_CUDASIM=1 python3 benchmarks/specialize_bench.py [--shapes 40] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pathlib
import pstats
import statistics
import sys
import time

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

EXPORT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "exports" / "bert.onnx"


def dynamic_bert():
    import onnx

    model = onnx.load(EXPORT)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[1].dim_param = "seq"
    del model.graph.value_info[:]
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=40, help="never-seen sequence lengths to prepare")
    parser.add_argument("--profile", action="store_true", help="print where the host time goes")
    args = parser.parse_args()
    from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

    high = args.shapes + 8
    config = BuilderConfig(progress=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("input_ids", (1, 1), (1, 4), (1, high)))
    engine = Builder().build_engine(dynamic_bert(), config)
    context = engine.create_execution_context()
    seqs = [s for s in range(5, high + 1)][:args.shapes]
    times = []
    profiler = cProfile.Profile() if args.profile else None
    for seq in seqs:
        if profiler:
            profiler.enable()
        started = time.perf_counter()
        spec = context.specialize({"input_ids": (1, seq)})
        times.append(time.perf_counter() - started)
        if profiler:
            profiler.disable()
    layers = len(spec.layer_launches)
    median = statistics.median(times) * 1e3
    if profiler:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        print(text.getvalue())
    print(f"new shape's preparation: median {median:.2f} ms over {len(seqs)} lengths "
          f"({layers} launching layers: {median / max(layers, 1) * 1e3:.0f} us a layer)"
          + (" [under cProfile]" if profiler else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
