"""``place_qdq`` (a ``quantize`` pass): an INT8 build's calibrated ranges become Q/DQ pairs
where the integer anchors can take them (TensorRT's implicit quantization, made explicit).

For each Conv (and the ``channels_last`` pass's ``plugrt.conv::ConvNHWC``), MatMul and
Gemm the build's :attr:`Graph.int8` does not exclude:

- each activation input with a calibrated range gets a QuantizeLinear -> DequantizeLinear
  pair (symmetric int8, scale ``amax / 127``, zero point 0), placed once per tensor and
  read by **every** reader of the tensor (the tensor is INT8 in memory, as in TensorRT;
  a graph output keeps its float value for the binding);
- a constant weight is quantized here, symmetrically per output channel (Conv's and
  ConvNHWC's axis 0, Gemm's B rows or columns, MatMul's B columns; scale
  ``max |w| / 127``), and read through a DequantizeLinear;

and ``fuse_qdq`` then turns the layer into its integer form (and records the decision).
A tensor made by ops that only move values (a MaxPool of a Relu; the ``channels_last``
pass's Transpose and channel Pad of zeros) is quantized above them with its input's range,
so they run on INT8 data too. A layer that cannot be quantized (an input with no range:
it was zero throughout calibration or a pass made it; a weight that is not constant where
it must be; a transposed A) stays in float, and the reason is recorded in
``Int8Request.fallbacks``, never silently.
"""

from __future__ import annotations

import numpy as np

from plugrt import PlugrtError
from plugrt.passes.pattern import add_constant, constant_value, finish, fresh_name, insert_nodes, make_node
from plugrt_builtin_ops.conv.nhwc_ops import DOMAIN as CONV_DOMAIN

from .fuse_qdq import FLOATS, moves_values, op_key
from .timed import slower_in_int8

NAME = "place_qdq"
#: Symmetric int8: weights use [-127, 127] (TensorRT's), activations clamp to [-128, 127].
LEVELS = 127.0


def run(graph, registry) -> int:
    request = graph.int8
    if request is None:
        return 0
    chosen = []
    for node in list(graph.nodes):  # decided on the graph as it is: no Q/DQ placed yet
        specify = _SPECS.get(op_key(node))
        if specify is None:
            continue
        if {node.name, *node.origin} & request.excluded:
            request.fall_back(node.name, "kept in float by the build's precision constraints")
            continue
        spec = specify(graph, node)
        required = bool({node.name, *node.origin} & request.required)  # the user's: not timed
        reason = spec if isinstance(spec, str) else _unquantizable(graph, node, spec, request.ranges) or (
            None if required else slower_in_int8(graph, registry, node, request))
        if reason and required and request.obey:
            raise PlugrtError(f"{node.describe()}: constrained to int8 (--precision-constraints obey), but {reason}; "
                              "drop the constraint or use --precision-constraints prefer")
        if reason:
            request.fall_back(node.name, reason)
            continue
        chosen.append((node, spec))
    placed: dict[str, str] = {}
    count = 0
    readers, producers = graph.consumers(), graph.producers()
    for node, spec in chosen:
        inputs = list(node.inputs)  # (as first seen: a tensor quantized since reads through its DQ, found by name)
        for index, axis in spec:
            name = inputs[index]
            if axis is None:
                source = _source(graph, registry, name, request.ranges, readers, producers)
                if source not in placed:
                    placed[source] = _quantize_activation(graph, registry, source, request.ranges[source])
                inputs[index] = placed[source] if source == name else name
            else:
                inputs[index] = _quantize_weight(graph, registry, name, axis, node)
        position = _position(graph, node)
        graph.nodes[position] = graph.nodes[position].replace(inputs=tuple(inputs))
        count += 1
    if count:
        finish(graph, registry)
    return count


def _source(graph, registry, name: str, ranges, readers, producers) -> str:
    """Where to quantize ``name``: above the ops that only move values (MaxPool, Reshape,
    ...: ``fuse_qdq`` moves the DQ below them, so they run on INT8 data) as far as each
    step's input has a range, is read by that op alone, and the op takes int8."""
    while True:
        node = producers.get(name)
        if not moves_values(node, True):  # (the activations' zero point is 0)
            return name
        above, op = node.inputs[0], registry.find_op(node.domain, node.op_type, node.opset)
        if (above not in ranges or len(readers.get(above, [])) != 1 or above in graph.outputs or op is None
                or np.dtype(np.int8) not in op.dtypes):
            return name
        name = above


def _position(graph, node) -> int:
    """Where ``node`` (or the copy of it a rerouting made) is now."""
    return next(i for i, other in enumerate(graph.nodes) if other.name == node.name)


def _conv(graph, node):
    if len(graph.info(node.inputs[0]).shape) not in (3, 4):
        return "only 1-D and 2-D convolutions have an INT8 kernel"
    if constant_value(graph, node.inputs[1]) is None:
        return "its weight is not a constant, so it has no per-channel INT8 scales"
    return [(0, None), (1, 0)]


def _matmul(graph, node):
    weight = constant_value(graph, node.inputs[1])
    if weight is not None and weight.ndim == 2:
        return [(0, None), (1, 1)]
    return [(0, None), (1, None)]


def _gemm(graph, node):
    if node.attrs.get("transA", 0):
        return "its A operand is transposed (transA=1), which the INT8 GEMM does not read"
    if constant_value(graph, node.inputs[1]) is None:
        if node.attrs.get("transB", 0):
            return "its B operand is transposed (transB=1) and not a constant"
        return [(0, None), (1, None)]
    return [(0, None), (1, 0 if node.attrs.get("transB", 0) else 1)]


#: (domain, op type) -> the inputs to quantize, as ``[(index, weight axis or None)]``, or why not.
_SPECS = {("", "Conv"): _conv, (CONV_DOMAIN, "ConvNHWC"): _conv, ("", "MatMul"): _matmul, ("", "Gemm"): _gemm}


def _unquantizable(graph, node, spec, ranges) -> str | None:
    for index, axis in spec:
        name = node.inputs[index]
        info = graph.info(name)
        if info is None or np.dtype(info.dtype) not in FLOATS:
            return f"input {name!r} is {getattr(info, 'dtype', 'untyped')}, not float32/float16"
        if axis is None and name not in ranges:
            return (f"input {name!r} has no calibrated range (it was zero or absent throughout calibration, "
                    "or a graph pass made it); give calibration data that exercises it")
    return None


def _opset(graph, dtype) -> int:
    """QuantizeLinear/DequantizeLinear's opset: 13 (per-axis), 19 for float16 scales."""
    return max(19 if np.dtype(dtype) == np.float16 else 13, min(int(graph.opsets.get("", 13)), 21))


def _quantize_activation(graph, registry, name: str, amax: float) -> str:
    """Insert Q -> DQ after ``name``; reroute every reader but the Q to the DQ's output."""
    dtype = np.dtype(graph.info(name).dtype)
    scale = add_constant(graph, f"{name}/scale", np.asarray(amax / LEVELS, dtype))
    zero = add_constant(graph, f"{name}/zero_point", np.asarray(0, np.int8))
    quantized, restored = fresh_name(graph, f"{name}/quantized"), fresh_name(graph, f"{name}/dequantized")
    opset = _opset(graph, dtype)
    quantize = make_node(graph, registry, "QuantizeLinear", [name, scale, zero], [quantized], opset=opset,
                         name=fresh_name(graph, f"{name}/QuantizeLinear"))
    dequantize = make_node(graph, registry, "DequantizeLinear", [quantized, scale, zero], [restored], opset=opset,
                           name=fresh_name(graph, f"{name}/DequantizeLinear"))
    for index, reader in enumerate(graph.nodes):
        if name in reader.inputs:
            graph.nodes[index] = reader.replace(inputs=tuple(restored if i == name else i for i in reader.inputs))
    producers = graph.producers()
    at = graph.nodes.index(producers[name]) + 1 if name in producers else 0
    insert_nodes(graph, at, [quantize, dequantize])
    return restored


def _quantize_weight(graph, registry, name: str, axis: int, node) -> str:
    """A constant weight as int8 (per channel along ``axis``) read through a DQ."""
    weight = constant_value(graph, name).astype(np.float64)
    others = tuple(d for d in range(weight.ndim) if d != axis)
    amax = np.max(np.abs(weight), axis=others) if others else np.abs(weight)
    scales = np.where(amax > 0, amax / LEVELS, 1.0).astype(graph.info(name).dtype)
    shape = [1] * weight.ndim
    shape[axis] = -1
    codes = np.clip(np.rint(weight / scales.astype(np.float64).reshape(shape)), -LEVELS, LEVELS).astype(np.int8)
    stem = f"{node.name}/{name}"
    quantized = add_constant(graph, f"{stem}/int8", codes)
    scale = add_constant(graph, f"{stem}/scale", scales)
    zero = add_constant(graph, f"{stem}/zero_point", np.zeros(scales.shape, np.int8))
    restored = fresh_name(graph, f"{stem}/dequantized")
    dequantize = make_node(graph, registry, "DequantizeLinear", [quantized, scale, zero], [restored],
                           {"axis": axis}, opset=_opset(graph, scales.dtype),
                           name=fresh_name(graph, f"{stem}/DequantizeLinear"))
    insert_nodes(graph, _position(graph, node), [dequantize])
    return restored
