"""Comparing what a plugin produced with what it should have: outputs against the
reference (within tolerance), data against plain JSON."""

from __future__ import annotations

import json

import numpy as np

from plugrt.ir.dims import format_shape


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, values: bool = True) -> str:
    """Why ``got`` is not ``want`` within tolerance, or ``""``. ``values=False`` compares
    dtypes and shapes only (ops that are not ``foldable``: random generators)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, reference {want.dtype}"
    if got.shape != want.shape:
        return f"shape {format_shape(got.shape)}, reference {format_shape(want.shape)}"
    if not values:
        return ""
    if want.dtype.kind in "fc":
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        g, w = got.astype(wide), want.astype(wide)
        bad = ~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        tolerance = f" beyond rtol={rtol:g}, atol={atol:g}"
    else:
        g, w = got, want
        bad = got.view(np.uint8) != want.view(np.uint8) if want.dtype == bool else got != want
        tolerance = ""
    if not bad.any():
        return ""
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    text = (f"{int(bad.sum())} of {bad.size} elements differ{tolerance}; first at index {first}: "
            f"got {np.asarray(g[first]).item()!r}, reference {np.asarray(w[first]).item()!r}")
    if want.dtype.kind in "fc":
        with np.errstate(invalid="ignore"):
            text += f"; max |difference| {np.nanmax(np.abs(g - w)):.3g}"
    return text


def json_problems(value, path: str) -> list[str]:
    """Where ``value`` is not plain JSON data (strict: no NaN, str keys, no NumPy types)."""
    if value is None or isinstance(value, (str, bool, int)):
        return []
    if isinstance(value, float):
        return [] if np.isfinite(value) else [f"{path} is {value!r}, which JSON cannot hold"]
    if isinstance(value, dict):
        problems = []
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(f"{path} has the key {key!r} ({type(key).__name__}); JSON keys are str")
            problems += json_problems(item, f"{path}[{key!r}]")
        return problems
    if isinstance(value, (list, tuple)):
        return [p for i, item in enumerate(value) for p in json_problems(item, f"{path}[{i}]")]
    return [f"{path} is a {type(value).__module__}.{type(value).__name__}"]


def json_round_trip(value):
    """``value`` after a JSON dump and load (tuples become lists, for one)."""
    return json.loads(json.dumps(value, allow_nan=False))


def canonical_json(value) -> str:
    """A mapping as sorted JSON text (its ``repr`` when it is not JSON-safe), for equality."""
    try:
        return json.dumps(dict(value), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


__all__ = ["canonical_json", "compare", "json_problems", "json_round_trip", "same_bytes"]
