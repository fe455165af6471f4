"""ONNX import: a ModelProto (or file) to a :class:`~plugrt.ir.Graph`.

Structure is checked first and every node no plugin provides is reported in one error;
then attributes are validated against each plugin's declaration, and shapes inferred.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from plugrt.errors import ModelError, PlugrtError, UnsupportedError
from plugrt.ir.attributes import check_names, missing_required, wrong_kind
from plugrt.ir.dims import shape_problem
from plugrt.ir.graph import Graph, Node, Value, topological_order
from plugrt.ir.infer import infer_graph
from plugrt.ir.validate import validate_graph
from plugrt.ir.tensor import TensorInfo
from plugrt.onnx.checks import check_name, check_value_names, printable
from plugrt.onnx.conditionals import cone, fold_conditionals
from plugrt.onnx.functions import expand_functions
from plugrt.plugin import OpPlugin, canonical_domain

_ATTRIBUTE_KINDS = {
    onnx.AttributeProto.FLOAT: "float",
    onnx.AttributeProto.INT: "int",
    onnx.AttributeProto.STRING: "string",
    onnx.AttributeProto.TENSOR: "tensor",
    onnx.AttributeProto.GRAPH: "graph",
    onnx.AttributeProto.FLOATS: "floats",
    onnx.AttributeProto.INTS: "ints",
    onnx.AttributeProto.STRINGS: "strings",
    onnx.AttributeProto.SPARSE_TENSOR: "sparse_tensor",
    onnx.AttributeProto.TYPE_PROTO: "type_proto",
}


def load_model(source: Any) -> onnx.ModelProto:
    """Read an ONNX model from a path, bytes or ModelProto, external data included.

    :raises ModelError: naming the file when it is missing, not a protobuf, truncated,
        or refers to external data that cannot be read.
    """
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _parse(bytes(source), "<bytes>")
    try:
        path = os.fspath(source)
    except TypeError:
        raise ModelError(f"cannot read a model from a {type(source).__name__}; give a file path, bytes or an "
                         "onnx.ModelProto") from None
    if not os.path.isfile(path):
        raise ModelError(f"model file {path!r} does not exist")
    with open(path, "rb") as f:
        data = f.read()
    model = _parse(data, path)
    try:
        onnx.external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    except (OSError, ValueError, TypeError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"model file {path!r}: cannot read its external data: {exc}") from None
    return model


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError, TypeError) as exc:
        raise ModelError(f"{label} is not a valid ONNX model (protobuf parse failed: {exc}); is the file truncated?") from None
    if not model.HasField("graph"):
        raise ModelError(f"{label} is not an ONNX model: it has no graph (an empty, truncated or foreign file?)")
    return model


def import_model(source: Any, registry=None, infer: bool = True) -> Graph:
    """Import an ONNX model into the IR and infer its shapes.

    :raises UnsupportedError: listing every node that no installed plugin provides.
    :raises ModelError: for structural problems, naming the node, value or file.
    """
    if registry is None:
        from plugrt.registry import default_registry

        registry = default_registry()
    model = load_model(source)
    graph = _build_graph(model, registry)
    if infer:
        infer_graph(graph, registry)
        validate_graph(graph, registry)
    return graph


def _graph_inputs(model: onnx.ModelProto) -> Graph:
    """A graph holding the model's opsets, initializers and inputs, no nodes yet."""
    opsets = {}
    for entry in model.opset_import:
        domain = check_name(entry.domain, "opset_import domain")
        opsets[canonical_domain(domain)] = int(entry.version)
    if not opsets:
        raise ModelError("the model imports no opset (opset_import is empty)")
    proto = model.graph
    graph = Graph(check_name(proto.name, "the graph's name") or "graph", opsets)
    for init in proto.initializer:
        name = check_name(init.name, "initializer", empty_ok=False)
        graph.add_const(name, _tensor_to_array(init, f"initializer {name!r}"))
    for sparse in proto.sparse_initializer:
        raise ModelError(f"sparse initializer {printable(sparse.values.name)} is not supported; densify it before import")
    for vi in proto.input:
        name = check_name(vi.name, "graph input", empty_ok=False)
        if name in graph.values:
            continue  # an initializer listed as input (IR < 4): a constant
        graph.add_input(name, _value_info(vi, "graph input"))
    return graph


def prepare_model(model: onnx.ModelProto, registry) -> onnx.ModelProto:
    """The model as the importer takes it: functions expanded and ``If`` nodes that shapes
    and constants decide replaced by their branch (:mod:`plugrt.onnx.functions`,
    :mod:`plugrt.onnx.conditionals`); ``model`` itself is never changed."""
    def evaluate(current: onnx.ModelProto, name: str):
        return _known_value(current, name, registry)

    return expand_functions(model, registry, fold=lambda m: fold_conditionals(m, evaluate), declines=_declines)


def _declines(op: OpPlugin, proto: onnx.NodeProto, opsets: dict) -> str | None:
    """Why ``op``'s plugin leaves ``proto`` to its ONNX function body (the node as the
    importer makes it: :meth:`plugrt.plugin.OpPlugin.declines`)."""
    node = _node(proto, 0, opsets)
    return op.declines(node.replace(attrs=_attributes(proto, node, op)))


def _known_value(model: onnx.ModelProto, name: str, registry):
    """``name``'s value where the plugins' shape inference knows it before the model runs
    (from initializers, constants and static dims), else None: the nodes it depends on are
    imported on their own and inferred."""
    nodes = cone(model, name)
    if nodes is None:
        return None
    needed = {n for node in nodes for n in node.input}
    slim = onnx.ModelProto()  # (only what the nodes read: a large model's weights stay where they are)
    slim.opset_import.extend(model.opset_import)
    slim.graph.initializer.extend(t for t in model.graph.initializer if t.name in needed)
    slim.graph.input.extend(v for v in model.graph.input if v.name in needed)
    try:
        graph = _graph_inputs(slim)
        opsets = graph.opsets
        for index, proto in enumerate(nodes):
            node = _node(proto, index, opsets)
            op = registry.find_op(node.domain, node.op_type, node.opset)
            if op is None:
                return None
            graph.add_node(node.replace(attrs=_attributes(proto, node, op)))
        infer_graph(graph, registry)
        info = graph.info(name)
    except (PlugrtError, KeyError):  # (a node the plugins refuse here: the condition stays unknown)
        return None
    return None if info is None or info.value is None else np.asarray(info.value)


def _build_graph(model: onnx.ModelProto, registry) -> Graph:
    model = prepare_model(model, registry)
    graph = _graph_inputs(model)
    opsets, proto = graph.opsets, model.graph
    nodes = [_node(proto_node, index, opsets) for index, proto_node in enumerate(proto.node)]
    _report_unsupported(nodes, registry)
    attributed = []
    for node, proto_node in zip(nodes, proto.node):
        op = registry.find_op(node.domain, node.op_type, node.opset)
        attributed.append(node.replace(attrs=_attributes(proto_node, node, op)))
    defined = set(graph.values)
    for node in topological_order(attributed, defined):
        graph.add_node(node)
    for vi in proto.output:
        name = check_name(vi.name, "graph output", empty_ok=False)
        if name not in graph.values:
            raise ModelError(f"graph output {name!r} is not produced by any node, input or initializer")
        if name in graph.outputs:
            raise ModelError(f"graph output {name!r} is listed twice; list each output once")
        graph.add_output(name)
    return graph


def _node(proto: onnx.NodeProto, index: int, opsets: dict[str, int]) -> Node:
    op_type = check_name(proto.op_type, f"the op type of node {index}", empty_ok=False)
    name = check_name(proto.name, f"the name of node {index} ({op_type})") or f"{op_type}_{index}"
    domain = check_name(proto.domain, f"node {name!r}: domain")
    domain = canonical_domain(domain)
    if domain not in opsets:
        raise ModelError(f"node {name!r} ({proto.op_type}) uses domain {domain or 'ai.onnx'!r}, which the model does not import")
    return Node(
        name=name,
        op_type=proto.op_type,
        domain=domain,
        inputs=check_value_names(proto.input, f"node {name!r}: input"),
        outputs=check_value_names(proto.output, f"node {name!r}: output"),
        opset=opsets[domain],
        origin=(name,),
    )


#: What an unsupported control-flow node's line adds.
CONTROL_FLOW = {
    "If": " (an If is replaced by its branch where shapes and constants decide its condition; this one's "
          "depends on input values or a dim the profile lets vary: export with that decided, or fix the dim)",
    "Loop": " (loops run only unrolled: export with a fixed trip count, tracing rather than scripting)",
    "Scan": " (loops run only unrolled: export with a fixed trip count, tracing rather than scripting)",
}


def _report_unsupported(nodes: list[Node], registry) -> None:
    missing = [n for n in nodes if registry.find_op(n.domain, n.op_type, n.opset) is None]
    if not missing:
        return
    lines = [
        f"  - node {n.name!r}: op {n.op_type}, domain {n.domain or 'ai.onnx'!r}, opset {n.opset}"
        + (CONTROL_FLOW.get(n.op_type, "") if not n.domain else "") for n in missing
    ]
    error = UnsupportedError(
        f"{len(missing)} node(s) are not supported by any installed plugin:\n" + "\n".join(lines)
        + "\ninstall a plugin that provides them (`plugrt plugins` lists what is installed)"
    )
    error.nodes = missing
    raise error


def _attributes(proto: onnx.NodeProto, node: Node, op: OpPlugin) -> dict[str, Any]:
    declared = {a.name: a for a in op.attributes}
    attrs: dict[str, Any] = {}
    for attr in proto.attribute:
        check_name(attr.name, f"{node.describe()}: attribute", empty_ok=False)
        if attr.name in attrs:
            raise ModelError(f"{node.describe()}: attribute {attr.name!r} is given twice")
        check_names(node, op, [attr.name])
        spec = declared[attr.name]
        if attr.ref_attr_name:
            raise ModelError(f"{node.describe()}: attribute {attr.name!r} refers to a function attribute; inline the function first")
        kind = _ATTRIBUTE_KINDS.get(attr.type, "undefined")
        if kind != spec.kind:
            raise wrong_kind(node, attr.name, spec.kind, kind)
        attrs[attr.name] = _attribute_value(attr, node)
    missing_required(node, op, attrs)
    for name, spec in declared.items():
        attrs.setdefault(name, spec.default)
    return attrs


def _attribute_value(attr: onnx.AttributeProto, node: Node) -> Any:
    value = onnx.helper.get_attribute_value(attr)
    try:
        if attr.type == onnx.AttributeProto.STRING:
            return value.decode("utf-8")
        if attr.type == onnx.AttributeProto.STRINGS:
            return [v.decode("utf-8") for v in value]
    except UnicodeDecodeError:
        raise ModelError(f"{node.describe()}: attribute {attr.name!r} holds a string that is not valid UTF-8; "
                         "fix the attribute in the model") from None
    if attr.type == onnx.AttributeProto.TENSOR:
        return _tensor_to_array(value, f"{node.describe()} attribute {attr.name!r}")
    if attr.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS):
        return list(value)
    return value


def _tensor_to_array(tensor: onnx.TensorProto, label: str) -> np.ndarray:
    if tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.raw_data:
        raise ModelError(f"{label}: its data is stored externally and was not loaded; import from the model's file path")
    try:
        return np.asarray(numpy_helper.to_array(tensor))
    except Exception as exc:
        raise ModelError(f"{label}: cannot decode tensor data ({type(exc).__name__}: {exc}); is the file truncated?") from None


def _value_info(vi: onnx.ValueInfoProto, what: str) -> TensorInfo:
    what = f"{what} {vi.name!r}"
    if vi.type.WhichOneof("value") != "tensor_type":
        raise UnsupportedError(f"{what}: only tensor inputs are supported, got {vi.type.WhichOneof('value')}")
    tensor_type = vi.type.tensor_type
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
    except Exception:
        raise ModelError(f"{what}: unknown element type {tensor_type.elem_type}") from None
    if not tensor_type.HasField("shape"):
        raise ModelError(f"{what} has no shape; export the model with input shapes")
    shape = []
    for axis, dim in enumerate(tensor_type.shape.dim):
        kind = dim.WhichOneof("value")
        if kind == "dim_value":
            shape.append(int(dim.dim_value))
        elif kind == "dim_param" and dim.dim_param:
            shape.append(check_name(dim.dim_param, f"{what}: the name of dim {axis}"))
        else:
            shape.append(f"{vi.name}_dim{axis}")
    problem = shape_problem(shape)
    if problem:
        raise ModelError(f"{what} has shape {shape}: {problem}; fix the model's input shape")
    return TensorInfo(dtype, tuple(shape))


def support_report(source: Any, registry=None) -> list[dict]:
    """Per node: whether a plugin supports it, and why not. Used by ``plugrt check``.

    Returns one dict per node with keys ``name``, ``op_type``, ``domain``, ``opset``,
    ``plugin`` and ``status`` (``"supported"``, ``"unsupported"``, ``"not checked"``),
    plus ``reason`` when not supported.
    """
    if registry is None:
        from plugrt.registry import default_registry

        registry = default_registry()
    from plugrt.ir.infer import infer_node

    model = prepare_model(load_model(source), registry)
    graph = _graph_inputs(model)
    opsets, proto = graph.opsets, model.graph
    report = []
    nodes = [_node(proto_node, index, opsets) for index, proto_node in enumerate(proto.node)]
    proto_of = {id(node): proto_node for node, proto_node in zip(nodes, proto.node)}
    for node in topological_order(nodes, set(graph.values)):
        proto_node = proto_of[id(node)]
        op = registry.find_op(node.domain, node.op_type, node.opset)
        entry = {"name": node.name, "op_type": node.op_type, "domain": node.domain or "ai.onnx",
                 "opset": node.opset, "plugin": None, "status": "supported"}
        report.append(entry)
        for name in node.outputs:
            if name and name not in graph.values:
                graph.values[name] = Value(name)
        if op is None:
            entry.update(status="unsupported", reason="no installed plugin provides this op at this opset")
            continue
        entry["plugin"] = registry.owner(op).name
        try:
            node = node.replace(attrs=_attributes(proto_node, node, op))
            graph.add_node(node)
            infer_node(graph, registry, node)
        except UnsupportedError as exc:
            entry.update(status="unsupported", reason=str(exc))
        except PlugrtError as exc:
            if any(n and graph.values.get(n) is not None and graph.values[n].info is None for n in node.inputs):
                entry.update(status="not checked", reason="an input comes from an unsupported node")
            else:
                entry.update(status="unsupported", reason=str(exc))
    return report

