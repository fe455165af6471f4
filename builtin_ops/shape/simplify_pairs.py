"""Pairs of layout ops that cancel or merge, where the first node's one reader is the second.

Rules, tried in order on each pair:

* Cast A -> B -> A, where B represents every value of A: both go.
* Two data-movement ops (the ``SHAPE`` group, other inputs constant) on a static shape:
  both references run on an ``arange`` probe of the input shape. A result equal to the
  probe proves the pair is the identity (both go); a result whose ravel equals the
  probe's proves a pure reshape (one Reshape to the constant final shape replaces them).
  No op semantics are re-implemented: the plugins' own references are the proof.
* Transpose -> Transpose (any shapes): one Transpose of the composed permutation, or
  nothing when the composition is the identity.
"""

from __future__ import annotations

import math

import numpy as np

from plugrt.passes.pattern import (Graph, Node, add_constant, finish, make_node, origin_of, remove_nodes,
                                   replace_node, replace_value)
from plugrt.plugin import SHAPE
from plugrt_builtin_ops.common.layout import transpose_perm

#: Largest input (elements) the probe runs on; bigger pairs are left to the other rules.
PROBE_LIMIT = 1 << 22


def run(graph: Graph, registry) -> int:
    """Simplify pairs until none is left; return how many pairs were rewritten."""
    rewrites = 0
    while _rewrite_one(graph, registry):
        rewrites += 1
    if rewrites:
        finish(graph, registry)
    return rewrites


def _rewrite_one(graph: Graph, registry) -> bool:
    readers = graph.consumers()
    for first in graph.nodes:
        outs = [name for name in first.outputs if name]
        if len(outs) != 1 or not first.inputs or not first.inputs[0] or outs[0] in graph.outputs:
            continue
        following = readers.get(outs[0], [])
        if len(following) != 1 or list(following[0].inputs).count(outs[0]) != 1:
            continue
        second = following[0]
        if second.inputs[0] != outs[0] or len([name for name in second.outputs if name]) != 1:
            continue
        for rule in (_cast_round_trip, _probed_layout, _transpose_pair):
            if rule(graph, registry, first, second):
                return True
    return False


def _remove_pair(graph: Graph, first: Node, second: Node) -> bool:
    """Both nodes go, the second's readers reading the first's input (if possible)."""
    at = graph.nodes.index(first), graph.nodes.index(second)
    if not replace_value(graph, second.outputs[0], first.inputs[0]):
        return False
    remove_nodes(graph, [graph.nodes[i] for i in at])  # replace_value keeps positions
    return True


def represents(a: np.dtype, b: np.dtype) -> bool:
    """Whether dtype ``b`` holds every value of ``a`` exactly (NumPy's "safe" cast, minus
    integers wider than the float's mantissa, which NumPy also calls safe)."""
    if not np.can_cast(a, b, "safe"):
        return False
    if a.kind in "iu" and b.kind == "f":
        return np.iinfo(a).bits - (a.kind == "i") <= np.finfo(b).nmant + 1
    return True


def _cast_round_trip(graph, registry, first, second) -> bool:
    if first.domain or second.domain or first.op_type != "Cast" or second.op_type != "Cast":
        return False
    x, mid, out = graph.info(first.inputs[0]), graph.info(first.outputs[0]), graph.info(second.outputs[0])
    if out.dtype != x.dtype or not represents(x.dtype, mid.dtype):
        return False
    return _remove_pair(graph, first, second)


def _probed_layout(graph, registry, first, second) -> bool:
    x, y = graph.info(first.inputs[0]), graph.info(second.outputs[0])
    if not (x.is_static and y.is_static) or x.dtype != y.dtype or math.prod(x.shape) > PROBE_LIMIT:
        return False
    probe = np.arange(math.prod(x.shape), dtype=np.int64).reshape(x.shape)
    result = _run_moves(graph, registry, [first, second], probe)
    if result is None or result.size != probe.size or not np.array_equal(result.ravel(), probe.ravel()):
        return False
    if result.shape == probe.shape and _remove_pair(graph, first, second):
        return True
    return _reshape_pair(graph, registry, first, second, y.shape)


def _run_moves(graph, registry, nodes, probe):
    """The probe through the nodes' references; ``None`` unless all move data with
    constant operands."""
    for node in nodes:
        op = registry.op(node)
        operands = [graph.info(name) for name in node.inputs[1:]]
        if SHAPE not in op.groups or any(info is not None and info.value is None for info in operands):
            return None
        try:
            probe = np.asarray(op.reference(node, [probe] + [None if i is None else i.value for i in operands])[0])
        except Exception:  # not a proof either way: leave the pair alone
            return None
    return probe


def _reshape_pair(graph, registry, first, second, shape) -> bool:
    opset = graph.opsets.get("", 17)
    zero = 0 in shape  # a 0 dim needs allowzero, else Reshape copies the input's dim
    if opset < 5 or (zero and opset < 14) or registry.find_op("", "Reshape", opset) is None:
        return False
    target = add_constant(graph, f"{second.name}_shape", np.array(shape, dtype=np.int64))
    node = make_node(graph, registry, "Reshape", [first.inputs[0], target], [second.outputs[0]],
                     {"allowzero": 1} if zero else {}, opset=opset, name=second.name,
                     origin=origin_of([first, second]))
    replace_node(graph, second, node)
    remove_nodes(graph, [first])
    return True


def _transpose_pair(graph, registry, first, second) -> bool:
    if first.domain or second.domain or first.op_type != "Transpose" or second.op_type != "Transpose":
        return False
    rank = graph.info(first.inputs[0]).rank
    outer, inner = transpose_perm(first, rank), transpose_perm(second, rank)
    composed = [outer[axis] for axis in inner]
    if composed == list(range(rank)) and _remove_pair(graph, first, second):
        return True
    merged = second.replace(inputs=(first.inputs[0],), attrs={**second.attrs, "perm": composed},
                            origin=origin_of([first, second]))
    replace_node(graph, second, merged)
    remove_nodes(graph, [first])
    return True
