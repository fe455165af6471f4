"""The graph side of the precision step (:mod:`plugrt.engine.precision`): retyping the
chosen nodes' tensors, with the conversions and converted constants that takes."""

from __future__ import annotations

import numpy as np
from plugrt.errors import PlugrtError
from plugrt.ir.graph import Graph, Value
from plugrt.ir.infer import infer_node
from plugrt.ir.tensor import TensorInfo
from plugrt.passes.rewrite import finish, fresh_name, make_node
from plugrt.plugin import CONVERT

FP32, FP16 = "fp32", "fp16"
DTYPES = {FP32: np.dtype(np.float32), FP16: np.dtype(np.float16)}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
#: What inserted conversion nodes are called in the decisions (the ``reformat`` layers).
REFORMAT = "reformat"


def rewrite(graph: Graph, registry, choices: dict, slots: dict, host: set, decisions: dict,
            fp16_io: bool = False) -> int:
    """Retype the chosen nodes' tensors, inserting Casts and converted constants; the
    number of Casts inserted. A node left as it was reads its inputs in their model
    dtypes again, except a host node (it reads shapes, not data). With ``fp16_io`` the
    engine's float32 inputs and outputs become FP16 bindings."""
    original = {name: v.info.dtype for name, v in graph.values.items() if v.info is not None}
    if fp16_io:
        for name in graph.inputs:
            info = graph.values[name].info
            if info.dtype == DTYPES[FP32] and info.value is None:
                graph.values[name].info = TensorInfo(DTYPES[FP16], info.shape)
    casts: dict[tuple[str, str], str] = {}
    consts: dict[tuple[str, str], str] = {}
    opset = int(graph.opsets.get("", 17))
    nodes = list(graph.nodes)
    out: list = []

    def cast(name: str, precision: str) -> str:
        key = (name, precision)
        if key not in casts:
            target = fresh_name(graph, f"{name}_{precision}")
            node = _converter(graph, registry, name, target, precision, opset)
            graph.values[target] = Value(target)
            out.append(node)
            infer_node(graph, registry, node)
            decisions[node.name] = REFORMAT
            casts[key] = target
        return casts[key]

    def convert(name: str, precision: str) -> str:
        key = (name, precision)
        if key not in consts:
            target = fresh_name(graph, f"{name}_{precision}")
            graph.add_const(target, graph.values[name].const.astype(DTYPES[precision]))
            consts[key] = target
        return consts[key]

    for index, node in enumerate(nodes):
        precision = choices.get(index)
        inputs = list(node.inputs)
        for i, name in enumerate(inputs):
            if not name:
                continue
            current = graph.info(name).dtype
            if precision is not None and i in slots[index][0]:
                wanted = DTYPES[precision]
            elif index in host:
                continue
            else:
                wanted = original.get(name, current)
            if current == wanted or wanted not in NAMES or current not in NAMES:
                continue
            if graph.values[name].const is not None:
                inputs[i] = convert(name, NAMES[wanted])
            else:
                inputs[i] = cast(name, NAMES[wanted])
        node = node.replace(inputs=tuple(inputs))
        out.append(node)
        infer_node(graph, registry, node)  # its outputs' new dtypes, for the nodes after it
    graph.nodes = out
    for name in list(graph.outputs):
        info = graph.info(name)
        wanted = original.get(name)
        if fp16_io and wanted == DTYPES[FP32]:
            wanted = DTYPES[FP16]
        if wanted is not None and info.dtype != wanted and info.dtype in NAMES and wanted in NAMES:
            _restore_output(graph, registry, name, NAMES[wanted], opset, decisions)
    finish(graph, registry)
    return sum(1 for p in decisions.values() if p == REFORMAT)


def _restore_output(graph: Graph, registry, name: str, precision: str, opset: int, decisions: dict) -> None:
    """Make graph output ``name`` carry its model dtype again: its producer writes a new
    value, read by everyone, and a Cast writes ``name``."""
    inner = fresh_name(graph, f"{name}_{NAMES[graph.info(name).dtype]}")
    graph.values[inner] = Value(inner, graph.info(name))
    for i, node in enumerate(graph.nodes):
        if name in node.outputs or name in node.inputs:
            graph.nodes[i] = node.replace(outputs=tuple(inner if o == name else o for o in node.outputs),
                                          inputs=tuple(inner if o == name else o for o in node.inputs))
    node = _converter(graph, registry, inner, name, precision, opset)
    graph.values[name].info = None
    graph.nodes.append(node)
    infer_node(graph, registry, node)
    decisions[node.name] = REFORMAT


def _converter(graph: Graph, registry, source: str, target: str, precision: str, opset: int):
    """A node of an installed ``CONVERT`` op (:meth:`plugrt.plugin.OpPlugin.conversion`)
    writing ``source`` as ``precision`` to ``target``."""
    for op in registry.ops():
        if CONVERT not in op.groups:
            continue
        attrs = op.conversion(DTYPES[precision])
        if attrs is None:
            continue
        version = max(int(graph.opsets.get(op.domain, opset)), int(op.since_opset))
        node = make_node(graph, registry, op.op_type, [source], [target], dict(attrs), opset=version,
                         domain=op.domain, name=fresh_name(graph, f"{source}/to_{precision}"))
        if node is not None:
            return node
    raise PlugrtError(f"converting {source!r} to {precision}: no installed plugin has a CONVERT op for it (the "
                      "built-in elementwise plugin's Cast is one); reinstall plugrt or build without --fp16")
