"""Checks the importer runs on an ONNX graph before building the IR: names and node order.

Names end up in plan files (JSON), messages and file names, so every name a model
carries (graph, node, value, initializer, attribute, op type, domain, symbolic dim) must
be valid UTF-8 without control characters, and at most :data:`MAX_NAME_LENGTH` characters:
a bad name is refused with a :class:`ModelError` naming where it is, never decoded
into something else. Nodes are put in topological order (the file's order wherever it is
valid, as onnxruntime accepts), and a cycle or a value nothing produces is named.
"""

from __future__ import annotations

import heapq
from typing import Iterable

from plugrt.errors import ModelError
from plugrt.ir.graph import Node

#: The longest name plugrt accepts, in characters.
MAX_NAME_LENGTH = 4096


def printable(text) -> str:
    """A name as it can be shown in a message, whatever it holds."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "backslashreplace")
    text = str(text)
    return repr(text[:80]) + ("..." if len(text) > 80 else "")


def check_name(text, what: str, empty_ok: bool = True) -> str:
    """Return ``text`` as a ``str`` if it is a usable name, else raise :class:`ModelError`.

    :param what: where the name is, for the message ("node 'conv1' input 0").
    """
    if isinstance(text, (bytes, bytearray)):
        raise ModelError(f"{what} {printable(text)} is not valid UTF-8; rename it in the model (ONNX names "
                         "are UTF-8 strings)")
    if not empty_ok and not text:
        raise ModelError(f"{what} is empty; give it a name in the model")
    if len(text) > MAX_NAME_LENGTH:
        raise ModelError(f"{what} {printable(text)} is {len(text)} characters long, over plugrt's limit of "
                         f"{MAX_NAME_LENGTH}; rename it in the model")
    bad = next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF), None)
    if bad is not None:
        raise ModelError(f"{what} {printable(text)} contains the control character U+{ord(bad):04X}; "
                         "rename it in the model")
    return text


def check_value_names(texts: Iterable, what: str) -> tuple[str, ...]:
    return tuple(check_name(text, f"{what} {i}") for i, text in enumerate(texts))


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
