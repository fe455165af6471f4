"""Shape and dtype inference over a graph, through each op plugin's ``infer``.

Inference also propagates known values: when every input of a node is a known constant
and the tensors are small, the node's ``reference`` runs at inference time (unless its
plugin is not ``foldable``, as random ops are). This is how
shape computations (Shape -> Gather -> Concat -> Reshape) resolve to constants when the
shapes are static, with no op-specific code in the core.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt.errors import ModelError, PlugrtError, ShapeError
from plugrt.ir.dims import format_shape, is_static, shape_problem
from plugrt.ir.graph import Graph, Node
from plugrt.ir.tensor import TensorInfo
from plugrt.plugin import VARIADIC

#: Largest number of elements, inputs and outputs together, computed at inference time.
VALUE_PROPAGATION_LIMIT = 1 << 16


def infer_graph(graph: Graph, registry, propagate_values: bool = True, sizes=None) -> None:
    """Fill in ``info`` for every node output, in topological order.

    ``sizes`` (given when every input shape is concrete: :func:`plugrt.ir.specialize.concretize`)
    sizes the outputs of data-dependent nodes (:meth:`plugrt.plugin.OpPlugin.output_bounds`):
    a mapping of node name to its outputs' actual shapes, the others by a rule of
    :data:`SIZE_RULES` (a mapping leaves them at ``"max"``, their bounds). Each such node's
    bounds are recorded in ``graph.data_dependent``.
    """
    for node in graph.nodes:
        outputs = infer_node(graph, registry, node, propagate_values)
        if sizes is not None and not all(is_static(o.shape) for o in outputs):
            _size_data_dependent(graph, registry.op(node), node, outputs, sizes)
    for name in graph.outputs:
        if graph.values.get(name) is None or graph.values[name].info is None:
            raise ShapeError(f"graph output {name!r} is not produced by any node, input or initializer")


def infer_node(graph: Graph, registry, node: Node, propagate_values: bool = True) -> list[TensorInfo]:
    op = registry.op(node)
    inputs = []
    for name in node.inputs:
        if not name:
            inputs.append(None)
            continue
        value = graph.values.get(name)
        if value is None or value.info is None:
            raise ShapeError(f"{node.describe()}: input {name!r} has no known type; is it produced by a later node?")
        inputs.append(value.info)
    outputs = run_infer(op, node, inputs)
    if propagate_values:
        outputs = _propagate_values(op, node, inputs, outputs)
    for name, info in zip(node.outputs, outputs):
        if name:
            graph.values[name].info = info
    return outputs


#: How :func:`infer_graph` sizes a data-dependent output's data-dependent dims: at their
#: bound, at 1, odd between, the largest power of two within (the shape-generic probes).
SIZE_RULES = ("max", "min", "odd", "even")


def _size_data_dependent(graph: Graph, op, node: Node, outputs: list[TensorInfo], sizes) -> None:
    inputs = [graph.info(name) if name else None for name in node.inputs]
    if not all(i is None or is_static(i.shape) for i in inputs):
        return
    bounds = op.output_bounds(node, inputs)
    if bounds is None:
        return  # (its output stays symbolic: the builder refuses the node)
    bounds = [tuple(int(d) for d in bound) for bound in bounds]
    given = sizes.get(node.name) if hasattr(sizes, "get") else None
    rule = "max" if hasattr(sizes, "get") else sizes
    if given is None:
        given = [tuple(_by_rule(rule, d) if isinstance(s, str) else d for s, d in zip(o.shape, bound))
                 for o, bound in zip(outputs, bounds)]
    for k, (name, info, bound, shape) in enumerate(zip(node.outputs, outputs, bounds, given)):
        shape = tuple(int(d) for d in shape)
        if len(bound) != len(info.shape) or len(shape) != len(bound) or any(
                not 0 <= d <= b or (isinstance(s, int) and d != s) for s, d, b in zip(info.shape, shape, bound)):
            raise ShapeError(f"{node.describe()}: output {k} has shape {list(shape)}, outside plugin "
                             f"{type(op).__name__}'s bound {list(bound)} for {format_shape(info.shape)}; the plugin's "
                             "output_bounds() must bound every shape its tactics report")
        if name:
            graph.values[name].info = TensorInfo(info.dtype, shape)
    graph.data_dependent[node.name] = bounds


def _by_rule(rule: str, bound: int) -> int:
    if rule == "min" or bound <= 1:
        return min(bound, 1)
    if rule == "odd":
        return (bound // 2) | 1
    if rule == "even":
        return 1 << (bound.bit_length() - 1)
    return bound


def run_infer(op, node: Node, inputs: list) -> list[TensorInfo]:
    """Call the plugin's ``check`` and ``infer`` and validate what comes back."""
    _check_arity(op, node)
    for i, info in enumerate(inputs):
        if info is not None and info.dtype not in op.dtypes:
            raise op.unsupported(node, f"input {i} of dtype {info.dtype}",
                                 "supported: " + ", ".join(sorted(str(d) for d in op.dtypes)))
    try:
        op.check(node, inputs)
        outputs = op.infer(node, inputs)
    except PlugrtError:
        raise
    except Exception as exc:
        raise ShapeError(
            f"{node.describe()}: shape inference failed in plugin {type(op).__name__}: "
            f"{type(exc).__name__}: {exc} (inputs: {_describe_inputs(inputs)})"
        ) from exc
    outputs = list(outputs)
    if len(outputs) < len(node.outputs):
        raise ShapeError(
            f"{node.describe()}: plugin {type(op).__name__} inferred {len(outputs)} outputs "
            f"but the node has {len(node.outputs)}"
        )
    outputs = outputs[: len(node.outputs)]
    for i, info in enumerate(outputs):
        if not isinstance(info, TensorInfo):
            raise ShapeError(f"{node.describe()}: plugin {type(op).__name__} returned {info!r} for output {i}")
        problem = shape_problem(info.shape)
        if problem:
            raise ShapeError(f"{node.describe()}: output {node.outputs[i]!r} would have shape "
                             f"{format_shape(info.shape)}: {problem} (inputs: {_describe_inputs(inputs)}); "
                             "check the model's shapes and shape-computing inputs")
    return outputs


def _check_arity(op, node: Node) -> None:
    for what, count, (low, high) in (("inputs", len(node.inputs), op.inputs), ("outputs", len(node.outputs), op.outputs)):
        if not low <= count <= high:
            bound = f"at least {low}" if high >= VARIADIC else f"{low}..{high}" if low != high else f"{low}"
            raise ModelError(f"{node.describe()}: has {count} {what}; plugin {type(op).__name__} takes {bound}")


def _propagate_values(op, node: Node, inputs: list, outputs: list[TensorInfo]) -> list[TensorInfo]:
    if not op.foldable:
        return outputs  # its outputs are no function of its inputs (random ops): never known
    present = [i for i in inputs if i is not None]
    if any(i.value is None for i in present):
        return outputs
    if all(o.value is not None for o in outputs):
        return outputs
    size = sum(int(np.size(i.value)) for i in present)
    for out in outputs:
        if not is_static(out.shape):
            return outputs
        size += math.prod(int(d) for d in out.shape)
    if size > VALUE_PROPAGATION_LIMIT:
        return outputs
    try:
        results = op.reference(node, [i.value if i is not None else None for i in inputs])
    except PlugrtError:
        raise
    except Exception as exc:
        raise ShapeError(f"{node.describe()}: reference failed on constant inputs: {type(exc).__name__}: {exc}") from exc
    propagated = []
    for info, result in zip(outputs, results):
        result = np.asarray(result)
        if result.dtype != info.dtype or result.shape != tuple(info.shape):
            raise ShapeError(
                f"{node.describe()}: plugin {type(op).__name__} inferred {info.dtype}{format_shape(info.shape)} "
                f"but its reference produced {result.dtype}{format_shape(result.shape)}"
            )
        propagated.append(info.with_value(result))
    return propagated


def _describe_inputs(inputs: list) -> str:
    return ", ".join("none" if i is None else f"{i.dtype}{format_shape(i.shape)}" for i in inputs)
