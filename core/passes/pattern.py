"""Patterns over the graph, as data, and the driver that rewrites their matches.

A pattern describes the subgraph that computes one value, matched backward from a root
node through producers (tinygrad's ``UPat``, over ONNX nodes)::

    x = capture("x")                                   # any value; every "x" is the same one
    half = const("half", close_to(0.5))                # a constant, checked by a predicate
    gelu = op("Mul", op("Mul", x, half), op("Add", ...))
    scaled = either(op("Div", x, root2), op("Mul", x, inv_root2))   # alternatives

An op whose plugin says it is ``commutative`` (Add, Mul, ...) matches its two inputs in
either order. Naming an op pattern (``name="d"``)
binds its output, so a value read twice (``op("Mul", d, d)``) is written twice. A match
covers a closed subgraph: every matched value but the root's is read only by matched
nodes and is no graph output, so removing the nodes loses nothing.

A :class:`Rule` is a pattern plus a function ``(graph, registry, match) -> Node | None``;
:func:`rewrite_matches` applies rules until none matches, replacing each match by the
node the function returns (usually :meth:`Match.fused`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import numpy as np

from plugrt.errors import PlugrtError
from plugrt.ir.graph import Graph, Int8Request, Node, origin_of
from plugrt.plugin import canonical_domain
from plugrt.passes import rewrite

@dataclass(frozen=True)
class Pattern:
    """One value: produced by a node of ``op`` (``None``: any value, a leaf), a constant
    (``where`` set), or one of ``alternatives``. ``name`` captures the value."""

    op: str | None = None
    inputs: tuple["Pattern", ...] = ()
    name: str | None = None
    attrs: Mapping[str, object] = field(default_factory=dict)
    where: Callable[[np.ndarray], bool] | None = None
    alternatives: tuple["Pattern", ...] = ()
    #: Whether the two inputs match in either order; ``None``: as the op's plugin says.
    commutative: bool | None = None
    domain: str = ""


def op(op_type: str, *inputs: Pattern, name: str | None = None, attrs: Mapping | None = None,
       commutative: bool | None = None, domain: str = "") -> Pattern:
    """A node of ``domain::op_type`` whose inputs match ``inputs`` (exactly that many) and
    whose attributes equal ``attrs``. Its two inputs match in either order when ``commutative``
    says so, or (``None``) when the op's plugin is :attr:`~plugrt.plugin.OpPlugin.commutative`."""
    return Pattern(op_type, tuple(inputs), name, dict(attrs or {}), commutative=commutative, domain=domain)


def capture(name: str) -> Pattern:
    """Any value, bound to ``name``."""
    return Pattern(name=name)


def const(name: str, where: Callable[[np.ndarray], bool] = lambda value: True) -> Pattern:
    """A constant (initializer or known value) for which ``where(array)`` holds."""
    return Pattern(name=name, where=where)


def either(*alternatives: Pattern) -> Pattern:
    """The first of ``alternatives`` that matches (each is tried, in order)."""
    return Pattern(alternatives=tuple(alternatives))


def close_to(target: float, rtol: float = 1e-4) -> Callable[[np.ndarray], bool]:
    """A predicate: a one-element numeric constant within ``rtol`` of ``target``."""
    def check(value: np.ndarray) -> bool:
        return value.size == 1 and value.dtype.kind in "fiu" and abs(float(value.reshape(-1)[0]) - target) <= rtol * abs(target)
    return check


def is_scalar(value: np.ndarray) -> bool:
    """A one-element floating constant (a scalar or a tensor of one element)."""
    return value.size == 1 and value.dtype.kind == "f"


def constant_value(graph: Graph, name: str) -> np.ndarray | None:
    """The value of a constant: an initializer or a value inference knows; else ``None``."""
    value = graph.values.get(name) if name else None
    if value is None:
        return None
    if value.const is not None:
        return np.asarray(value.const)
    return None if value.info is None or value.info.value is None else np.asarray(value.info.value)


def reduce_axes(graph: Graph, node: Node, rank: int) -> tuple[int, ...] | None:
    """The sorted non-negative axes a Reduce* node reduces over, read from the ``axes``
    attribute or, from opset 18 (ReduceSum: 13), the constant second input; ``None`` when
    they are not known or out of range."""
    if len(node.inputs) > 1 and node.inputs[1]:
        array = constant_value(graph, node.inputs[1])
        if array is None:
            return None
        raw = [int(a) for a in array.reshape(-1)]
    else:
        raw = list(node.attrs.get("axes") or [])
    if not raw:
        return () if node.attrs.get("noop_with_empty_axes") else tuple(range(rank))
    if any(not -rank <= a < rank for a in raw):
        return None
    return tuple(sorted({a % rank for a in raw}))


@dataclass
class Match:
    """What a pattern matched: the root, its nodes (root first) and the captured values."""

    graph: Graph
    root: Node
    nodes: list[Node]
    values: dict[str, str]

    def node(self, name: str) -> Node:
        """The node that produces the captured value ``name``."""
        return next(n for n in self.nodes if self.values[name] in n.outputs)

    def const(self, name: str) -> np.ndarray | None:
        return constant_value(self.graph, self.values[name]) if name in self.values else None

    def fused(self, registry, op_type: str, inputs, attrs: dict | None = None, *, opset: int,
              domain: str = "") -> Node | None:
        """The node replacing the match: named after the root, standing for every matched
        ONNX node, producing the root's outputs; ``None`` if no plugin has the op."""
        name = rewrite.fresh_name(self.graph, f"{self.root.name}/{op_type}")
        return rewrite.make_node(self.graph, registry, op_type, inputs, self.root.outputs, attrs, opset=opset,
                                 domain=domain, name=name, origin=origin_of(self.nodes))


class Matcher:
    """Matches patterns against one state of a graph (rebuild it after editing). The
    ``registry`` says which ops are commutative (without one, only patterns that say so)."""

    def __init__(self, graph: Graph, registry=None):
        self.graph = graph
        self.registry = registry
        self.producers = graph.producers()
        self.consumers = graph.consumers()

    def match(self, pattern: Pattern, root: Node) -> Match | None:
        """The first match of ``pattern`` whose root is ``root``, or ``None``."""
        if len(root.outputs) != 1 or not root.outputs[0]:
            return None
        for nodes, values in self._match(pattern, root.outputs[0], [], {}):
            if nodes and nodes[0] is root and self._closed(nodes):
                return Match(self.graph, root, nodes, values)
        return None

    def _closed(self, nodes: list[Node]) -> bool:
        inside = {id(n) for n in nodes}
        for node in nodes[1:]:
            for out in node.outputs:
                if out in self.graph.outputs:
                    return False
                if any(id(reader) not in inside for reader in self.consumers.get(out, [])):
                    return False
        return True

    def _match(self, pattern: Pattern, value: str, nodes: list, values: dict) -> Iterator[tuple[list, dict]]:
        if pattern.name is not None:
            if values.get(pattern.name, value) != value:
                return  # every occurrence of a name is one value (which must still fit)
            values = {**values, pattern.name: value}
        if pattern.alternatives:
            for alternative in pattern.alternatives:
                yield from self._match(alternative, value, nodes, values)
            return
        if pattern.op is None:
            if pattern.where is None:
                yield nodes, values
                return
            array = constant_value(self.graph, value)
            if array is not None and pattern.where(array):
                yield nodes, values
            return
        node = self.producers.get(value)
        if node is None or node.op_type != pattern.op or \
                canonical_domain(node.domain) != canonical_domain(pattern.domain):
            return
        if len(node.inputs) != len(pattern.inputs):
            return
        if any(node.attrs.get(key) != want for key, want in pattern.attrs.items()):
            return
        if not any(n is node for n in nodes):  # a node reached twice is one node
            nodes = nodes + [node]
        orders = [pattern.inputs]
        if len(pattern.inputs) == 2 and self._commutative(pattern, node):
            orders.append(pattern.inputs[::-1])
        for order in orders:
            yield from self._match_inputs(order, node.inputs, nodes, values)

    def _commutative(self, pattern: Pattern, node: Node) -> bool:
        if pattern.commutative is not None:
            return pattern.commutative
        op = self.registry.find_op(node.domain, node.op_type, node.opset) if self.registry is not None else None
        return bool(getattr(op, "commutative", False))

    def _match_inputs(self, patterns, names, nodes, values) -> Iterator[tuple[list, dict]]:
        if not patterns:
            yield nodes, values
            return
        for nodes_1, values_1 in self._match(patterns[0], names[0], nodes, values):
            yield from self._match_inputs(patterns[1:], names[1:], nodes_1, values_1)


@dataclass(frozen=True)
class Rule:
    """A rewrite rule: a pattern and the function that returns its replacement or ``None``."""

    name: str
    pattern: Pattern
    rewrite: Callable[[Graph, object, Match], Node | None]


def rewrite_matches(graph: Graph, registry, rules: list[Rule]) -> int:
    """Replace every match of ``rules`` (tried in order at each root, roots from the graph's
    end so the widest pattern claims its nodes first); return the number of rewrites."""
    count = 0
    matcher = Matcher(graph, registry)
    removed: set[int] = set()
    for root in reversed(list(graph.nodes)):
        if id(root) in removed:
            continue
        for rule in rules:
            found = matcher.match(rule.pattern, root)
            replacement = rule.rewrite(graph, registry, found) if found is not None else None
            if replacement is None:
                continue
            if tuple(replacement.outputs) != tuple(root.outputs):
                raise PlugrtError(f"rule {rule.name!r} at {root.describe()}: the replacement "
                                  f"{replacement.describe()} must produce the root's outputs {list(root.outputs)}")
            rewrite.remove_nodes(graph, found.nodes)
            graph.add_node(replacement)
            for name in replacement.outputs:
                graph.values[name].info = None  # inferred again by finish()
            graph.toposort()  # the next rule may run the graph (shape facts): in order between rewrites
            removed.update(id(n) for n in found.nodes)
            matcher = Matcher(graph, registry)
            count += 1
            break
    if count:
        rewrite.finish(graph, registry)
    return count


# The graph edits a rewrite may need beyond Match.fused, public here with the patterns.
from plugrt.passes.rewrite import (add_constant, extra_outputs_used, finish, fresh_name, insert_nodes,  # noqa: E402
                                   make_node, remove_nodes, replace_node, replace_value, sample_values,
                                   shape_facts)

__all__ = [
    # the graph a pass rewrites
    "Graph", "Node", "Int8Request",
    # patterns
    "Pattern", "op", "capture", "const", "either", "close_to", "is_scalar",
    # matching and rewriting
    "Match", "Matcher", "Rule", "rewrite_matches", "constant_value", "reduce_axes",
    # graph edits
    "add_constant", "extra_outputs_used", "finish", "fresh_name", "insert_nodes", "make_node", "origin_of",
    "remove_nodes",
    "replace_node", "replace_value", "sample_values", "shape_facts",
]
