"""Fold the static dims of a dynamic shape: ``Gather(Shape(x), i)`` is a constant where
x's dim ``i`` is known, even when other dims of x are symbolic.

The TorchScript exporter writes every ``x.size(i)`` that way, also for the dims a model
fixes (a head size, a hidden size), so with a dynamic batch or sequence the bounds of a
``x[..., : x.shape[-1] // 2]`` (rotary embeddings) or the head dims of a ``view`` stay
computations and no pattern sees them as constants. Core constant folding takes a
Shape only when all of x's dims are static. Here each such Gather's output becomes an
initializer, and the values computed from it are inferred again, so arithmetic on it
(``// 2``, Unsqueeze, Concat with constants) is known to the passes after this one.
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import Graph, add_constant, constant_value, finish, remove_nodes, replace_value


def _static_dims(graph: Graph, gather, shape_node) -> np.ndarray | None:
    """The dims a Gather takes of a Shape's output, where all of them are ints."""
    x = graph.info(shape_node.inputs[0])
    indices = constant_value(graph, gather.inputs[1])
    if x is None or indices is None or indices.dtype.kind not in "iu" or gather.attrs.get("axis", 0) != 0:
        return None
    rank = x.rank
    start, end = 0, rank
    if shape_node.opset >= 15:
        start = shape_node.attrs.get("start") or 0
        end = rank if shape_node.attrs.get("end") is None else shape_node.attrs["end"]
        start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    selected = list(x.shape[start:max(start, end)])
    picked = []
    for index in indices.reshape(-1).tolist():
        if not -len(selected) <= index < len(selected) or not isinstance(selected[index], int):
            return None
        picked.append(selected[index])
    return np.array(picked, dtype=np.int64).reshape(indices.shape)


def run(graph: Graph, registry) -> int:
    """Replace every Gather of static dims of a Shape by a constant; return how many."""
    producers = graph.producers()
    replaced, constants = [], []
    for node in graph.nodes:
        shape_node = producers.get(node.inputs[0]) if node.op_type == "Gather" and node.inputs else None
        if shape_node is None or shape_node.op_type != "Shape" or constant_value(graph, node.outputs[0]) is not None:
            continue
        dims = _static_dims(graph, node, shape_node)
        if dims is None:
            continue
        constant = add_constant(graph, f"{node.name}/dims", dims)
        if replace_value(graph, node.outputs[0], constant):
            replaced.append(node)
            constants.append(constant)
    if not replaced:
        return 0
    remove_nodes(graph, replaced)
    _forget_downstream(graph, constants)
    finish(graph, registry)
    return len(replaced)


def _forget_downstream(graph: Graph, names: list[str]) -> None:
    """Drop the inferred types of every value computed from ``names``, so that inference
    runs again with their values known."""
    readers = graph.consumers()
    stack = [reader for name in names for reader in readers.get(name, [])]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for out in node.outputs:
            if out and out not in graph.inputs:
                graph.values[out].info = None
                stack += readers.get(out, [])
