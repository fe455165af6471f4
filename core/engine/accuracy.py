"""The build's own accuracy check: an engine whose precisions changed, run against the
model's reference (the plugins' NumPy references, the model as typed) on the precision
step's random inputs at the profile's opt shapes (:mod:`plugrt.engine.precision`)."""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("plugrt.builder")


def relative_error(got, expected) -> float:
    """``max |got - expected| / max |expected|`` in float64 (``inf`` where one is NaN or
    infinite and the other is not; 0 for equal non-float tensors, 1 for unequal ones)."""
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        return float("inf")
    if expected.dtype.kind != "f":
        return 0.0 if np.array_equal(got, expected) else 1.0
    a, b = got.astype(np.float64), expected.astype(np.float64)
    same_nan = np.isnan(a) == np.isnan(b)
    same_inf = (np.isinf(a) == np.isinf(b)) & (~np.isinf(b) | (a == b))
    if not (same_nan.all() and same_inf.all()):
        return float("inf")
    finite = np.isfinite(b)
    if not finite.any():
        return 0.0
    scale = float(np.max(np.abs(b[finite])))
    error = float(np.max(np.abs(a[finite] - b[finite])))
    return error / scale if scale > 0 else error


def check_accuracy(engine, report) -> dict | None:
    """``{"outputs": {name: relative error}, "max": worst}`` of ``engine`` on the
    precision step's inputs; ``None`` when the step ran no reference."""
    if report.reference is None or report.feeds is None:
        return None
    feeds = {name: np.asarray(value, engine.graph.info(name).dtype) for name, value in report.feeds.items()}
    with engine.create_execution_context(use_cuda_graph=False) as context:
        got = context.execute(feeds)
    errors = {name: relative_error(got[name], report.reference[name]) for name in engine.output_names}
    worst = max(errors.values(), default=0.0)
    log.info("accuracy at opt shapes against the model's reference: %s",
             ", ".join(f"{name} {error:.3g}" for name, error in errors.items()))
    return {"outputs": {name: _json(error) for name, error in errors.items()}, "max": _json(worst)}


def _json(error: float):
    """A plan's JSON has no infinities: ``"inf"`` stands for one."""
    return error if np.isfinite(error) else "inf"
