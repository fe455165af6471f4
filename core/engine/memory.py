"""Activation memory planning: tensors whose lifetimes overlap never share bytes.

The builder gives every activation a size (at the profile's max shapes) and a lifetime
(first and last layer index that touches it); :func:`plan_memory` assigns each an offset
in one arena. Greedy best-fit over sizes in decreasing order, which is what TensorRT-style
planners do and is within a few percent of the lower bound on real networks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

ALIGNMENT = 256
#: The largest arena the builder plans: 2^40 bytes (1 TiB), or less where the device has
#: less memory (the builder checks both). Sizes are Python ints, so nothing overflows.
MAX_ARENA_BYTES = 1 << 40


@dataclass(frozen=True)
class MemoryPlan:
    """Arena offsets per tensor, the arena size, and the lower bound (peak live bytes)."""

    offsets: dict[str, int]
    sizes: dict[str, int]
    arena_bytes: int
    peak_live_bytes: int


def align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def plan_memory(sizes: Mapping[str, int], lifetimes: Mapping[str, tuple[int, int]],
                alignment: int = ALIGNMENT) -> MemoryPlan:
    """Assign arena offsets so that tensors alive at the same time do not overlap.

    :param sizes: bytes per tensor.
    :param lifetimes: ``(first, last)`` layer index per tensor, inclusive.
    """
    sizes = {name: int(size) for name, size in sizes.items()}
    for name, size in sizes.items():
        if size < 0:
            raise ValueError(f"tensor {name!r} has a negative size {size}")
    order = sorted(sizes, key=lambda name: (-sizes[name], lifetimes[name][0], name))
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    offsets: dict[str, int] = {}
    for name in order:
        size = align(max(int(sizes[name]), 1), alignment)
        first, last = lifetimes[name]
        busy = sorted((off, end) for off, end, f, l in placed if f <= last and first <= l)
        offset = _best_gap(busy, size)
        offsets[name] = offset
        placed.append((offset, offset + size, first, last))
    arena = max((end for _, end, _, _ in placed), default=0)
    return MemoryPlan(offsets, dict(sizes), arena, _peak(sizes, lifetimes, alignment))


def liveness(graph, layer_nodes: list[int], shared: Mapping[str, str] | None = None
             ) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """Bytes and lifetime of each arena tensor (graph inputs, device-layer outputs) of a
    graph with concrete shapes, given the node index of each device layer in order.

    ``shared`` maps a name to the name whose buffer it is a view of (alias layers,
    :func:`plugrt.engine.aliases.storage`): it takes no bytes of its own, and every layer
    touching it keeps that buffer alive.
    """
    shared = shared or {}
    position = {index: i + 1 for i, index in enumerate(layer_nodes)}
    end = len(layer_nodes) + 1
    sizes, lifetimes = {}, {}

    def nbytes(name):
        info = graph.info(name)
        return math.prod(int(d) for d in info.shape) * info.dtype.itemsize

    def touch(name, at):
        span = lifetimes.get(shared.get(name, name))
        if span is not None:
            span[0], span[1] = min(span[0], at), max(span[1], at)

    for name in graph.inputs:
        sizes[name], lifetimes[name] = nbytes(name), [0, 0]
    for index in layer_nodes:
        for name in graph.nodes[index].outputs:
            if name and name not in shared:
                sizes[name] = nbytes(name)
                lifetimes[name] = [position[index]] * 2
    for index in layer_nodes:
        node = graph.nodes[index]
        for name in [*node.inputs, *node.outputs]:
            if name:
                touch(name, position[index])
    for name in graph.outputs:
        touch(name, end)
    return sizes, {k: tuple(v) for k, v in lifetimes.items()}


def _best_gap(busy: list[tuple[int, int]], size: int) -> int:
    """The smallest free gap that fits ``size`` between busy intervals, else the top."""
    best, best_slack, cursor = None, None, 0
    for off, end in busy:
        if off - cursor >= size and (best_slack is None or off - cursor - size < best_slack):
            best, best_slack = cursor, off - cursor - size
        cursor = max(cursor, end)
    return best if best is not None else cursor


def _peak(sizes, lifetimes, alignment) -> int:
    events = sorted({t for pair in lifetimes.values() for t in pair})
    peak = 0
    for t in events:
        live = sum(align(max(int(sizes[n]), 1), alignment) for n, (f, l) in lifetimes.items() if f <= t <= l)
        peak = max(peak, live)
    return peak


def value_shapes(graph) -> dict[str, list[int]]:
    """Each non-constant value's shape, as plans record them (``shapes.opt``, ``shapes.max``)."""
    return {name: list(value.info.shape) for name, value in graph.values.items()
            if value.info is not None and value.const is None}


def largest_shapes(graphs) -> dict[str, list[int]]:
    """Each non-constant value's shape where it holds the most bytes among ``graphs`` (one
    per optimization profile, at its max shapes): what buffers are sized for."""
    found: dict[str, list[int]] = {}
    for graph in graphs:
        for name, shape in value_shapes(graph).items():
            if name not in found or math.prod(shape) > math.prod(found[name]):
                found[name] = shape
    return found


def liveness_all(graphs, layer_nodes: list[int], shared: Mapping[str, str] | None = None
                 ) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """:func:`liveness` over one graph per profile (the same nodes at different shapes):
    each tensor's largest size; the lifetimes are the graphs' own (the same in each)."""
    sizes, lifetimes = liveness(graphs[0], layer_nodes, shared)
    for graph in graphs[1:]:
        more, _ = liveness(graph, layer_nodes, shared)
        sizes = {name: max(size, more[name]) for name, size in sizes.items()}
    return sizes, lifetimes
