"""Checking the tensors a caller binds to a graph's or engine's inputs, and making random ones."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from plugrt.errors import BindingError
from plugrt.ir.dims import format_shape
from plugrt.ir.tensor import TensorInfo


def check_inputs(expected: Mapping[str, TensorInfo], feeds: Mapping[str, object]) -> dict[str, int]:
    """Check names, dtypes, ranks and dims of ``feeds`` against ``expected``.

    Each feed needs ``.dtype`` and ``.shape`` (NumPy arrays, device arrays, torch
    tensors wrapped by the caller). Symbols shared by several inputs must agree.

    :returns: the size bound to each symbolic dimension.
    :raises BindingError: naming the binding, what was expected and what was given.
    """
    unknown = sorted(set(feeds) - set(expected))
    if unknown:
        raise BindingError(
            f"unknown input binding(s) {', '.join(map(repr, unknown))}; the inputs are "
            f"{', '.join(map(repr, expected))}"
        )
    missing = [name for name in expected if name not in feeds]
    if missing:
        raise BindingError(f"missing input binding(s) {', '.join(map(repr, missing))}")
    symbols: dict[str, int] = {}
    for name, info in expected.items():
        feed = feeds[name]
        dtype = np.dtype(feed.dtype)
        shape = tuple(int(d) for d in feed.shape)

        def both() -> str:  # formatted only for an error: this check runs on every execute
            return f"(expected {info.dtype}{format_shape(info.shape)}, got {dtype}{format_shape(shape)})"

        if dtype != info.dtype:
            raise BindingError(f"input binding {name!r}: expected dtype {info.dtype}, got {dtype} {both()}")
        if len(shape) != len(info.shape):
            raise BindingError(f"input binding {name!r}: expected rank {len(info.shape)}, got {len(shape)} {both()}")
        for axis, (dim, size) in enumerate(zip(info.shape, shape)):
            if isinstance(dim, int):
                if dim != size:
                    raise BindingError(f"input binding {name!r}: dim {axis} must be {dim}, got {size} {both()}")
            elif symbols.setdefault(dim, size) != size:
                raise BindingError(
                    f"input binding {name!r}: dim {axis} ({dim!r}) is {size} but another input binds {dim!r} to {symbols[dim]}"
                )
    return symbols


def random_input(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """A fresh random array for an input binding: normal floats, booleans, integers 1..4
    (never zero, so divisions and indices stay valid)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(1, 5, shape).astype(dtype)
