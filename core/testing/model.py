"""From a claimed :class:`~plugrt.plugin.Example` to a one-node ONNX model and its inputs."""

from __future__ import annotations

from typing import Mapping

import numpy as np
from onnx import numpy_helper

from plugrt.errors import PlugrtError
from plugrt.ir.dims import is_static
from plugrt.plugin import ALL_DTYPES, TensorInfo
from plugrt.testing.nodes import single_node_model

#: The default domain's opset for examples that name none (when the op supports it).
DEFAULT_OPSET = 17


def example_opset(op, example) -> int:
    """The opset of the op's domain the example's model imports."""
    if example.opset is not None:
        return int(example.opset)
    if op.domain:
        return op.since_opset
    opset = max(op.since_opset, DEFAULT_OPSET)
    return min(opset, op.until_opset) if op.until_opset is not None else opset


def example_model(op, example):
    """``(model, {graph input name: input index})`` for ``example`` of ``op``.

    Runtime inputs are named ``x<i>``, constants ``c<i>`` (initializers).

    :raises PlugrtError: naming what in the example is malformed.
    """
    inputs = example.inputs
    if not isinstance(inputs, (tuple, list)):
        raise PlugrtError(f"Example.inputs must be a tuple, got {type(inputs).__name__}")
    low, high = op.inputs
    if not low <= len(inputs) <= high:
        raise PlugrtError(f"{len(inputs)} inputs, but {type(op).__name__} takes {low}..{high}")
    feeds: dict[str, np.ndarray | None] = {}
    constants, specs = set(), {}
    for index, entry in enumerate(inputs):
        if entry is None:
            feeds[f"none{index}"] = None
        elif isinstance(entry, TensorInfo):
            if not is_static(entry.shape):
                raise PlugrtError(f"input {index} has symbolic shape {entry.shape}; examples are concrete "
                                  "(the kit also probes infer() with symbolic dims itself)")
            if entry.dtype not in ALL_DTYPES:
                raise PlugrtError(f"input {index} has dtype {entry.dtype}, which ONNX models cannot carry here")
            feeds[f"x{index}"] = np.zeros(tuple(entry.shape), entry.dtype)
            specs[f"x{index}"] = index
        elif isinstance(entry, (np.ndarray, np.generic)):
            feeds[f"c{index}"] = np.asarray(entry)
            constants.add(f"c{index}")
        else:
            raise PlugrtError(f"input {index} is a {type(entry).__name__}; use a TensorInfo (runtime input), "
                              "a NumPy array (constant) or None (omitted)")
    for key in example.ranges:
        if not isinstance(key, int) or key not in specs.values():
            raise PlugrtError(f"ranges names input {key!r}, which is not a runtime input (TensorInfo) of the example")
    n_outputs = example.n_outputs if example.n_outputs is not None else op.outputs[0]
    if not op.outputs[0] <= n_outputs <= op.outputs[1]:
        raise PlugrtError(f"n_outputs={n_outputs}, but {type(op).__name__} has {op.outputs[0]}..{op.outputs[1]} outputs")
    if not isinstance(example.attrs, Mapping):
        raise PlugrtError(f"attrs must be a mapping, got {type(example.attrs).__name__}")
    attrs = {key: numpy_helper.from_array(np.asarray(value), key) if isinstance(value, np.ndarray) else value
             for key, value in example.attrs.items()}
    try:
        model = single_node_model(op.op_type, feeds, attrs, constants, op.domain, example_opset(op, example), n_outputs)
    except (TypeError, ValueError) as exc:
        raise PlugrtError(f"cannot make an ONNX node of it: {type(exc).__name__}: {exc}") from None
    return model, specs


def draw_input(rng: np.random.Generator, dtype, shape: tuple, rule=None) -> np.ndarray:
    """Fresh random values for a runtime input, by the example's rule for it (see
    ``Example.ranges``); no rule: :func:`plugrt.bindings.random_input`."""
    from plugrt.bindings import random_input

    dtype = np.dtype(dtype)
    if rule is None or dtype.kind == "b":
        return random_input(rng, dtype, shape)
    if callable(rule):
        array = np.asarray(rule(rng, dtype, shape))
        if array.dtype != dtype or array.shape != tuple(shape):
            raise PlugrtError(f"the draw function returned {array.dtype}{list(array.shape)}, expected "
                              f"{dtype}{list(shape)}")
        return array
    try:
        low, high = rule
    except (TypeError, ValueError):
        raise PlugrtError(f"range {rule!r} is not a (low, high) pair or a function") from None
    if not low < high:
        raise PlugrtError(f"range {rule!r} is empty (low must be below high)")
    if dtype.kind == "f":
        return rng.uniform(low, high, shape).astype(dtype)
    return rng.integers(int(low), int(high), shape).astype(dtype)


def symbolic_inputs(graph, node) -> tuple[list, dict[str, int]]:
    """The node's input infos with every runtime dim above 1 a symbol (equal sizes share
    one, so relations between inputs hold), and each symbol's concrete size."""
    by_size: dict[int, str] = {}
    inputs = []
    for name in node.inputs:
        if not name:
            inputs.append(None)
            continue
        info = graph.info(name)
        if name not in graph.inputs:
            inputs.append(info)  # a constant: its value matters, keep it
            continue
        shape = tuple(d if d <= 1 else by_size.setdefault(d, f"s{len(by_size)}") for d in info.shape)
        inputs.append(TensorInfo(info.dtype, shape))
    return inputs, {symbol: size for size, symbol in by_size.items()}
