"""Graph, Node and Value: the IR every pass, the executor and the engine builder share.

A :class:`Node` is small and immutable by convention: op identity, input and output value
names, resolved attributes. A :class:`Value` is a named tensor with its
:class:`~plugrt.ir.tensor.TensorInfo` once inferred, and its data if it is a constant
(initializer). The :class:`Graph` owns both, in topological node order.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from plugrt.errors import ModelError
from plugrt.ir.tensor import TensorInfo


@dataclass(frozen=True, eq=False)
class Node:
    """One operator application. ``inputs`` may hold ``""`` for an omitted optional input."""

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    opset: int = 1
    #: ONNX node names this node stands for (grows when passes fuse nodes).
    origin: tuple[str, ...] = ()

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op_type}" if self.domain else self.op_type

    def describe(self) -> str:
        return f"node {self.name!r} ({self.qualified_op}, opset {self.opset})"

    def replace(self, **changes) -> "Node":
        return dataclasses.replace(self, **changes)


def origin_of(nodes: Iterable[Node]) -> tuple[str, ...]:
    """The ONNX node names a set of nodes stands for, in order, without repeats."""
    seen: dict[str, None] = {}
    for node in nodes:
        for name in node.origin or (node.name,):
            seen.setdefault(name, None)
    return tuple(seen)


@dataclass
class Int8Request:
    """What an INT8 build asks of the graph passes of the ``quantize`` stage (set by the
    builder on :attr:`Graph.int8`; ``None`` when the build is not INT8).

    ``ranges`` maps a tensor name to its calibrated absolute range (amax: the tensor is
    quantized symmetrically, scale ``amax / 127``); ``excluded`` holds ONNX node names
    that stay in float (user constraints, accuracy fallbacks). A pass that quantizes a
    node records ``decisions[node name] = "int8"``, and one that cannot appends
    ``{"layer", "reason"}`` to ``fallbacks``: the build report lists every fallback.
    """

    ranges: dict[str, float] = field(default_factory=dict)
    excluded: set[str] = field(default_factory=set)
    decisions: dict[str, str] = field(default_factory=dict)
    fallbacks: list[dict] = field(default_factory=list)
    #: Nodes the passes made that must compute in FP32 (an integer layer's rescale): the
    #: precision step keeps them there.
    float32: set[str] = field(default_factory=set)
    #: A calibration batch and the float network's outputs on it (the build's accuracy check).
    feeds: dict | None = None
    reference: dict | None = None
    #: Whether float layers may run in FP16 (``BuilderConfig.fp16``).
    fp16: bool = False
    #: ``timer(node, dtypes) -> ms | None`` where the build times tactics (a GPU): the
    #: fastest tactic of ``node`` (the graph's, or one made beside it reading its tensors)
    #: with input ``i`` read as ``dtypes[i]``, at the profile's opt shapes; ``None`` (the
    #: simulator, level 0) leaves INT8 preferred wherever calibration allows it.
    timer: Callable | None = None
    #: ONNX node names the user constrained to INT8 (``layer_precisions``): INT8 wherever
    #: calibration allows it, not timed against float; with ``obey``, a reason to stay in
    #: float is an error rather than a fallback.
    required: set[str] = field(default_factory=set)
    obey: bool = False

    def fall_back(self, layer: str, reason: str) -> None:
        if not any(f["layer"] == layer for f in self.fallbacks):
            self.fallbacks.append({"layer": layer, "reason": reason})


@dataclass(eq=False)
class Value:
    """A named tensor: a graph input, a node output, or a constant."""

    name: str
    info: TensorInfo | None = None
    const: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None


class Graph:
    """Nodes in topological order plus the values they connect."""

    def __init__(self, name: str = "graph", opsets: Mapping[str, int] | None = None):
        self.name = name
        self.nodes: list[Node] = []
        self.values: dict[str, Value] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.opsets: dict[str, int] = dict(opsets or {"": 17})
        #: Input shapes (and shape-tensor values) the graph will run at, e.g. an optimization
        #: profile's min/opt/max: ``[(shapes, values), ...]``. Passes use them for shape facts
        #: symbolic inference cannot prove (two dims computed along different paths).
        self.sample_inputs: list[tuple[dict, dict]] = []
        #: An INT8 build's request to the ``quantize`` passes (:class:`Int8Request`), or None.
        self.int8: Int8Request | None = None
        #: Binding formats the build asks for (``--io-format``): binding name -> format
        #: (``"channels_last"``); the ``bindings`` passes take out what they rewrote.
        self.io_formats: dict[str, str] = {}
        #: Data-dependent nodes (:meth:`plugrt.plugin.OpPlugin.output_bounds`) of a concrete
        #: graph: node name -> its outputs' bounds (:func:`plugrt.ir.infer.infer_graph`).
        self.data_dependent: dict[str, list[tuple[int, ...]]] = {}

    # ------------------------------------------------------------------ building

    def add_input(self, name: str, info: TensorInfo) -> Value:
        value = self._new_value(name, info)
        self.inputs.append(name)
        return value

    def add_const(self, name: str, array: np.ndarray) -> Value:
        array = np.asarray(array)
        return self._new_value(name, TensorInfo.of(array), const=array)

    def add_node(self, node: Node) -> Node:
        for out in node.outputs:
            if out and out not in self.values:
                self.values[out] = Value(out)
        self.nodes.append(node)
        return node

    def add_output(self, name: str) -> None:
        self.outputs.append(name)

    def _new_value(self, name: str, info: TensorInfo | None, const=None) -> Value:
        if name in self.values:
            raise ModelError(f"graph {self.name!r}: value {name!r} is defined twice")
        value = Value(name, info, const)
        self.values[name] = value
        return value

    # ------------------------------------------------------------------ queries

    def info(self, name: str) -> TensorInfo | None:
        return self.values[name].info if name else None

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    users.setdefault(name, []).append(node)
        return users

    def initializers(self) -> dict[str, np.ndarray]:
        return {v.name: v.const for v in self.values.values() if v.const is not None}

    def toposort(self) -> None:
        """Reorder nodes so each comes after the producers of its inputs (stable; see
        :func:`topological_order`)."""
        defined = set(self.inputs) | {v.name for v in self.values.values() if v.is_const}
        self.nodes = topological_order(self.nodes, defined)

    def copy(self) -> "Graph":
        other = Graph(self.name, self.opsets)
        other.nodes = list(self.nodes)
        other.values = {k: Value(v.name, v.info, v.const) for k, v in self.values.items()}
        other.inputs = list(self.inputs)
        other.outputs = list(self.outputs)
        other.sample_inputs = list(self.sample_inputs)
        other.int8 = self.int8
        other.io_formats = dict(self.io_formats)
        other.data_dependent = dict(self.data_dependent)
        return other

    def summary(self) -> str:
        return f"graph {self.name!r}: {len(self.nodes)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs"

    def __iter__(self) -> Iterable[Node]:
        return iter(self.nodes)


def topological_order(nodes: list[Node], defined: set[str]) -> list[Node]:
    """``nodes`` sorted so each comes after the producers of its inputs, stable (among nodes
    ready at the same time, the file's order wins).

    :param defined: values available before any node runs (graph inputs, initializers).
    :raises ModelError: for an output produced twice, an input nothing produces, or a cycle.
    """
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.outputs:
            if not name:
                continue
            if name in defined:
                raise ModelError(f"{node.describe()}: output {name!r} is already a graph input or initializer; "
                                 "rename one of them")
            if name in producer:
                raise ModelError(f"{node.describe()}: output {name!r} is already produced by "
                                 f"{nodes[producer[name]].describe()}; each value has one producer")
            producer[name] = index
    waiting = []  # per node, how many of its producer nodes have not run yet
    users: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        sources = set()
        for name in node.inputs:
            if not name or name in defined:
                continue
            if name not in producer:
                raise ModelError(f"node {node.name!r} reads value {name!r}, which no node, input or "
                                 "initializer produces; add the initializer or graph input it needs")
            sources.add(producer[name])
        waiting.append(len(sources))
        for source in sources:
            users.setdefault(source, []).append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users.get(index, ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(nodes):
        raise ModelError(_describe_cycle(nodes, producer, defined, set(order)))
    return [nodes[index] for index in order]


def _describe_cycle(nodes: list[Node], producer: dict[str, int], defined: set[str], done: set[int]) -> str:
    """Walk back from a node that never became ready until a node repeats: a cycle."""
    start = next(index for index in range(len(nodes)) if index not in done)
    path, seen = [start], {start: 0}
    while True:
        node = nodes[path[-1]]
        back = next(producer[n] for n in node.inputs if n and n not in defined and producer[n] not in done)
        if back in seen:
            cycle = path[seen[back]:] + [back]
            break
        seen[back] = len(path)
        path.append(back)
    cycle.reverse()  # walked against the data flow
    route = " -> ".join(f"node {nodes[index].name!r}" for index in cycle)
    return f"the graph has a cycle through {route}; ONNX graphs must be acyclic (a wrong input name?)"
