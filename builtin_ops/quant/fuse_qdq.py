"""``fuse_qdq`` (a ``quantize`` pass): Q/DQ around an anchor become its integer form, as
TensorRT's Q/DQ fusion does, for the model's own Q/DQ nodes (explicit quantization, e.g.
``onnxruntime.quantization.quantize_static``'s QDQ format) and ``place_qdq``'s alike.

- ``Conv(DQ(xq), DQ(wq), B)`` -> ``ConvInteger(xq, wq, x_zp, w_zp)`` -> Cast -> Mul by
  ``x_scale * w_scale`` (per output channel) -> Add ``B``;
- ``plugrt.conv::ConvNHWC(DQ(xq), DQ(wq), B)`` (the ``channels_last`` pass's) likewise ->
  ``plugrt.quant::ConvIntegerNHWC``, the factor and bias along the last axis;
- ``MatMul(DQ(aq), DQ(bq))`` -> ``MatMulInteger`` -> Cast -> Mul (per column);
- ``Gemm(DQ(aq), DQ(bq), C)`` -> ``MatMulInteger`` (a constant transposed B stored
  transposed) -> Cast -> Mul by ``alpha * scales`` -> Add ``beta * C``.

The Cast/Mul/Add after the integer anchor, and the activation, residual ``Add`` of a
``DQ(int8)`` and the ``QuantizeLinear`` that follow it, are one epilogue to the core's
epilogue fusion: an INT8 layer reads INT8, accumulates in int32 and stores INT8 (or float
where its reader is float), with no standalone quantize kernel between layers.

Data movement commutes with a per-tensor DQ (scale > 0): ``MaxPool``/``Reshape``/
``Flatten``/``Transpose``/``Squeeze``/``Unsqueeze``/``Identity`` and the channels-last
``plugrt.pooling::MaxPoolNHWC`` of ``DQ(q)`` run on ``q`` itself (:data:`MOVERS`, where
the op takes ``q``'s dtype), and so does a Pad adding zeros where the DQ's zero point is 0
(the ``channels_last`` pass's channel padding: its zeros stay zeros), and ``Q(DQ(q))``
with the same scale and zero point is ``q``.
A DQ of constants left over (a weight whose reader has no integer form) is folded into a
float constant.
"""

from __future__ import annotations

import numpy as np

from plugrt.passes.pattern import (Int8Request, add_constant, constant_value, finish, fresh_name, insert_nodes,
                                   make_node, remove_nodes)
from plugrt_builtin_ops.conv.nhwc_ops import DOMAIN as CONV_DOMAIN
from plugrt_builtin_ops.pooling.nhwc_ops import DOMAIN as POOLING_DOMAIN

from .nhwc_ops import DOMAIN

NAME = "fuse_qdq"
INTS = (np.dtype(np.int8), np.dtype(np.uint8))
#: The float dtypes a quantized layer may compute in.
FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
#: The attributes a convolution's integer form keeps.
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
#: Cast's ``to`` for the float dtypes an integer anchor's result is rescaled into.
CAST_TO = {np.dtype(np.float32): 1, np.dtype(np.float16): 10}
#: Ops (domain, op type) through which a per-tensor DQ moves (they only move or select values).
MOVERS = frozenset([("", "MaxPool"), ("", "Reshape"), ("", "Flatten"), ("", "Transpose"), ("", "Squeeze"),
                    ("", "Unsqueeze"), ("", "Identity"), (POOLING_DOMAIN, "MaxPoolNHWC")])


def op_key(node) -> tuple[str, str]:
    """``(domain, op_type)`` of ``node``, ONNX's ``ai.onnx`` written as ``""``."""
    return ("" if node.domain == "ai.onnx" else node.domain, node.op_type)


def moves_values(node, zero_point_is_zero: bool) -> bool:
    """Whether a per-tensor DQ moves through ``node``: one of :data:`MOVERS`, or, where
    the DQ's zero point is 0, a constant-mode Pad of zeros (no ``value``, no
    ``constant_value`` input)."""
    if node is None or not node.inputs:
        return False
    if op_key(node) in MOVERS:
        return True
    return (zero_point_is_zero and op_key(node) == ("", "Pad") and node.attrs.get("mode", "constant") == "constant"
            and not node.attrs.get("value", 0.0) and not (len(node.inputs) > 2 and node.inputs[2]))


class Dq:
    """A DequantizeLinear output's parts: ``x`` (its int8/uint8 input), constant ``scale``
    and ``zero`` (int array, zeros when omitted), ``axis``, and the node."""

    def __init__(self, node, x, scale, zero, axis):
        self.node, self.x, self.scale, self.zero, self.axis = node, x, scale, zero, axis

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zero.size == 1


def dequantized(graph, producers, name: str) -> Dq | None:
    """The DQ producing ``name``, when its scale and zero point are constants."""
    node = producers.get(name)
    if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    info = graph.info(node.inputs[0])
    if info is None or np.dtype(info.dtype) not in INTS or node.attrs.get("block_size", 0):
        return None
    scale = constant_value(graph, node.inputs[1])
    zero_name = node.inputs[2] if len(node.inputs) > 2 else ""
    zero = constant_value(graph, zero_name) if zero_name else np.zeros(1, np.dtype(info.dtype))
    if scale is None or zero is None or not np.all(np.asarray(scale) > 0):
        return None
    return Dq(node, node.inputs[0], np.asarray(scale), np.asarray(zero), int(node.attrs.get("axis", 1)))


def run(graph, registry) -> int:
    count = 0
    while moved := _move_dequantize(graph, registry):
        finish(graph, registry)  # (types of the moved values, which the next move and the rewrites read)
        count += moved
    for node in list(graph.nodes):
        rewrite = _REWRITES.get(op_key(node))
        if rewrite is None:
            continue
        producers = graph.producers()
        if rewrite(graph, registry, node, producers):
            count += 1
            if graph.int8 is None:
                graph.int8 = Int8Request()  # an explicitly quantized model: report its INT8 layers
            graph.int8.decisions[node.name] = "int8"
        elif graph.int8 is not None and any(dequantized(graph, producers, name) for name in node.inputs if name):
            graph.int8.fall_back(node.name, "the Q/DQ around it do not fit an integer layer (per-channel "
                                 "activations, a computed weight or bias, a transposed operand); it runs in float "
                                 "on the dequantized values")
    count += _cancel_pairs(graph) + _fold_constants(graph, registry)
    if count:
        finish(graph, registry)
    return count


def _zero_input(graph, dq: Dq, stem: str, per_channel_ok: bool) -> str | None:
    """The zero point as an integer anchor input: ``""`` when all zero, else a constant."""
    if not np.any(dq.zero):
        return ""
    if dq.zero.size > 1 and not per_channel_ok:
        return None
    value = dq.zero.reshape(()) if dq.zero.size == 1 else dq.zero.reshape(-1)
    return add_constant(graph, f"{stem}/zero_point", value.astype(dq.zero.dtype))


def _rescale(graph, registry, node, accumulator: str, factor: np.ndarray, bias: np.ndarray | None,
             bias_name: str | None, out_dtype) -> list:
    """Cast -> Mul(factor) [-> Add(bias)] [-> Cast to FP16] writing ``node``'s output.

    The rescale computes in FP32 whatever the layer's output dtype: an int32 accumulator
    exceeds FP16's range, and ``x_scale * w_scale`` can be below its normal numbers. Its
    nodes are recorded in ``graph.int8.float32`` so that the precision step keeps them
    there (they fuse into the integer layer's epilogue all the same)."""
    stem, origin = node.name, node.origin or (node.name,)
    cast_out, scaled = fresh_name(graph, f"{stem}/int32_as_float"), fresh_name(graph, f"{stem}/rescaled")
    nodes = [make_node(graph, registry, "Cast", [accumulator], [cast_out], {"to": CAST_TO[np.dtype(np.float32)]},
                     opset=13, name=fresh_name(graph, f"{stem}/Cast"), origin=origin)]
    half = np.dtype(out_dtype) == np.float16
    final = fresh_name(graph, f"{stem}/float32") if half else node.outputs[0]
    last = final if bias is None and bias_name is None else scaled
    nodes.append(make_node(graph, registry, "Mul", [cast_out, add_constant(graph, f"{stem}/scale",
                                                                           factor.astype(np.float32))],
                           [last], opset=14, name=fresh_name(graph, f"{stem}/Mul"), origin=origin))
    if bias is not None or bias_name is not None:
        addend = bias_name or add_constant(graph, f"{stem}/bias", bias.astype(np.float32))
        nodes.append(make_node(graph, registry, "Add", [scaled, addend], [final], opset=14,
                               name=fresh_name(graph, f"{stem}/Add"), origin=origin))
    if half:
        nodes.append(make_node(graph, registry, "Cast", [final], [node.outputs[0]], {"to": CAST_TO[np.dtype(out_dtype)]},
                               opset=13, name=fresh_name(graph, f"{stem}/CastHalf"), origin=origin))
    if graph.int8 is None:
        graph.int8 = Int8Request()
    graph.int8.float32.update(n.name for n in nodes if n is not None)
    return nodes


def _replace(graph, node, nodes: list) -> bool:
    if any(n is None for n in nodes):
        return False
    at = graph.nodes.index(node)
    remove_nodes(graph, [node])
    insert_nodes(graph, at, nodes)
    return True


def _conv(graph, registry, node, producers) -> bool:
    """Conv, or ConvNHWC (channels last: ConvIntegerNHWC, the rescale along the last axis)."""
    channels_last = op_key(node) == (CONV_DOMAIN, "ConvNHWC")
    x, w = dequantized(graph, producers, node.inputs[0]), dequantized(graph, producers, node.inputs[1])
    out = graph.info(node.outputs[0])
    if x is None or w is None or not x.per_tensor or out is None or np.dtype(out.dtype) not in CAST_TO:
        return False
    weights = constant_value(graph, w.x)
    if weights is None or weights.ndim not in (3, 4) or (not w.per_tensor and w.axis not in (0, -weights.ndim)):
        return False
    channels = weights.shape[0]
    bias_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    bias = constant_value(graph, bias_name) if bias_name else None
    if bias_name is not None and bias is None:
        return False  # a bias computed at run time: leave the layer in float
    x_zero, w_zero = _zero_input(graph, x, f"{node.name}/x", False), _zero_input(graph, w, f"{node.name}/w", True)
    if x_zero is None or w_zero is None:
        return False
    accumulator = fresh_name(graph, f"{node.name}/int32")
    inputs = [x.x, w.x, x_zero, w_zero]
    while inputs and inputs[-1] == "":
        inputs.pop()
    attrs = {k: v for k, v in node.attrs.items() if k in CONV_ATTRS}
    if channels_last:
        integer = make_node(graph, registry, "ConvIntegerNHWC", inputs, [accumulator], attrs, opset=1, domain=DOMAIN,
                            name=node.name, origin=node.origin or (node.name,))
        graph.opsets.setdefault(DOMAIN, 1)
        shape = (1,) * (weights.ndim - 1) + (channels,)
    else:
        integer = make_node(graph, registry, "ConvInteger", inputs, [accumulator], attrs, opset=10, name=node.name,
                            origin=node.origin or (node.name,))
        shape = (1, channels) + (1,) * (weights.ndim - 2)
    factor = (np.float64(x.scale.reshape(())) * np.broadcast_to(w.scale.astype(np.float64).reshape(-1),
                                                                 (channels,))).reshape(shape)
    if bias is not None:
        bias = bias.astype(np.float64).reshape(shape)
    return _replace(graph, node, [integer] + _rescale(graph, registry, node, accumulator, factor, bias, None,
                                                      np.dtype(out.dtype)))


def _matmul_like(graph, registry, node, producers, b_transposed: bool, alpha: float, c_name: str | None,
                 beta: float) -> bool:
    a, b = dequantized(graph, producers, node.inputs[0]), dequantized(graph, producers, node.inputs[1])
    out = graph.info(node.outputs[0])
    if a is None or b is None or not a.per_tensor or out is None or np.dtype(out.dtype) not in CAST_TO:
        return False
    b_name, b_info = b.x, graph.info(b.x)
    rank = len(b_info.shape)
    columns_axis = rank - 2 if b_transposed else rank - 1
    if not b.per_tensor and (rank != 2 or b.axis % rank != columns_axis):
        return False
    c = constant_value(graph, c_name) if c_name else None
    if c_name and c is None:
        return False  # a C computed at run time: leave the layer in float
    if b_transposed:
        codes = constant_value(graph, b.x)
        if codes is None:
            return False
        b_name = add_constant(graph, f"{node.name}/{b.x}/transposed", np.ascontiguousarray(codes.T))
    a_zero, b_zero = _zero_input(graph, a, f"{node.name}/a", False), _zero_input(graph, b, f"{node.name}/b", True)
    if a_zero is None or b_zero is None:
        return False
    accumulator = fresh_name(graph, f"{node.name}/int32")
    inputs = [a.x, b_name, a_zero, b_zero]
    while inputs and inputs[-1] == "":
        inputs.pop()
    integer = make_node(graph, registry, "MatMulInteger", inputs, [accumulator], opset=10, name=node.name,
                        origin=node.origin or (node.name,))
    factor = alpha * np.float64(a.scale.reshape(())) * b.scale.astype(np.float64).reshape(-1)
    factor = factor.reshape(()) if factor.size == 1 else factor
    bias = None if c is None else beta * c.astype(np.float64)
    return _replace(graph, node, [integer] + _rescale(graph, registry, node, accumulator, factor, bias, None,
                                                      np.dtype(out.dtype)))


def _matmul(graph, registry, node, producers) -> bool:
    return _matmul_like(graph, registry, node, producers, False, 1.0, None, 0.0)


def _gemm(graph, registry, node, producers) -> bool:
    if node.attrs.get("transA", 0):
        return False
    c_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    return _matmul_like(graph, registry, node, producers, bool(node.attrs.get("transB", 0)),
                        float(node.attrs.get("alpha", 1.0)), c_name, float(node.attrs.get("beta", 1.0)))


_REWRITES = {("", "Conv"): _conv, (CONV_DOMAIN, "ConvNHWC"): _conv, ("", "MatMul"): _matmul, ("", "Gemm"): _gemm}


def _move_dequantize(graph, registry) -> int:
    """``Mover(DQ(q))`` -> ``DQ(Mover(q))`` for per-tensor DQs whose mover takes int8."""
    moved = 0
    for node in list(graph.nodes):
        if not moves_values(node, True):
            continue
        dq = dequantized(graph, graph.producers(), node.inputs[0])
        op = registry.find_op(node.domain, node.op_type, node.opset)
        if (dq is None or not dq.per_tensor or not moves_values(node, not np.any(dq.zero)) or op is None
                or np.dtype(graph.info(dq.x).dtype) not in op.dtypes):
            continue
        inner = fresh_name(graph, f"{node.outputs[0]}/quantized")
        moved_node = node.replace(inputs=(dq.x,) + tuple(node.inputs[1:]), outputs=(inner,) + tuple(node.outputs[1:]))
        after = dq.node.replace(name=fresh_name(graph, f"{node.name}/DequantizeLinear"),
                                inputs=(inner,) + tuple(dq.node.inputs[1:]), outputs=(node.outputs[0],),
                                attrs={**dq.node.attrs, "axis": 1})
        _replace(graph, node, [moved_node, after])
        moved += 1
    return moved


def _cancel_pairs(graph) -> int:
    """``Q(DQ(q))`` with the same scale, zero point and dtype is ``q``: its readers read ``q``."""
    producers, cancelled = graph.producers(), []
    for node in graph.nodes:
        if node.op_type != "QuantizeLinear" or node.domain not in ("", "ai.onnx") or node.outputs[0] in graph.outputs:
            continue
        dq = dequantized(graph, producers, node.inputs[0])
        scale = constant_value(graph, node.inputs[1])
        zero = constant_value(graph, node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        if dq is None or scale is None or not dq.per_tensor or scale.size != 1:
            continue
        zero = np.zeros(1, np.uint8) if zero is None else zero
        if (np.float64(scale.reshape(())) != np.float64(dq.scale.reshape(())) or zero.dtype != dq.zero.dtype
                or int(zero.reshape(())) != int(dq.zero.reshape(())) or graph.info(dq.x).dtype != zero.dtype):
            continue
        for index, reader in enumerate(graph.nodes):
            if node.outputs[0] in reader.inputs:
                graph.nodes[index] = reader.replace(inputs=tuple(dq.x if i == node.outputs[0] else i
                                                                 for i in reader.inputs))
        cancelled.append(node)
    remove_nodes(graph, [n for n in graph.nodes if any(n.name == c.name for c in cancelled)])
    return len(cancelled)


def _fold_constants(graph, registry) -> int:
    """A DQ whose inputs are all constants becomes a float constant (no kernel)."""
    folded = []
    for node in graph.nodes:
        if node.op_type != "DequantizeLinear" or node.outputs[0] in graph.outputs:
            continue
        args = [constant_value(graph, name) if name else None for name in node.inputs]
        if any(a is None for a, name in zip(args, node.inputs) if name):
            continue
        value = registry.op(node).reference(node, args)[0]
        name = add_constant(graph, f"{node.outputs[0]}/folded", np.asarray(value))
        for index, reader in enumerate(graph.nodes):
            if node.outputs[0] in reader.inputs:
                graph.nodes[index] = reader.replace(inputs=tuple(name if i == node.outputs[0] else i
                                                                 for i in reader.inputs))
        folded.append(node)
    remove_nodes(graph, folded)
    return len(folded)
