"""Layout layers as aliases: a Reshape, Flatten, Squeeze, Unsqueeze or Identity costs nothing.

A plugin says through :meth:`plugrt.plugin.OpPlugin.aliases` that a node's output 0 is one
of its inputs' bytes under another shape (same dtype, the same elements in the same
row-major order). Such a device layer runs no kernel and copies nothing: its output is a
view of the same device buffer, and the memory plan keeps that buffer alive until the
last reader of any name it holds.

Names linked by alias layers share one buffer, that of the group's *owner*:

- the root (the one tensor of the group no alias layer makes) owns it: an arena tensor, an
  engine input's or output's buffer, a weight or a value uploaded from the host;
- where the root is an arena tensor and an engine output is in the group, the output takes
  the buffer over: the layer making the root writes straight into the output binding (the
  caller's memory when it is bound in place), so the output costs no copy either;
- an alias layer whose output is an engine output but whose group cannot be taken over
  (the root is an engine input, a weight, a host value, another engine output, or the
  group has an output already) stays a kernel layer: its plugin's copy tactic runs it.

Every name of an engine input's group points into the input's buffer, and every name of
a taken-over group into the output's, so binding a caller's buffer in place
(:meth:`plugrt.engine.specialization.Specialization.bind`) moves them all, in the prepared
launches and in a captured CUDA graph alike.

:func:`choose` decides, at the profile's max shapes, walking the device layers in order;
the plan records the choice (``LayerRecord.alias``) and loading checks it again
(:func:`check_recorded`). :func:`storage` maps each name to its owner, for the memory plan
(:func:`plugrt.engine.memory.liveness`) and for each execution context's views.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np

from plugrt.errors import PluginError
from plugrt.ir.dims import is_static
from plugrt.passes.rewrite import extra_outputs_used

#: What a plan records as an alias layer's tactic: it runs none.
ALIAS_TACTIC = {"name": "alias", "params": {}}


def asked(graph, registry, node, readers=None) -> int | None:
    """The input whose bytes the node's plugin says output 0 is, checked; ``None`` when the
    plugin says none or the node's other outputs are used."""
    if not node.outputs or not node.outputs[0] or extra_outputs_used(graph, node, readers):
        return None
    op = registry.op(node)
    inputs = [graph.info(name) if name else None for name in node.inputs]
    source = op.aliases(node, inputs)
    if source is None:
        return None
    plugin = type(op).__name__
    if isinstance(source, bool) or not isinstance(source, (int, np.integer)) or not 0 <= source < len(inputs) \
            or inputs[source] is None:
        raise PluginError(f"{node.describe()}: aliases() of plugin {plugin} returned {source!r}, which is not "
                          "the index of an input the node has")
    src, out = inputs[source], graph.info(node.outputs[0])
    if out.dtype != src.dtype:
        raise PluginError(f"{node.describe()}: aliases() of plugin {plugin} says output 0 is input {source}'s "
                          f"bytes, but their dtypes differ ({out.dtype} and {src.dtype})")
    if is_static(out.shape) and is_static(src.shape) and _count(out.shape) != _count(src.shape):
        raise PluginError(f"{node.describe()}: aliases() of plugin {plugin} says output 0 is input {source}'s "
                          f"bytes, but they hold {_count(out.shape)} and {_count(src.shape)} elements")
    return int(source)


def choose(graph, registry, layer_nodes: Iterable[int]) -> dict[int, int]:
    """The alias layers among the device layers ``layer_nodes`` (node indices, in order) of a
    graph at concrete shapes: node index -> the input whose bytes its output 0 is."""
    readers = graph.consumers()
    layer_nodes = list(layer_nodes)
    wanted = {}
    for index in layer_nodes:
        source = asked(graph, registry, graph.nodes[index], readers)
        if source is not None:
            wanted[index] = source
    return admit(graph, wanted, layer_nodes)[0]


def choose_all(graphs, registry, layer_nodes: Iterable[int]) -> dict[int, int]:
    """:func:`choose` over one graph per optimization profile (each at its max shapes): a
    layer is an alias only where its plugin says so at every profile's shapes."""
    layer_nodes = list(layer_nodes)
    chosen = [choose(graph, registry, layer_nodes) for graph in graphs]
    agreed = {index: source for index, source in chosen[0].items() if all(c.get(index) == source for c in chosen[1:])}
    return admit(graphs[0], agreed, layer_nodes)[0]


def storage(graph, aliases: Mapping[int, int], layer_nodes: Iterable[int]) -> dict[str, str]:
    """Each name that holds no bytes of its own -> the name whose buffer it is a view of
    (the alias layers' outputs; a root an engine output took over)."""
    return admit(graph, aliases, layer_nodes)[1]


def admit(graph, wanted: Mapping[int, int], layer_nodes: Iterable[int]) -> tuple[dict[int, int], dict[str, str]]:
    """The alias layers of ``wanted`` (node index -> input) that the binding rules (module
    doc) allow, walked in graph order, and the owner of each name that has one."""
    made = {name for index in layer_nodes for name in graph.nodes[index].outputs if name}
    outputs = set(graph.outputs)
    owner: dict[str, str] = {}
    admitted = {}
    for index in sorted(wanted):
        node = graph.nodes[index]
        source, out = node.inputs[wanted[index]], node.outputs[0]
        root = owner.get(source, source)
        if out in outputs:
            if root not in made or root in outputs:
                continue  # a copy: the group's buffer is not one the output can take over
            for name, held in owner.items():
                if held == root:
                    owner[name] = out
            owner[root] = out
        else:
            owner[out] = root
        admitted[index] = wanted[index]
    return admitted, owner


def check_recorded(graph, registry, recorded: Mapping[int, int], layer_nodes: Iterable[int]) -> tuple[int, str] | None:
    """Whether a plan's alias layers (node index -> input) are ones this plugrt and the
    installed plugins allow at these shapes: ``None``, or the node index and why not.
    A plan may run as a copy what this plugrt would alias (a plan from before aliases)."""
    readers = graph.consumers()
    for index, source in sorted(recorded.items()):
        node = graph.nodes[index]
        try:
            allowed = asked(graph, registry, node, readers)
        except PluginError as exc:
            return index, str(exc)
        if allowed != source:
            said = "runs it as no alias" if allowed is None else f"says output 0 is input {allowed}'s bytes"
            return index, (f"{node.describe()} is recorded as an alias of input {source}, but its plugin "
                           f"{type(registry.op(node)).__name__} {said}")
    admitted = admit(graph, recorded, layer_nodes)[0]
    for index in sorted(recorded):
        if index not in admitted:
            node = graph.nodes[index]
            return index, (f"{node.describe()} is recorded as an alias, but its output {node.outputs[0]!r} is an "
                           "engine output that cannot take over its input's buffer (it needs a copy)")
    return None


def _count(shape) -> int:
    return math.prod(int(d) for d in shape)


__all__ = ["ALIAS_TACTIC", "asked", "choose", "storage", "admit", "check_recorded"]
