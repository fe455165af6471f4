"""A node's attributes against its plugin's declaration (:attr:`OpPlugin.attributes`).

The one check of attribute names, kinds and required attributes, used where attributes
come from outside: the ONNX importer (which reads the kind from the protobuf) and plan
loading (which reads resolved values back from JSON, so the kind is that of the value).
A plugin's own range checks run after this, in :meth:`OpPlugin.check`.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from plugrt.errors import ModelError, UnsupportedError


def check_names(node, op, names: Iterable[str]) -> None:
    """Refuse attribute names the plugin does not declare."""
    declared = {a.name for a in op.attributes}
    for name in names:
        if name not in declared:
            raise UnsupportedError(
                f"{node.describe()}: attribute {name!r} is not known to plugin {type(op).__name__}; "
                f"it accepts {sorted(declared) or 'no attributes'}"
            )


def missing_required(node, op, names: Iterable[str]) -> None:
    """Refuse a node lacking an attribute the plugin requires."""
    present = set(names)
    for spec in op.attributes:
        if spec.required and spec.name not in present:
            raise ModelError(f"{node.describe()}: required attribute {spec.name!r} is missing")


def wrong_kind(node, name: str, expected: str, got: str) -> ModelError:
    return ModelError(f"{node.describe()}: attribute {name!r} must be of type {expected}, got {got}")


def check_resolved(node, op) -> None:
    """``node.attrs`` as resolved values (a plan's, after JSON): declared names, required
    ones present, each value of its declared kind (``None`` where the default is ``None``)."""
    check_names(node, op, node.attrs)
    missing_required(node, op, node.attrs)
    for spec in op.attributes:
        if spec.name not in node.attrs:
            continue
        value = node.attrs[spec.name]
        if value is None and spec.default is None:
            continue
        got = kind_of(value)
        if got != spec.kind and not _compatible(got, spec.kind, value):
            raise wrong_kind(node, spec.name, spec.kind, got)


def kind_of(value: Any) -> str:
    """The attribute kind a resolved value has (``"undefined"`` when it has none)."""
    if isinstance(value, bool) or value is None:
        return "undefined"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, np.ndarray):
        return "tensor"
    if isinstance(value, (list, tuple)):
        kinds = {kind_of(v) for v in value}
        if kinds <= {"int"}:
            return "ints"
        if kinds <= {"int", "float"}:
            return "floats"
        if kinds == {"string"}:
            return "strings"
        if all(isinstance(v, dict) for v in value):
            return "graph"  # a fused layer's body: its entries are checked as nodes
    return "undefined"


def _compatible(got: str, expected: str, value) -> bool:
    """JSON writes ``2.0`` as ``2.0`` but a float list may hold ints; an empty list is any list."""
    if expected == "float" and got == "int":
        return True
    if isinstance(value, (list, tuple)) and not value:
        return expected in ("ints", "floats", "strings")
    return expected == "floats" and got == "ints"
