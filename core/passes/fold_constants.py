"""Constant folding: nodes whose outputs are known before running become initializers.

A node folds when its plugin is ``foldable`` and either every input it reads is an
initializer (the plugin's ``reference`` computes the outputs) or inference already knows
every output's value (``TensorInfo.value``: shape computations on static shapes, such as
Shape -> Gather -> Concat feeding a Reshape). Nodes are visited in topological order, so
a chain of constant nodes folds in one sweep.

Outputs keep their names: readers need no rerouting, and a folded graph output becomes an
initializer of the same name, which the engine returns as a host value.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt.errors import PlugrtError, ShapeError
from plugrt.ir.dims import format_shape
from plugrt.ir.graph import Graph, Node
from plugrt.passes.rewrite import finish

#: Folding never stores an output with more elements than this, or than the node's inputs
#: hold together, whichever is larger. A Transpose or Cast of a weight folds (it is no
#: larger than the weight); a ConstantOfShape, Expand or Tile that would blow a few
#: numbers up into a large tensor stays a node, generated on the device at run time
#: instead of bloating the plan.
FOLDING_LIMIT = 1 << 20


def run(graph: Graph, registry) -> int:
    """Replace every foldable node with known outputs by initializers; return how many."""
    kept, folded = [], 0
    for node in graph.nodes:
        arrays = _fold(graph, registry, node)
        if arrays is None:
            kept.append(node)
            continue
        for name, array in zip(node.outputs, arrays):
            if name:
                del graph.values[name]
                graph.add_const(name, np.asarray(array, order="C"))  # ascontiguousarray makes 0-d 1-d
        folded += 1
    if folded:
        graph.nodes = kept
        finish(graph, registry)
    return folded


def _fold(graph: Graph, registry, node: Node) -> list[np.ndarray] | None:
    """The node's output arrays if it folds within the size limit, else ``None``."""
    op = registry.op(node)
    if not op.foldable:
        return None
    outputs = [graph.info(name) for name in node.outputs]
    limit = max(FOLDING_LIMIT, _input_elements(graph, node))
    if any(info is not None and info.is_static and math.prod(info.shape) > limit for info in outputs):
        return None
    if all(info is None or info.value is not None for info in outputs):
        arrays = [None if info is None else info.value for info in outputs]
    elif all(not name or graph.values[name].is_const for name in node.inputs):
        arrays = _reference(op, node, [graph.values[name].const if name else None for name in node.inputs])
        if arrays is None:
            return None
    else:
        return None
    for name, info, array in zip(node.outputs, outputs, arrays):
        if not name:
            continue
        array = np.asarray(array)
        if array.size > limit:
            return None
        if array.dtype != info.dtype or (info.is_static and array.shape != tuple(info.shape)):
            raise ShapeError(f"{node.describe()}: inferred {info.dtype}{format_shape(info.shape)} for output "
                             f"{name!r} but folding produced {array.dtype}{format_shape(array.shape)}")
    return arrays


def _reference(op, node: Node, args: list) -> list[np.ndarray] | None:
    """Run the plugin's reference on constant inputs; ``None`` if the plugin has none."""
    try:
        results = list(op.reference(node, args))
    except NotImplementedError:
        return None
    except PlugrtError:
        raise
    except Exception as exc:
        raise PlugrtError(f"{node.describe()}: constant folding ran the reference of plugin {type(op).__name__}, "
                          f"which failed: {type(exc).__name__}: {exc}") from exc
    if len(results) < len(node.outputs):
        raise PlugrtError(f"{node.describe()}: reference of plugin {type(op).__name__} returned {len(results)} "
                          f"outputs, the node has {len(node.outputs)}")
    return results


def _input_elements(graph: Graph, node: Node) -> int:
    """Elements the node's inputs hold together (inputs of symbolic shape count 0)."""
    total = 0
    for name in node.inputs:
        info = graph.info(name)
        if info is not None and info.is_static:
            total += math.prod(info.shape)
    return total
