"""The ``sink_reshapes`` pass: a Reshape (Flatten, Squeeze, Unsqueeze) that stands between
a node and the pointwise node reading it moves below the pointwise node, so that epilogue
and pointwise fusion see the two as neighbours. HF GPT-2's every Linear is ``Reshape ->
Gemm -> Reshape``: its Gelu and its residual Add fuse into the Gemm only once the Reshape
after the Gemm is out of the way.

``P(Reshape(x), o...) -> Reshape(P(x, o'...))`` changes no result when every other operand
``o`` of the pointwise node ``P`` broadcasts over ``x``'s shape as it did over the
Reshape's output shape:

- a constant or tensor broadcasting only over the trailing axes the two shapes share (a
  bias ``[N]``, a scalar) stays as it is;
- a constant of exactly the output shape is stored reshaped;
- a tensor of exactly the output shape is read through a Reshape back to ``x``'s shape
  (an alias: free), or through nothing where it is itself a Reshape of a tensor of that
  shape.

A node moves only where it has one reader (no graph output), ``P``'s output has the
Reshape's output shape, and the Reshape's input comes from an anchor or a pointwise node
(fusion can then join them); not where an operand's Reshape back would cut a pointwise
chain of its own (its producer fusible, ``P`` its one reader). The moved Reshape keeps
its shape input and is tried again, so a chain (Add, then Gelu, ...) moves through.
"""

from __future__ import annotations

import logging

import numpy as np

from plugrt.passes.pattern import (Graph, Node, add_constant, finish, fresh_name, insert_nodes, make_node, remove_nodes,
                                   shape_facts)
from plugrt.plugin import ANCHOR, POINTWISE

log = logging.getLogger("plugrt.passes.sink_reshapes")

#: Ops whose output is their input's elements in the same order, in a new shape.
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
#: The first opset whose Reshape takes its shape as an input.
RESHAPE_OPSET = 5


def run(graph: Graph, registry) -> int:
    """Move Reshapes below pointwise nodes until none can move; the number of moves."""
    made: set[str] = set()  # the Reshapes this pass put on operands: they stay put
    moves = 0
    while _sink_one(graph, registry, made):
        moves += 1
        finish(graph, registry)
    return moves


def is_reshape(node: Node | None) -> bool:
    return node is not None and not node.domain and node.op_type in RESHAPES


def _sink_one(graph: Graph, registry, made: set[str]) -> bool:
    producers, readers = graph.producers(), graph.consumers()
    shapes = _shapes(graph, registry)
    for node in graph.nodes:
        if not is_reshape(node) or node.name in made or node.outputs[0] in graph.outputs:
            continue
        after = list({id(n): n for n in readers.get(node.outputs[0], [])}.values())
        if len(after) != 1 or not _fusible_source(registry, producers.get(node.inputs[0])):
            continue
        pointwise = after[0]
        outs = [name for name in pointwise.outputs if name]
        if outs != [pointwise.outputs[0]] or POINTWISE not in registry.op(pointwise).groups:
            continue
        if shapes(outs[0]) != shapes(node.outputs[0]):
            continue  # the reshaped tensor is broadcast: its shape matters
        operands = _operands(graph, registry, node, pointwise, shapes, producers, readers, made)
        if operands is None:
            continue
        _move(graph, node, pointwise, operands)
        log.info("sink_reshapes: %s moved below %s", node.describe(), pointwise.describe())
        return True
    return False


def _shapes(graph: Graph, registry):
    """``name -> tuple of shapes``: the value's shape at each of the graph's sample inputs
    (symbolic inference cannot tell that a Reshape's computed target is its reader's other
    operand's shape), or its one inferred shape where there are none."""
    facts = shape_facts(graph, registry)
    if graph.sample_inputs:
        return facts
    return lambda name: (facts(name),)


def _fusible_source(registry, node: Node | None) -> bool:
    return node is not None and bool({ANCHOR, POINTWISE} & registry.op(node).groups)


def _operands(graph: Graph, registry, reshape: Node, pointwise: Node, shapes, producers: dict, readers: dict,
              made: set[str]) -> tuple[list[str], list[Node]] | None:
    """``(inputs, new nodes)``: the pointwise node's inputs over the Reshape's input shape
    and the operand Reshapes that takes, or None where some operand cannot follow."""
    x, y = reshape.inputs[0], reshape.outputs[0]
    before, after = shapes(x), shapes(y)
    inputs, new = [], []
    for name in pointwise.inputs:
        if name == y or not name:
            inputs.append(x if name == y else name)
            continue
        info, shape = graph.info(name), shapes(name)
        if _broadcasts_alike(shape, before, after):
            if info.rank > graph.info(x).rank:
                if info.value is None:
                    return None
                core = _strip_leading_ones(tuple(info.value.shape))
                name = add_constant(graph, f"{name}_squeezed", np.asarray(info.value).reshape(core))
            inputs.append(name)
        elif shape != after:
            return None
        elif info.value is not None and len(set(before)) == 1 and all(_is_int(d) for d in before[0]):
            inputs.append(add_constant(graph, f"{name}_reshaped", np.asarray(info.value).reshape(before[0])))
        else:
            source = producers.get(name)
            if is_reshape(source) and shapes(source.inputs[0]) == before:
                inputs.append(source.inputs[0])
                continue
            if _fusible_source(registry, source) and len(readers.get(name, [])) == 1:
                return None  # its own chain would lose the pointwise node: nothing gained
            back = _reshape_to(graph, registry, name, before, f"{reshape.name}/operand")
            if back is None:
                return None
            made.add(back.name)
            new.append(back)
            inputs.append(back.outputs[0])
    return inputs, new


def _broadcasts_alike(operand: tuple, before: tuple, after: tuple) -> bool:
    """Whether, at every sample, the operand's dims (leading ones aside) are all among the
    trailing dims the two shapes share, so it meets the same elements in both."""
    return all(len(_strip_leading_ones(o)) <= _shared_suffix(b, a) for o, b, a in zip(operand, before, after))


def _is_int(dim) -> bool:
    return isinstance(dim, (int, np.integer))


def _shared_suffix(a: tuple, b: tuple) -> int:
    count = 0
    while count < min(len(a), len(b)) and a[-1 - count] == b[-1 - count]:
        count += 1
    return count


def _strip_leading_ones(shape: tuple) -> tuple:
    start = 0
    while start < len(shape) and shape[start] == 1:
        start += 1
    return tuple(shape[start:])


def _reshape_to(graph: Graph, registry, source: str, shapes: tuple, name: str) -> Node | None:
    """A Reshape of ``source`` to the shape ``shapes`` gives at each sample: a dim that differs
    between samples (or is symbolic) is the Reshape's -1 (one at most), or None."""
    opset = graph.opsets.get("", 17)
    target = [int(dims[0]) if len(set(dims)) == 1 and _is_int(dims[0]) else -1 for dims in zip(*shapes)]
    if opset < RESHAPE_OPSET or target.count(-1) > 1 or 0 in target:
        return None
    constant = add_constant(graph, f"{source}_shape", np.array(target, np.int64))
    return make_node(graph, registry, "Reshape", [source, constant], [fresh_name(graph, f"{source}_reshaped")],
                     opset=opset, name=fresh_name(graph, name))


def _move(graph: Graph, reshape: Node, pointwise: Node, operands: tuple[list[str], list[Node]]) -> None:
    """``pointwise`` reads ``inputs`` (writing a fresh value); ``reshape`` follows it, writing
    its old output."""
    inputs, new = operands
    inner = fresh_name(graph, f"{pointwise.outputs[0]}_unreshaped")
    moved = pointwise.replace(inputs=tuple(inputs), outputs=(inner,))
    after = reshape.replace(inputs=(inner, *reshape.inputs[1:]), outputs=(pointwise.outputs[0],))
    at = graph.nodes.index(pointwise)
    remove_nodes(graph, [pointwise, reshape])
    insert_nodes(graph, at - 1, [*new, moved, after])
