"""Pointwise-chain fusion: connected pointwise ops of one output shape become one kernel.

Walking the graph in order, a fusible pointwise node joins the groups of its pointwise
producers that have its output shape (chains and diamonds), as long as the merged group
stays convex: no path leaves the group and comes back into it, which would make the
fused node depend on itself. Each group of two or more nodes becomes one
``plugrt.fused::Fused`` node; its outputs are the members' values read outside the group
(or graph outputs), all of the group's shape, so one generated kernel writes them all.
Inputs may broadcast (NumPy rules); constants are read as scalars where they are one.
"""

from __future__ import annotations

from plugrt.fusion.op import fused_node, is_fusible_pointwise
from plugrt.passes.rewrite import finish, remove_nodes, replace_node, shape_facts


def run(graph, registry) -> int:
    groups = _groups(graph, registry)
    readers = graph.consumers()
    fused = 0
    for members in groups:
        if len(members) < 2:
            continue
        inside = {id(n) for n in members}
        produced = [o for n in members for o in n.outputs if o]
        inputs: list[str] = []
        for node in members:
            inputs += [name for name in node.inputs if name and name not in produced and name not in inputs]
        outputs = [name for name in produced
                   if name in graph.outputs or any(id(r) not in inside for r in readers.get(name, []))]
        node = fused_node(" + ".join(m.name for m in members), members, inputs, outputs, registry)
        replace_node(graph, members[-1], node)
        remove_nodes(graph, members[:-1])
        fused += 1
    if fused:
        finish(graph, registry)
    return fused


def _groups(graph, registry) -> list[list]:
    """Convex groups of fusible pointwise nodes of equal output shape, in graph order."""
    producers = graph.producers()
    position = _position(graph)
    shape_of = shape_facts(graph, registry)
    group_of: dict[int, int] = {}
    groups: dict[int, list] = {}
    for node in graph.nodes:
        if not is_fusible_pointwise(graph, registry, node):
            continue
        shape = shape_of(node.outputs[0])
        candidates = []
        for name in node.inputs:
            producer = producers.get(name)
            gid = group_of.get(id(producer)) if producer is not None else None
            if gid is not None and gid not in candidates and shape_of(groups[gid][0].outputs[0]) == shape:
                candidates.append(gid)
        chosen = _merge_choice(graph, producers, groups, candidates, node)
        members = [m for gid in chosen for m in groups.pop(gid)] + [node]
        members.sort(key=position)
        gid = id(node)
        groups[gid] = members
        for member in members:
            group_of[id(member)] = gid
    return sorted(groups.values(), key=lambda members: position(members[-1]))


def _merge_choice(graph, producers, groups, candidates: list, node) -> list:
    """All candidate groups if the union with ``node`` stays convex, else the first that
    does, else none."""
    options = [candidates] + [[gid] for gid in candidates]
    for option in options:
        if option and _convex(producers, [m for gid in option for m in groups[gid]] + [node]):
            return option
    return []


def _convex(producers, members: list) -> bool:
    """No path from a member through an outside node back to a member."""
    inside = {id(m) for m in members}
    # Walk upward from each member through outside nodes; reaching a member again means
    # some outside node lies between two members.
    seen: set[int] = set()
    stack = [producers.get(name) for m in members for name in m.inputs if name]
    stack = [p for p in stack if p is not None and id(p) not in inside]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for name in node.inputs:
            producer = producers.get(name) if name else None
            if producer is None:
                continue
            if id(producer) in inside:
                return False
            stack.append(producer)
    return True


def _position(graph):
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    return lambda node: order[id(node)]
