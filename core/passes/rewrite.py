"""Graph editing the passes share: rerouting values, fresh names, new constants and nodes.

Passes edit a :class:`~plugrt.ir.graph.Graph` in place. Nodes are immutable, so a pass
replaces a node by a new one (``node.replace(...)``) at the same position, or appends a
node and lets :func:`finish` restore topological order, infer the new values' types and
validate the result.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from plugrt.ir.graph import Graph, Node, Value
from plugrt.ir.infer import infer_node
from plugrt.ir.validate import validate_graph


def fresh_name(graph: Graph, base: str) -> str:
    """A value or node name not used in ``graph`` yet, derived from ``base``."""
    taken = set(graph.values) | {n.name for n in graph.nodes}
    if base not in taken:
        return base
    index = 1
    while f"{base}_{index}" in taken:
        index += 1
    return f"{base}_{index}"


def add_constant(graph: Graph, base: str, array: np.ndarray) -> str:
    """Add an initializer under a fresh name derived from ``base``; return the name."""
    name = fresh_name(graph, base)
    graph.add_const(name, np.asarray(array))
    return name


def replace_value(graph: Graph, old: str, new: str) -> bool:
    """Make every reader of ``old`` read ``new`` instead; return ``False`` if impossible.

    A graph output keeps its name (it is a binding): when ``old`` is one, the producer of
    ``new`` is made to produce ``old`` instead (and ``new``'s readers read ``old``), which
    needs ``new`` to be a node output that is not itself a graph output. The node that
    produced ``old`` stays, with that output renamed to a dead name; the caller removes it
    (or dead-code elimination does).
    """
    if old == new:
        return True
    if old not in graph.outputs:
        _rename_uses(graph, old, new)
        return True
    producers = graph.producers()
    if new not in producers or new in graph.outputs:
        return False
    dead = fresh_name(graph, f"{old}_unused")
    _rename_output(graph, producers[old], old, dead)
    graph.values[dead] = Value(dead, graph.values[old].info)
    _rename_output(graph, graph.producers()[new], new, old)
    graph.values[old].info = graph.values[new].info
    _rename_uses(graph, new, old)
    del graph.values[new]
    return True


def _rename_output(graph: Graph, node: Node, old: str, new: str) -> None:
    replace_node(graph, node, node.replace(outputs=tuple(new if o == old else o for o in node.outputs)))


def _rename_uses(graph: Graph, old: str, new: str) -> None:
    for index, node in enumerate(graph.nodes):
        if old in node.inputs:
            graph.nodes[index] = node.replace(inputs=tuple(new if i == old else i for i in node.inputs))


def replace_node(graph: Graph, old: Node, new: Node) -> None:
    """Put ``new`` where ``old`` is, registering any new output values (untyped)."""
    graph.nodes[graph.nodes.index(old)] = new
    for name in new.outputs:
        if name and name not in graph.values:
            graph.values[name] = Value(name)


def insert_nodes(graph: Graph, index: int, nodes: Iterable[Node]) -> None:
    """Put ``nodes`` before position ``index``, registering their new output values (untyped;
    :func:`finish` infers them and restores topological order)."""
    nodes = list(nodes)
    graph.nodes[index:index] = nodes
    for node in nodes:
        for name in node.outputs:
            if name and name not in graph.values:
                graph.values[name] = Value(name)


def remove_nodes(graph: Graph, nodes: Iterable[Node]) -> None:
    """Drop ``nodes`` and the values no remaining node produces (their readers must be gone)."""
    dropped = {id(n) for n in nodes}
    outputs = {name for node in graph.nodes if id(node) in dropped for name in node.outputs if name}
    graph.nodes = [n for n in graph.nodes if id(n) not in dropped]
    still = {name for node in graph.nodes for name in node.outputs if name}
    for name in outputs - still - set(graph.outputs):
        graph.values.pop(name, None)


def finish(graph: Graph, registry) -> None:
    """Restore topological order, infer types of values that lack them, and validate."""
    graph.toposort()
    for node in graph.nodes:
        if any(name and graph.values[name].info is None for name in node.outputs):
            infer_node(graph, registry, node)
    validate_graph(graph, registry)


def extra_outputs_used(graph: Graph, node: Node, readers: dict | None = None) -> bool:
    """Whether any output of ``node`` past output 0 is read or is a graph output."""
    readers = graph.consumers() if readers is None else readers
    return any(name and (name in readers or name in graph.outputs) for name in node.outputs[1:])


def make_node(graph: Graph, registry, op_type: str, inputs: Iterable[str], outputs: Iterable[str],
              attrs: dict | None = None, *, opset: int, domain: str = "", name: str = "",
              origin: tuple[str, ...] = ()) -> Node | None:
    """A new node of an installed op, its attributes completed with the plugin's defaults
    (as import does); ``None`` when no installed plugin provides the op at ``opset``."""
    op = registry.find_op(domain, op_type, opset)
    if op is None:
        return None
    full = {attr.name: attr.default for attr in op.attributes}
    full.update(attrs or {})
    return Node(name or fresh_name(graph, op_type.lower()), op_type, domain, tuple(inputs), tuple(outputs), full,
                opset, origin)


def shape_facts(graph: Graph, registry):
    """A function ``name -> key`` such that two values of equal keys have equal shapes.

    The key is the inferred (maybe symbolic) shape, or, when the graph has
    ``sample_inputs``, the concrete shapes at every sample: dims that symbolic inference
    cannot prove equal (a Reshape whose target is computed from another tensor's shape)
    compare by value there. A kernel relying on such a fact re-checks it at its concrete
    shapes.
    """
    samples = _at_samples(graph, registry)
    if not samples:
        return lambda name: tuple(graph.info(name).shape)
    return lambda name: tuple(tuple(sample.info(name).shape) for sample in samples)


def sample_values(graph: Graph, registry):
    """A function ``name -> tuple`` of the value's known value at every sample shape of the
    graph (``None`` where inference does not know it: tensor data), as :func:`shape_facts`
    concretizes them; an empty tuple without ``sample_inputs``."""
    samples = _at_samples(graph, registry)

    def values(name: str) -> tuple:
        infos = [sample.info(name) for sample in samples]
        return tuple(None if info is None else info.value for info in infos)

    return values


def _at_samples(graph: Graph, registry) -> list:
    """The graph concretized at each of its sample shapes (none without ``sample_inputs``)."""
    from plugrt.ir.specialize import concretize

    return [concretize(graph, shapes, registry, values) for shapes, values in graph.sample_inputs]
