"""Concrete shapes for a graph with symbolic dims: re-run inference at given input shapes.

Shape computations (Shape, Gather on shapes, Concat, arithmetic) resolve to known values
through inference's value propagation, which is how the engine computes them on the host.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from plugrt.ir.graph import Graph
from plugrt.ir.infer import infer_graph
from plugrt.ir.tensor import TensorInfo


def concretize(graph: Graph, shapes: Mapping[str, tuple[int, ...]], registry,
               values: Mapping[str, np.ndarray] | None = None, sizes="max") -> Graph:
    """A copy of ``graph`` with every value's shape inferred for these input shapes
    (and these values of shape-tensor inputs). ``sizes`` sizes data-dependent outputs: a
    mapping of node name to its outputs' shapes (read after the node ran), the others at
    their bounds; or a rule of :data:`plugrt.ir.infer.SIZE_RULES` for all of them."""
    values = values or {}
    concrete = graph.copy()
    for name in concrete.inputs:
        info = concrete.values[name].info
        shape = tuple(int(d) for d in shapes[name])
        value = None
        if name in values:
            value = np.asarray(values[name], dtype=info.dtype).reshape(shape)
        concrete.values[name].info = TensorInfo(info.dtype, shape, value)
    for node in concrete.nodes:
        for out in node.outputs:
            if out:
                concrete.values[out].info = None
    concrete.data_dependent = {}
    infer_graph(concrete, registry, sizes=sizes)
    return concrete


def is_host_node(graph: Graph, node) -> bool:
    """True when inference already knows every output's value (computed on the host)."""
    return all(graph.info(name).value is not None for name in node.outputs if name)
