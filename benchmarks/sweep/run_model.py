"""Export one architecture with PyTorch and check plugrt's engine against onnxruntime.

    python3 benchmarks/sweep/run_model.py NAME [--exporter legacy|dynamo] [--opset N] [--fp16]

NAME is one of :func:`torch_models.battery`, :func:`torch_models2.battery2` / ``battery3``
or :func:`hf_models.models` (tiny configurations, random weights). The model is exported
(``torch.onnx.export``, legacy TorchScript or dynamo exporter) with its dynamic axes,
onnxruntime's output compared with PyTorch's (an export fault is reported as such), then
plugrt builds it at a static batch and over a dynamic profile (batch 1..3; other dynamic
dims at the ranges in ``EXTRA``) and runs fresh random inputs at the corners, compared
with onnxruntime (FP32: 1e-4; ``--fp16``: 3e-2 of the output's largest magnitude). One
line: ``NAME: OK`` or ``NAME: FAIL ...`` (the traceback beside the export in ``--work``).
Runs in the simulator without a GPU (tiny sizes keep it to a minute or two a model).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
#: Dynamic dims other than the batch: (min, max) in the dynamic profile; opt is the example's.
EXTRA = {"h": (12, 20), "w": (8, 24), "t": (2, 9), "s": (3, 11), "l": (17, 40)}


def catalog() -> dict:
    """name -> () -> (module, example inputs, input names, dynamic axes per input)."""
    sys.path.insert(0, HERE)
    import torch_models
    import torch_models2
    import hf_models

    found = {}
    for table in (torch_models.battery, torch_models2.battery2, torch_models2.battery3):
        for name, (module, example, dyn) in table().items():
            names = ["x", "y"][:len(example)]
            axes = {n: dyn.get(k, {0: "b"}) for k, n in zip(["x", "y"], names)}
            found[name] = (lambda m=module, e=example, n=names, a=axes: (m, e, n, a))
    for name, make in hf_models.models().items():
        def hf(make=make):
            module, example, names = make()
            return module, example, names, {n: {0: "batch"} for n in names}
        found[name] = hf
    return found


def main() -> int:
    warnings.filterwarnings("ignore")
    import plugrt  # noqa: F401  (a GPU if there is one, else the simulator; before torch imports numba)
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--exporter", choices=("legacy", "dynamo"), default="legacy")
    parser.add_argument("--opset", type=int, default=None, help="the export's opset (legacy: 17; dynamo: PyTorch's)")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--int8", action="store_true", help="INT8 with entropy calibration on 4 random batches")
    parser.add_argument("--work", default="/tmp/plugrt-sweep")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    label = f"{args.name} {args.exporter}{f' opset {args.opset}' if args.opset else ''}" \
            f"{' fp16' if args.fp16 else ''}{' int8' if args.int8 else ''}"

    import numpy as np
    import onnx
    import onnxruntime
    import torch

    torch.manual_seed(0)
    torch.backends.mha.set_fastpath_enabled(False)
    module, example, names, axes = catalog()[args.name]()
    module.eval()
    path = os.path.join(args.work, f"{args.name}_{args.exporter}{args.opset or ''}.onnx")
    try:
        with torch.no_grad():
            if args.exporter == "legacy":
                torch.onnx.export(module, example, path, input_names=names, output_names=["output"],
                                  opset_version=args.opset or 17, dynamo=False, dynamic_axes=axes)
            else:
                from torch.export import Dim

                dims: dict = {}
                shapes = tuple({k: dims.setdefault(v, Dim.DYNAMIC) for k, v in axes[n].items()} for n in names)
                opset = {"opset_version": args.opset} if args.opset else {}
                program = torch.onnx.export(module, example, input_names=names, output_names=["output"], dynamo=True,
                                            dynamic_shapes=(shapes,) if _varargs(module) else shapes, **opset)
                program.save(path)
    except Exception as exc:  # noqa: BLE001 - the exporter's fault, not plugrt's
        print(f"{label}: EXPORT FAILED {type(exc).__name__}: {str(exc)[:300]}")
        return 0
    model = onnx.load(path)
    kept = [value.name for value in model.graph.input]
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)

    def dims_of(name, value, batch, corner):
        shape = [batch] + list(value.shape[1:])
        for axis, symbol in axes.get(name, {}).items():
            if axis and corner is not None and symbol in EXTRA:
                shape[axis] = EXTRA[symbol][corner]
        return tuple(shape)

    def feeds(batch, corner=None):
        found = {}
        for name, value in zip(names, example):
            if name not in kept:
                continue
            shape = dims_of(name, value, batch, corner)
            if value.dtype == torch.bool:
                found[name] = rng.random(shape) > 0.3
                found[name][..., 0] = True
            elif value.dtype in (torch.int64, torch.int32):
                if "mask" in name:
                    found[name] = np.ones(shape, np.int64)
                    if batch > 1:
                        found[name][-1, shape[1] - 3:] = 0
                else:
                    found[name] = rng.integers(1, int(value.max()) + 1, shape).astype(np.int64)
            else:
                found[name] = rng.standard_normal(shape).astype(np.float32)
        return found

    given = feeds(example[0].shape[0])
    with torch.no_grad():
        wanted = module(*[torch.from_numpy(given[n]) if n in given else e for n, e in zip(names, example)])
    wanted = wanted if isinstance(wanted, tuple) else (wanted,)
    for ours, theirs in zip(wanted, session.run(None, given)):
        if not np.allclose(ours.float().numpy(), theirs, rtol=1e-3, atol=1e-4):
            print(f"{label}: EXPORT MISMATCH (onnxruntime against PyTorch) {np.abs(ours.float().numpy() - theirs).max():.2e}")

    from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

    def check(engine, runs, what):
        context = engine.create_execution_context()
        for batch, corner in runs:
            inputs = feeds(batch, corner)
            got = context.execute(inputs)
            for out, want in zip(model.graph.output, session.run(None, inputs)):
                value = got[out.name]
                if want.dtype.kind != "f":
                    ok = value.shape == want.shape and np.mean(value == want) > (0.9 if args.fp16 or args.int8 else 1 - 1e-9)
                else:
                    scale = max(1.0, float(np.abs(want).max()))
                    tol = 1.5e-1 * scale if args.int8 else 3e-2 * scale if args.fp16 else 1e-4
                    ok = value.shape == want.shape and np.allclose(value.astype(np.float64), want, rtol=tol, atol=tol,
                                                                   equal_nan=True)
                if not ok:
                    error = np.abs(value.astype(np.float64) - want).max() if value.shape == want.shape else \
                        (value.shape, want.shape)
                    raise AssertionError(f"{what} batch {batch} output {out.name}: {error}")

    try:
        for what, corners in (("static", None), ("dynamic", (0, None, 1))):
            config = BuilderConfig(progress=False, tf32=False, fp16=args.fp16, int8=args.int8,
                                   calibration_data=[feeds(example[0].shape[0]) for _ in range(4)] if args.int8 else None)
            profile = OptimizationProfile()
            for name, value in zip(names, example):
                if name in kept:
                    batch = example[0].shape[0]
                    if corners is None:
                        shape = dims_of(name, value, batch, None)
                        profile.set_shape(name, shape, shape, shape)
                    else:
                        profile.set_shape(name, dims_of(name, value, 1, 0), dims_of(name, value, batch, None),
                                          dims_of(name, value, 3, 1))
            config.add_optimization_profile(profile)
            runs = [(example[0].shape[0], None)] if corners is None else [(1, 0), (3, 1)]
            check(Builder().build_engine(model, config), runs, what)
        print(f"{label}: OK")
    except Exception as exc:  # noqa: BLE001 - reported, with the traceback kept
        print(f"{label}: FAIL {type(exc).__name__}: {str(exc)[:500]}")
        with open(os.path.join(args.work, f"{args.name}_{args.exporter}.tb"), "w") as out:
            traceback.print_exc(file=out)
    return 0


def _varargs(module) -> bool:
    import inspect

    return any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(module.forward).parameters.values())


if __name__ == "__main__":
    sys.exit(main())
