"""``If`` nodes whose condition is known before the model runs, replaced by the branch taken.

Exporters and function bodies write conditions that shapes and constants decide: ONNX's
``AffineGrid`` body branches on whether the size it is given has 4 or 5 entries,
TorchScript parts of a traced export on a tensor's rank or a static dim. The importer
evaluates such a condition with the plugins' own shape inference and value propagation
(``evaluate``: the nodes the condition depends on, imported on their own); where it comes
out known, the ``If`` node is replaced by its branch's nodes. ONNX names values once across
a model and its subgraphs, so they keep their names; a branch output the branch computes
is renamed to the ``If``'s output, and where the branch hands on an outer value unchanged,
the readers of the ``If``'s output read that value instead.

A condition that depends on an input's values, or on a dim an optimization profile lets
vary, is left alone: the ``If`` stays and the importer reports it, naming the node.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx

from plugrt.onnx.functions import copy_model
from plugrt.plugin import canonical_domain

#: The control-flow op this module folds (the one op the importer takes apart itself).
IF = "If"


def fold_conditionals(model: onnx.ModelProto, evaluate: Callable) -> onnx.ModelProto:
    """``model`` with each ``If`` whose condition ``evaluate(model, name)`` knows replaced
    by its taken branch (again for ``If`` nodes the branches held); ``model`` itself when
    none is. ``evaluate`` returns the condition's value or None."""
    for _ in range(8):
        ifs = [k for k, node in enumerate(model.graph.node) if node.op_type == IF and not canonical_domain(node.domain)]
        decided = {}
        for k in ifs:
            value = evaluate(model, model.graph.node[k].input[0])
            if value is not None and np.size(value) == 1:
                decided[k] = bool(np.asarray(value).reshape(-1)[0])
        if not decided:
            return model
        folded = copy_model(model)
        changed = False
        for k in sorted(decided, reverse=True):
            changed |= _splice(folded.graph, k, decided[k])
        if not changed:
            return model
        model = folded
    return model


def _splice(graph: onnx.GraphProto, index: int, taken: bool) -> bool:
    """Replace node ``index`` (an If) by its ``taken`` branch; False where it cannot."""
    node = graph.node[index]
    branch = onnx.GraphProto()
    branch.CopyFrom(next(a.g for a in node.attribute if a.name == ("then_branch" if taken else "else_branch")))
    defined = {out for inner in branch.node for out in inner.output} | {t.name for t in branch.initializer}
    outputs = {value.name for value in graph.output}
    passed = {}  # outer -> the value the branch hands on unchanged
    for inner, outer in zip(branch.output, node.output):
        if not outer:
            continue
        if inner.name in defined:
            _rename(branch, inner.name, outer)
        elif outer in outputs:
            return False  # (an outer value handed to a graph output: it would need a copy)
        else:
            passed[outer] = inner.name
    rest = [n for k, n in enumerate(graph.node) if k != index]
    for outer, inner in passed.items():
        for other in rest:
            _rename_uses(other, outer, inner)
    graph.initializer.extend(branch.initializer)
    del graph.node[:]
    graph.node.extend(rest[:index] + list(branch.node) + rest[index:])
    return True


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    """``old`` becomes ``new`` wherever ``graph`` (and the subgraphs in it) writes or reads it."""
    for node in graph.node:
        for k, name in enumerate(node.output):
            if name == old:
                node.output[k] = new
        _rename_uses(node, old, new)
    for tensor in graph.initializer:
        if tensor.name == old:
            tensor.name = new


def _rename_uses(node: onnx.NodeProto, old: str, new: str) -> None:
    for k, name in enumerate(node.input):
        if name == old:
            node.input[k] = new
    for attribute in node.attribute:
        for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)):
            _rename(sub, old, new)


def cone(model: onnx.ModelProto, name: str, limit: int = 512) -> list[onnx.NodeProto] | None:
    """The nodes ``name`` depends on, in graph order; None where one holds a subgraph (its
    value is not for a plain import) or there are more than ``limit``."""
    producer = {out: node for node in model.graph.node for out in node.output if out}
    order = {id(node): k for k, node in enumerate(model.graph.node)}
    found: dict[int, onnx.NodeProto] = {}
    stack = [name]
    while stack:
        value = stack.pop()
        node = producer.get(value)
        if node is None or id(node) in found:
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None
        found[id(node)] = node
        if len(found) > limit:
            return None
        stack.extend(n for n in node.input if n)
    return sorted(found.values(), key=lambda n: order[id(n)])


__all__ = ["IF", "cone", "fold_conditionals"]
