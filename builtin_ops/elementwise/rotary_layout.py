"""The ``sink_rotary_transposes`` pass: a Transpose that keeps the last axis, read only by a
RotaryEmbedding, moves below it, so that the attention reading the rotated Q and K can
take the head swap into its layout (contrib-attention's head absorption) as it does for V.

Exports split heads as ``Transpose(Reshape(q, [B, S, H, D]), [0, 2, 1, 3])`` and rotate
after the swap; the rotation pairs elements along the last axis only, so

    RotaryEmbedding(Transpose(x, p), cos, sin) == Transpose(RotaryEmbedding(x, cos', sin'), p)

where ``cos' = Transpose(cos, inverse(p))`` (broadcast to X's rank first), and likewise
``sin'``. The move costs nothing only where that permutation of a table is free:

- where the table's dims not known to be 1 keep their order (``[B, 1, S, D]`` read as
  ``[B, S, 1, D]``), it is a Squeeze and an Unsqueeze (aliases in the engine);
- a constant table is stored permuted;
- anything else (a table with heads of its own, a run-time one moved out of order) keeps
  the Transpose where it is, as does a Transpose that moves the last axis or has a reader
  other than the rotation and Shape nodes (those read the moved Transpose's output, of
  the same shape, unless they compute the rotation's own inputs). Each of those is logged
  at INFO with its reason.

Runs after ``fuse_rotary`` (which makes the RotaryEmbedding nodes) and before the contrib
plugins' fusion passes (priority 100), which then see ``Transpose -> attention``.
"""

from __future__ import annotations

import logging

import numpy as np

from plugrt.passes.pattern import (Graph, Node, add_constant, finish, fresh_name, insert_nodes, make_node, remove_nodes,
                                   replace_node)

from .rotary_ops import DOMAIN

log = logging.getLogger("plugrt.passes.sink_rotary_transposes")

NAME = "sink_rotary_transposes"
#: The first opset whose Squeeze and Unsqueeze take their axes as an input.
AXES_INPUT_OPSET = 13


def run(graph: Graph, registry) -> int:
    """Move every Transpose that can go below the RotaryEmbedding reading it; the number moved."""
    tables: dict = {}  # (table, order) -> its permuted value: one cos and sin serve q and k
    moves = 0
    for rotary in [n for n in graph.nodes if n.domain == DOMAIN and n.op_type == "RotaryEmbedding"]:
        if not any(rotary is n for n in graph.nodes):
            continue  # a dead leftover an earlier move removed
        producers, readers = graph.producers(), graph.consumers()
        transpose = producers.get(rotary.inputs[0])
        if transpose is None or transpose.domain or transpose.op_type != "Transpose":
            continue
        reason = _blocked(graph, transpose, rotary, readers)
        inputs = None
        if reason is None:
            inverse = [int(a) for a in np.argsort(_perm(graph, transpose))]
            inputs = [_permuted(graph, registry, name, inverse, tables, rotary) for name in rotary.inputs[1:]]
            if None in inputs:
                reason = f"cos/sin {tuple(rotary.inputs[1:])} cannot be read in the order {inverse} for free"
        if reason is not None:
            log.info("%s: %s stays above %s: %s", NAME, transpose.describe(), rotary.describe(), reason)
            continue
        _move(graph, transpose, rotary, inputs)
        log.info("%s: %s moved below %s (rotation is local to the last axis)", NAME, transpose.describe(),
                 rotary.describe())
        moves += 1
    if moves:
        finish(graph, registry)
    return moves


def _perm(graph: Graph, node: Node) -> list[int]:
    rank = graph.info(node.inputs[0]).rank
    perm = node.attrs.get("perm")
    return list(range(rank))[::-1] if perm is None else [int(p) % rank for p in perm]


def _blocked(graph: Graph, transpose: Node, rotary: Node, readers: dict) -> str | None:
    """Why the Transpose cannot move, or None."""
    info = graph.info(transpose.inputs[0])
    if info is None or info.rank < 1:
        return "its input's rank is unknown"
    if _perm(graph, transpose)[-1] != info.rank - 1:
        return "it moves the last axis, along which the rotation pairs elements"
    out = transpose.outputs[0]
    if out in graph.outputs:
        return "its output is a graph output"
    others = [r for r in readers.get(out, ()) if r is not rotary]
    if any(r.domain or r.op_type != "Shape" for r in others):
        return "its output has other readers than the rotation and Shape nodes"
    ancestors = {id(a) for a in _ancestors(graph, rotary)}
    if others and {id(r) for r in others} & ancestors:
        return "a Shape of its output computes the rotation's own inputs"
    return None


def _ancestors(graph: Graph, values) -> list[Node]:
    """The nodes the values (a node: its inputs) depend on."""
    producers, seen, found = graph.producers(), set(), []
    pending = [name for name in (values.inputs if isinstance(values, Node) else values) if name]
    while pending:
        name = pending.pop()
        producer = producers.get(name)
        if name in seen or producer is None:
            continue
        seen.add(name)
        found.append(producer)
        pending += [n for n in producer.inputs if n]
    return found


def _descendants(graph: Graph, nodes: list[Node]) -> list[Node]:
    """``nodes`` and every node reading their outputs, transitively."""
    readers, found, pending = graph.consumers(), {}, list(nodes)
    while pending:
        node = pending.pop()
        if id(node) not in found:
            found[id(node)] = node
            pending += [r for name in node.outputs if name for r in readers.get(name, ())]
    return list(found.values())


def _permuted(graph: Graph, registry, name: str, order: list[int], tables: dict, rotary: Node):
    """``name`` (broadcast to rank ``len(order)``) read in ``order``: the value itself, a
    new constant, or ``(value, nodes making it)`` through Squeeze/Unsqueeze; None where
    that would take a copy."""
    key = (name, tuple(order))
    if key in tables:
        return tables[key]
    info = graph.info(name)
    rank = len(order)
    shape = (1,) * (rank - info.rank) + tuple(info.shape)
    permuted = tuple(shape[a] for a in order)
    if permuted == shape:
        found = name  # right-aligned broadcasting reads it alike
    elif info.value is not None:
        value = np.asarray(info.value).reshape(shape)
        found = add_constant(graph, f"{name}_heads_last", np.transpose(value, order))
    else:
        found = _squeeze_unsqueeze(graph, registry, name, info.shape, order, shape, rotary)
    tables[key] = found
    return found


def _squeeze_unsqueeze(graph, registry, name, own: tuple, order: list[int], shape: tuple, rotary: Node):
    """``(value, [Squeeze, Unsqueeze])`` reading ``name`` in ``order``, or None where its
    dims not known to be 1 change order."""
    kept = [a for a in order if shape[a] != 1]
    if kept != sorted(kept):
        return None
    opset = graph.opsets.get("", AXES_INPUT_OPSET)
    nodes, value = [], name
    squeezed = [a for a, d in enumerate(own) if d == 1]
    unsqueezed = [j for j, a in enumerate(order) if shape[a] == 1]
    for op_type, axes in (("Squeeze", squeezed), ("Unsqueeze", unsqueezed)):
        if not axes:
            continue
        out = fresh_name(graph, f"{name}/heads_last_{op_type.lower()}")
        if opset >= AXES_INPUT_OPSET:
            inputs, attrs = [value, add_constant(graph, f"{out}_axes", np.array(axes, np.int64))], {}
        else:
            inputs, attrs = [value], {"axes": axes}
        node = make_node(graph, registry, op_type, inputs, [out], attrs, opset=opset, name=out, origin=rotary.origin)
        if node is None:
            return None
        nodes.append(node)
        value = out
    return value, nodes


def _move(graph: Graph, transpose: Node, rotary: Node, inputs: list) -> None:
    """The rotation reads the Transpose's input and the permuted tables; the Transpose
    follows it, writing its old output. Squeeze/Unsqueeze nodes go in once, before it."""
    new, tables_read = [], []
    for entry in inputs:
        if isinstance(entry, tuple):
            value, nodes = entry
            new += [n for n in nodes if not any(n is m for m in graph.nodes) and not any(n is m for m in new)]
            tables_read.append(value)
        else:
            tables_read.append(entry)
    inner = fresh_name(graph, f"{rotary.outputs[0]}_heads_last")
    moved = rotary.replace(inputs=(transpose.inputs[0], *tables_read), outputs=(inner,))
    after = transpose.replace(inputs=(inner,), outputs=(rotary.outputs[0],))
    shapes = [r for r in graph.consumers().get(transpose.outputs[0], ()) if r is not rotary]
    live = {id(n) for n in _ancestors(graph, graph.outputs)}
    dead = [r for r in shapes if id(r) not in live]
    for reader in shapes:  # Shape nodes: the moved Transpose writes a value of the same shape
        if id(reader) in live:
            replace_node(graph, reader, reader.replace(inputs=(rotary.outputs[0],)))
    remove_nodes(graph, _descendants(graph, dead))  # a fused pattern's leftovers: they would hold the Transpose
    at = graph.nodes.index(rotary)
    remove_nodes(graph, [transpose, rotary])
    insert_nodes(graph, at - 1, [*new, moved, after])
