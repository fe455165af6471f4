"""``If`` nodes whose condition is known before the model runs, replaced by the branch taken.

Exporters and function bodies write conditions that shapes and constants decide: ONNX's
``AffineGrid`` body branches on whether the size it is given has 4 or 5 entries,
TorchScript parts of a traced export on a tensor's rank or a static dim. Such a condition
is evaluated here from the model's initializers and ``Constant`` nodes, the static parts
of shapes ONNX's shape inference finds (``Shape``, ``Size``) and ONNX's reference
implementation of the ops in between; the ``If`` node is then replaced by its branch's
nodes (ONNX names values once across a model and its subgraphs, so they keep their names)
and ``Identity`` nodes from the branch's outputs to the ``If``'s.

A condition that depends on an input's values, or on a dim an optimization profile lets
vary, is left alone: the ``If`` stays and the importer reports it, naming the node.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.shape_inference
from onnx import helper, numpy_helper

#: Largest constant (elements) evaluated while deciding a condition.
LIMIT = 1 << 16


def fold_conditionals(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each ``If`` whose condition is known replaced by its taken branch
    (repeated for ``If`` nodes inside the branches); ``model`` itself when none is."""
    for _ in range(8):
        graph = model.graph
        ifs = [k for k, node in enumerate(graph.node) if node.op_type == "If" and node.domain in ("", "ai.onnx")]
        if not ifs:
            return model
        known = _Known(model)
        decided = {k: known.condition(graph.node[k].input[0]) for k in ifs}
        decided = {k: taken for k, taken in decided.items() if taken is not None}
        if not decided:
            return model
        folded = onnx.ModelProto()
        folded.CopyFrom(model)
        nodes = []
        for k, node in enumerate(folded.graph.node):
            if k not in decided:
                nodes.append(node)
                continue
            branch = next(a.g for a in node.attribute if a.name == ("then_branch" if decided[k] else "else_branch"))
            folded.graph.initializer.extend(branch.initializer)
            nodes.extend(branch.node)
            for inner, outer in zip(branch.output, node.output):
                if outer:
                    nodes.append(helper.make_node("Identity", [inner.name], [outer], name=f"{node.name or 'If'}/{outer}"))
        del folded.graph.node[:]
        folded.graph.node.extend(nodes)
        model = folded
    return model


class _Known:
    """Values computable before the model runs, found on demand."""

    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        self.opset = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), 1)
        self.producer = {out: node for node in self.graph.node for out in node.output if out}
        self.values = {t.name: numpy_helper.to_array(t) for t in self.graph.initializer if _small(t.dims)}
        self._shapes = None
        self._failed: set = set()

    def condition(self, name: str):
        value = self.value(name)
        if value is None or value.size != 1:
            return None
        return bool(value.reshape(-1)[0])

    def value(self, name: str, depth: int = 0):
        if name in self.values:
            return self.values[name]
        if name in self._failed or depth > 64 or name not in self.producer:
            return None
        node = self.producer[name]
        found = self._evaluate(node, depth)
        if found is None:
            self._failed.add(name)
            return None
        for out, value in zip(node.output, found):
            if out and value is not None:
                self.values[out] = value
        return self.values.get(name)

    def _evaluate(self, node: onnx.NodeProto, depth: int):
        if node.domain not in ("", "ai.onnx") or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                      for a in node.attribute):
            return None
        if node.op_type in ("Shape", "Size"):
            dims = self.shape(node.input[0])
            if dims is None:
                return None
            if node.op_type == "Size":
                return [np.array(int(np.prod(dims)), np.int64)] if all(isinstance(d, int) for d in dims) else None
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            part = dims[slice(attrs.get("start", 0), attrs.get("end"))]
            return [np.array(part, np.int64)] if all(isinstance(d, int) for d in part) else None
        inputs = [self.value(n, depth + 1) if n else None for n in node.input]
        if any(n and v is None for n, v in zip(node.input, inputs)) \
                or any(v is not None and v.size > LIMIT for v in inputs):
            return None
        return _run(node, inputs, self.opset)

    def shape(self, name: str):
        """The dims ONNX's shape inference finds for ``name`` (an int for a static dim,
        None for another), or None when its rank is unknown."""
        if self._shapes is None:
            try:
                inferred = onnx.shape_inference.infer_shapes(_top_level(self.graph, self.opset), strict_mode=False)
                values = list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
            except Exception:  # noqa: BLE001 - inference failing: only the shapes the model states
                values = list(self.graph.input) + list(self.graph.value_info) + list(self.graph.output)
            self._shapes = {}
            for value in values:
                tensor = value.type.tensor_type
                if value.type.HasField("tensor_type") and tensor.HasField("shape"):
                    self._shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
            for tensor in self.graph.initializer:
                self._shapes[tensor.name] = list(tensor.dims)
        return self._shapes.get(name)


def _top_level(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    return light(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def light(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` for ONNX's shape inference: large initializers become typed inputs (their
    values decide no shape; a large model's weights are not copied through inference)."""
    if all(_small(t.dims) for t in model.graph.initializer):
        return model
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    kept = [t for t in copied.graph.initializer if _small(t.dims)]
    listed = {value.name for value in copied.graph.input}  # (IR < 4 lists initializers as inputs too)
    typed = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in copied.graph.initializer
             if not _small(t.dims) and t.name not in listed]
    del copied.graph.initializer[:]
    copied.graph.initializer.extend(kept)
    copied.graph.input.extend(typed)
    return copied


def _small(dims) -> bool:
    return int(np.prod(dims)) <= LIMIT if len(dims) else True


def _run(node: onnx.NodeProto, inputs: list, opset: int):
    """One node on ONNX's reference implementation; None where it cannot run it."""
    from onnx.reference import ReferenceEvaluator

    try:
        given = [f"in{k}" if n else "" for k, n in enumerate(node.input)]
        single = helper.make_node(node.op_type, given, [f"out{k}" for k in range(len(node.output))])
        single.attribute.extend(node.attribute)
        graph = helper.make_graph([single], "one", [helper.make_tensor_value_info(g, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                                                    for g, v in zip(given, inputs) if g], [
            helper.make_empty_tensor_value_info(f"out{k}") for k in range(len(node.output))])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        feeds = {g: v for g, v in zip(given, inputs) if g}
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]
    except Exception:  # noqa: BLE001 - an op the reference cannot run here: the value stays unknown
        return None


__all__ = ["fold_conditionals"]
