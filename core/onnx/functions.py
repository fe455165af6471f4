"""Nodes that are functions, expanded into the ops they are made of.

Two kinds reach the importer:

- a model's **local functions** (``ModelProto.functions``: what ``export_modules_as_functions``,
  onnxscript and some converters write), called by nodes of the function's domain;
- **standard ops defined as functions** of other standard ops (their schema carries a
  function body): ``RotaryEmbedding`` at opset 23, the window functions,
  ``CenterCropPad``, ``SwiGLU``, the losses, and those the installed plugins provide in
  part (the contrib attention plugin's ``Attention``, which declines a node with softcap
  or the ``qk_matmul_output`` output).

A standard op a plugin provides stays one node (a plugin's kernel beats the ops of its
body), unless the plugin declines that node (:meth:`plugrt.plugin.OpPlugin.declines`: an
attribute or optional input it does not implement). One that no plugin provides, or that
its plugin declines, is replaced by its schema's body for this node (a context-dependent
body is built from the node's attributes and its inputs' types, which ONNX's shape
inference gives), and local functions are inlined, by ONNX's own inliner, which also
converts a body written for another opset to the model's. What remains unsupported after
that is reported as before, by node.
"""

from __future__ import annotations

import logging

import onnx
import onnx.defs
import onnx.inliner
import onnx.shape_inference

import numpy as np

from plugrt.errors import ModelError
from plugrt.onnx.checks import printable
from plugrt.plugin import canonical_domain

log = logging.getLogger("plugrt.builder")

#: The domain an expanded standard op's body is inlined through (gone once inlined).
EXPANDED = "plugrt.expanded"
#: Bodies may call further function ops (expanded again): at most this deep.
DEPTH = 4
#: Initializers over this many elements reach ONNX's shape inference as typed inputs only.
LIGHT_ELEMENTS = 1 << 16


def expand_functions(model: onnx.ModelProto, registry, fold=None, declines=None) -> onnx.ModelProto:
    """``model`` with its local functions inlined and every standard op that no plugin
    provides, or that ``declines(op, node, opsets)`` says its plugin declines, but ONNX
    defines as a function expanded; ``model`` itself when there is nothing to do (it is
    never changed). ``fold(model)``, when given, runs before each round and after the last
    (bodies branch on what shapes decide: ``If`` nodes)."""
    fold = fold or (lambda m: m)
    if model.functions:
        model = _inline(model, "the model's local functions")
    for _ in range(DEPTH):
        model = fold(model)
        opsets = {canonical_domain(entry.domain): entry.version for entry in model.opset_import}
        wanted = [k for k, node in enumerate(model.graph.node) if _expandable(node, opsets, registry, declines)]
        if not wanted:
            return model
        model = copy_model(model)
        types = _value_types(model) if any(_schema(model.graph.node[k], opsets).has_context_dependent_function
                                           for k in wanted) else {}
        expanded = 0
        for k in wanted:
            node = model.graph.node[k]
            try:
                body = _body(node, opsets, types)
            except Exception:  # noqa: BLE001 - ONNX could not build it: the node is reported unsupported
                body = None
            if body is None:
                continue
            _fill_defaults(node, _schema(node, opsets))  # (the body refers to them; the inliner needs them given)
            body.domain, body.name = EXPANDED, f"{node.op_type}_{k}"
            node.domain, node.op_type = EXPANDED, body.name
            model.functions.append(body)
            expanded += 1
        if not expanded:
            return model
        model.opset_import.append(onnx.helper.make_opsetid(EXPANDED, 1))
        labels = ", ".join(f"node {printable(model.graph.node[k].name or model.graph.node[k].op_type)}" for k in wanted)
        model = _inline(model, labels)
        kept = [entry for entry in model.opset_import if entry.domain != EXPANDED]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return fold(model)


def _schema(node: onnx.NodeProto, opsets: dict):
    domain = canonical_domain(node.domain)
    if domain not in opsets:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opsets[domain], domain)
    except Exception:  # noqa: BLE001 - no such schema, or names and versions ONNX cannot take
        return None


def _expandable(node: onnx.NodeProto, opsets: dict, registry, declines) -> bool:
    domain = canonical_domain(node.domain)
    if domain not in opsets:
        return False
    op = registry.find_op(domain, node.op_type, opsets[domain])
    schema = _schema(node, opsets)
    if schema is None or not (schema.has_function or schema.has_context_dependent_function):
        return False
    return op is None or _declined(op, node, opsets, declines)


def _declined(op, proto: onnx.NodeProto, opsets: dict, declines) -> bool:
    """Whether the plugin providing ``proto``'s op leaves it to its function body
    (``declines(op, proto, opsets)``: the importer asks the plugin with the node as it
    imports it, :meth:`plugrt.plugin.OpPlugin.declines`)."""
    reason = declines(op, proto, opsets) if declines is not None else None
    if reason:
        log.info("node %s: plugin %s declines it (%s); expanded into its ONNX function body",
                 printable(proto.name or proto.op_type), type(op).__name__, reason)
    return bool(reason)


def _body(node: onnx.NodeProto, opsets: dict, types: dict) -> onnx.FunctionProto | None:
    """This node's function body at the model's opset, or None where ONNX cannot build it
    (a context-dependent body whose inputs' types shape inference did not find)."""
    schema = _schema(node, opsets)
    opset = opsets[canonical_domain(node.domain)]
    if schema.has_context_dependent_function:
        given = []
        for name in node.input:
            if name and name not in types:
                return None
            given.append(types[name].SerializeToString() if name else onnx.TypeProto().SerializeToString())
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        built = schema.get_context_dependent_function_with_opset_version(max(versions), node.SerializeToString(), given) \
            if versions else schema.get_context_dependent_function(node.SerializeToString(), given)
    else:
        versions = [v for v in schema.function_opset_versions if v <= opset]
        built = schema.get_function_with_opset_version(max(versions)) if versions else schema.function_body
        built = built.SerializeToString() if isinstance(built, onnx.FunctionProto) else built
    if not built:
        return None
    body = onnx.FunctionProto()
    body.ParseFromString(built)
    return body if body.node else None


def _fill_defaults(node: onnx.NodeProto, schema) -> None:
    """Give ``node`` each attribute it leaves to its schema's default."""
    given = {attr.name for attr in node.attribute}
    for name, attribute in schema.attributes.items():
        default = attribute.default_value
        if name not in given and default is not None and default.type != onnx.AttributeProto.UNDEFINED:
            filled = node.attribute.add()
            filled.CopyFrom(default)
            filled.name = name


def _value_types(model: onnx.ModelProto) -> dict:
    """Every value's type that ONNX's shape inference finds (inputs, initializers, the rest)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(light(model), strict_mode=False)
    except Exception:  # noqa: BLE001 - inference failing on a node: only what the model states
        inferred = model
    graph = inferred.graph
    types = {value.name: value.type for value in list(graph.input) + list(graph.value_info) + list(graph.output)}
    for tensor in graph.initializer:
        types[tensor.name] = onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))
    return types


def light(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` for ONNX's shape inference: initializers over :data:`LIGHT_ELEMENTS` become
    typed inputs (their values decide no type; a large model's weights are not copied
    through inference)."""
    def small(dims) -> bool:
        return int(np.prod(dims)) <= LIGHT_ELEMENTS if len(dims) else True

    if all(small(t.dims) for t in model.graph.initializer):
        return model
    copied = copy_model(model)
    kept = [t for t in copied.graph.initializer if small(t.dims)]
    listed = {value.name for value in copied.graph.input}  # (IR < 4 lists initializers as inputs too)
    typed = [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in copied.graph.initializer
             if not small(t.dims) and t.name not in listed]
    del copied.graph.initializer[:]
    copied.graph.initializer.extend(kept)
    copied.graph.input.extend(typed)
    return copied


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    return copied


def _inline(model: onnx.ModelProto, what: str) -> onnx.ModelProto:
    try:
        return onnx.inliner.inline_local_functions(model, convert_version=True)
    except Exception as exc:  # noqa: BLE001 - ONNX's inliner refusing: name what it was given
        raise ModelError(f"cannot expand {what} into standard ops: ONNX's inliner failed ({type(exc).__name__}: "
                         f"{exc}); export the model without functions (or install a plugin for the op)") from None


__all__ = ["EXPANDED", "copy_model", "expand_functions", "light"]
