"""``plugrt run --compare-onnxruntime``: the plan's outputs against onnxruntime's on the
model it was built from, with the same inputs."""

from __future__ import annotations

from plugrt.errors import PlugrtError


def onnxruntime_session(model: str, engine):
    """An onnxruntime session on ``model``, whose inputs and outputs must be the plan's."""
    try:
        import onnxruntime
    except ImportError:
        raise PlugrtError("--compare-onnxruntime needs onnxruntime: pip install onnxruntime") from None
    try:
        session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors have no common base
        raise PlugrtError(f"--compare-onnxruntime: onnxruntime cannot load {model!r}: {_one_line(exc)}") from None
    for what, theirs, ours in (("inputs", [i.name for i in session.get_inputs()], engine.input_names),
                               ("outputs", [o.name for o in session.get_outputs()], engine.output_names)):
        if sorted(theirs) != sorted(ours):
            raise PlugrtError(f"--compare-onnxruntime {model!r} has {what} {sorted(theirs)}, the plan has "
                              f"{sorted(ours)}; name the model the plan was built from")
    return session


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]


def compare_onnxruntime(session, model: str, feeds: dict, outputs: dict, rtol: float) -> int:
    """Print each output's worst relative error against onnxruntime's; 0 when all are
    within ``rtol``, else 1."""
    import numpy as np

    names = [o.name for o in session.get_outputs()]
    try:
        results = session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors have no common base
        raise PlugrtError(f"--compare-onnxruntime: onnxruntime cannot run {model!r} on the plan's inputs "
                          f"({_one_line(exc)}); name the model the plan was built from") from None
    expected = dict(zip(names, results))
    worst = 0.0
    for name, want in expected.items():
        if outputs[name].shape != want.shape:
            raise PlugrtError(f"--compare-onnxruntime: output {name!r} has shape {list(want.shape)} in onnxruntime, "
                              f"{list(outputs[name].shape)} in the plan; name the model the plan was built from")
        got = outputs[name].astype(np.float64)
        err = float(np.max(np.abs(got - want), initial=0.0) / (np.max(np.abs(want), initial=0.0) + 1e-12))
        worst = max(worst, err)
        print(f"{name}: max relative error vs onnxruntime {err:.2e}")
    ok = worst <= rtol
    print("match" if ok else f"MISMATCH (tolerance {rtol:g})")
    return 0 if ok else 1
