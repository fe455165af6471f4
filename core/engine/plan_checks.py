"""A loaded plan checked against its own graph and the installed plugins.

:mod:`plugrt.engine.plan_schema` has checked each header field's type and range; this
module checks what only the plugins and the graph can tell, before anything is allocated:
the graph's structure, every attribute through its plugin as at import (fused layers'
inner nodes too), shape inference, the profile against the inputs, one layer per device
node and its tactic offered by the plugin (an alias layer: allowed by its plugin and the
binding rules of :mod:`plugrt.engine.aliases`), and the memory plan re-derived from the
graph at the profile's max shapes (offsets aligned, inside the arena, live tensors apart;
arena and workspace no larger than the shapes need). Each problem is a :class:`PlanError`.
"""

from __future__ import annotations

import json
import math

import numpy as np

from plugrt.engine import aliases as alias_rules
from plugrt.engine.memory import ALIGNMENT, align, largest_shapes, liveness_all, value_shapes
from plugrt.engine.plan_schema import MAX_BYTES, fix
from plugrt.errors import PlanError, PlugrtError
from plugrt.fusion.op import body_nodes, is_fused
from plugrt.ir.attributes import check_resolved
from plugrt.ir.validate import validate_graph
from plugrt.plugin import ANCHOR


def _refuse(label: str, where: str, exc: PlugrtError | str) -> PlanError:
    return PlanError(f"plan {label}: {where}: {exc}; {fix()}")


def check_structure(graph, registry, label: str) -> None:
    """Values defined before use, once; outputs produced; fused bodies wired inside."""
    if not graph.outputs:
        raise _refuse(label, "graph.outputs", "an engine needs at least one output")
    try:
        validate_graph(graph, None, require_types=False)
    except PlugrtError as exc:
        raise _refuse(label, "graph", exc) from None
    for i, node in enumerate(graph.nodes):
        if is_fused(node):
            _check_body(node, registry, f"graph.nodes[{i}]", label)


def _check_body(node, registry, path: str, label: str) -> None:
    """A fused body reads only the layer's inputs and its own earlier outputs, reads every
    input, and makes every output; an anchor's inputs come first, in its order."""
    body = body_nodes(node)
    if not body:
        raise _refuse(label, f"{path}.attrs.body", "a fused layer needs at least one inner node")
    first = registry.find_op(body[0].domain, body[0].op_type, body[0].opset)
    if first is not None and ANCHOR in first.groups:
        count = len(body[0].inputs)
        made = {name for inner in body for name in inner.outputs}
        leaves = {name for inner in body[1:] for name in inner.inputs if name and name not in made}
        if tuple(node.inputs[:count]) != tuple(body[0].inputs) or set(node.inputs[count:]) - {""} != leaves:
            raise _refuse(label, f"{path}.inputs", f"must be the anchor's inputs {list(body[0].inputs)} followed "
                                                   f"by the values its epilogue reads {sorted(leaves)}")
    available, read = set(node.inputs), set()
    for k, inner in enumerate(body):
        for name in inner.inputs:
            if name and name not in available:
                raise _refuse(label, f"{path}.attrs.body[{k}].inputs",
                              f"{name!r} is neither an input of the fused layer nor made earlier in its body")
            read.add(name)
        available.update(n for n in inner.outputs if n)
    for k, inner in enumerate(body):
        if not any(name in read or name in node.outputs for name in inner.outputs if name):
            raise _refuse(label, f"{path}.attrs.body[{k}].outputs", f"{inner.describe()}: no output is used "
                                                                     "inside or outside the fused layer")
    for name in node.inputs:
        if name and name not in read:
            raise _refuse(label, f"{path}.inputs", f"{name!r} is not read by the fused layer's body")
    for name in node.outputs:
        if name not in available:
            raise _refuse(label, f"{path}.outputs", f"{name!r} is not made by the fused layer's body")


def check_attributes(graph, registry, label: str) -> None:
    """Every node's attributes, and each fused layer's inner nodes', through the plugin."""
    for i, node in enumerate(graph.nodes):
        parts = [(f"graph.nodes[{i}].attrs", node)]
        if is_fused(node):
            parts += [(f"graph.nodes[{i}].attrs.body[{k}].attrs", inner) for k, inner in enumerate(body_nodes(node))]
        for path, part in parts:
            try:
                check_resolved(part, registry.op(part))
            except PlugrtError as exc:
                raise _refuse(label, path, exc) from None


def infer(graph, registry, label: str) -> None:
    """Shape inference, which runs each plugin's ``check`` as at import."""
    from plugrt.ir.infer import infer_graph

    try:
        infer_graph(graph, registry)
    except PlugrtError as exc:
        raise _refuse(label, "graph", exc) from None


def load_profiles(header: dict, graph, registry, label: str) -> tuple[list, list]:
    """The plan's optimization profiles, each checked against the graph
    (:func:`check_profile`), and the graph at each one's opt and max shapes."""
    from plugrt.engine.profile import OptimizationProfile

    profiles, graphs = [], []
    for index, data in enumerate(header["profiles"]):
        where = f"profiles[{index}]"
        try:
            profile = OptimizationProfile.from_json(data)
        except PlugrtError as exc:
            raise _refuse(label, where, exc) from None
        check_profile(graph, profile, label, where)
        graphs.append((concretize_at(graph, profile, 1, registry, label, where),
                       concretize_at(graph, profile, 2, registry, label, where)))
        profiles.append(profile)
    return profiles, graphs


def load_specialized(entries, graph, profiles: list, registry, label: str) -> list[tuple[int, object]]:
    """``(profile index, graph at the shapes)`` of each specialized shape set: a list of
    ``{"profile", "shapes"}``, every input's shape inside that profile."""
    from plugrt.ir.specialize import concretize

    if not isinstance(entries, list):
        raise _refuse(label, "specialized", "must be a list")
    found = []
    for k, entry in enumerate(entries):
        where = f"specialized[{k}]"
        index = entry.get("profile") if isinstance(entry, dict) else None
        shapes = entry.get("shapes") if isinstance(entry, dict) else None
        if (isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(profiles)
                or not isinstance(shapes, dict) or set(entry) != {"profile", "shapes"}
                or set(shapes) != set(graph.inputs)):
            raise _refuse(label, where, f"must be {{'profile': 0..{len(profiles) - 1}, 'shapes': a shape for each "
                                        f"input {sorted(graph.inputs)}}}")
        try:
            dims = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
            if not all(profiles[index].contains(name, shape) for name, shape in dims.items()):
                raise PlugrtError(f"shapes {dims} lie outside profile {index}")
            found.append((index, concretize(graph, dims, registry, profiles[index].shape_values)))
        except (TypeError, ValueError, PlugrtError) as exc:
            raise _refuse(label, where, exc) from None
    return found


def check_profile(graph, profile, label: str, where: str = "profiles[0]") -> None:
    """The profile covers exactly the graph's inputs, at their ranks and static dims."""
    from plugrt.engine.profile import BuilderConfig, resolve_profile

    try:
        resolved = resolve_profile(graph, BuilderConfig(profiles=[profile]))
    except PlugrtError as exc:
        raise _refuse(label, where, exc) from None
    for name in graph.inputs:
        if name not in profile.shapes:
            raise _refuse(label, where, f"input {name!r} has no shape range")
    if resolved.shape_values != profile.shape_values:
        raise _refuse(label, where, "shape-tensor values are given for an input that takes none")


def concretize_at(graph, profile, which: int, registry, label: str, where: str = "profiles[0]"):
    """The graph at the profile's min (0), opt (1) or max (2) shapes."""
    from plugrt.ir.specialize import concretize

    shapes = {name: entry[which] for name, entry in profile.shapes.items()}
    try:
        return concretize(graph, shapes, registry, profile.values_at(which))
    except PlugrtError as exc:
        raise _refuse(label, f"{where}.{('min', 'opt', 'max')[which]}", exc) from None


def check_shapes(header: dict, graphs: list, label: str) -> None:
    """The recorded shapes are the graph's at the first profile's opt shapes and, for
    ``max``, each tensor's largest over the profiles' max shapes; no tensor there holds
    more than :data:`MAX_BYTES`."""
    max_graphs = [m for _, m in graphs]
    for max_graph in max_graphs:
        for name, value in max_graph.values.items():
            info = value.info
            if info is None or not all(isinstance(d, (int, np.integer)) for d in info.shape):
                continue
            if math.prod(int(d) for d in info.shape) * info.dtype.itemsize > MAX_BYTES:
                raise _refuse(label, "graph", f"value {name!r} has shape {list(info.shape)} at the profile's max "
                                              f"shapes, more than {MAX_BYTES} bytes")
    for which, found in (("opt", value_shapes(graphs[0][0])), ("max", largest_shapes(max_graphs))):
        if header["shapes"][which] != found:
            whose = "profile's" if len(graphs) == 1 else "profiles'"
            raise _refuse(label, f"shapes.{which}", f"the recorded shapes differ from the graph's at the {whose} "
                                                    f"{which} shapes")


def check_layers(layers, registry, graphs: list, label: str, specials: list = ()) -> int:
    """One layer per device node, each tactic (one per profile) offered by its plugin at
    that profile's opt shapes; returns the workspace the layers may ask for (each at most
    what its tactics need at the profiles' max shapes)."""
    from plugrt.ir.specialize import is_host_node

    max_graph = graphs[0][1]
    device = [i for i, node in enumerate(max_graph.nodes) if not is_host_node(max_graph, node)]
    recorded = [layer.node_index for layer in layers]
    if recorded != device:
        missing = sorted(set(device) - set(recorded)) or sorted(set(recorded) - set(device))
        raise _refuse(label, "layers", f"the device layers must run nodes {device}, not {recorded} "
                                       f"(node {missing[0]} differs)")
    for _, other in graphs:
        _check_aliases(layers, registry, other, label)
    for i, layer in enumerate(layers):
        if layer.alias is not None:
            continue
        count = len(layer.profile_tactics or ())
        if count != (len(graphs) - 1 if len(graphs) > 1 else count):
            raise _refuse(label, f"layers[{i}].profile_tactics", f"{count} tactics for {len(graphs) - 1} later "
                                                                  "profiles")
        if layer.generic_tactics is not None and len(layer.generic_tactics) != len(graphs):
            raise _refuse(label, f"layers[{i}].generic_tactics", f"{len(layer.generic_tactics)} entries for "
                                                                  f"{len(graphs)} profiles")
        bound = 0
        for profile, (opt_graph, max_graph) in enumerate(graphs):
            where = f"layers[{i}].tactic" if profile == 0 else f"layers[{i}].profile_tactics[{profile - 1}]"
            bound = max(bound, _check_tactic(layer, layer.tactic_for(profile), registry, opt_graph, max_graph,
                                             label, where, i))
            if layer.generic_tactics and layer.generic_tactics[profile] is not None:
                _check_tactic(layer, layer.generic_tactics[profile], registry, opt_graph, max_graph, label,
                              f"layers[{i}].generic_tactics[{profile}]", i)
        if len(layer.specialized_tactics or specials) != len(specials):
            raise _refuse(label, f"layers[{i}].specialized_tactics", f"{len(layer.specialized_tactics)} tactics for "
                                                                      f"{len(specials)} specialized shapes")
        for k, (profile, graph) in enumerate(specials if layer.specialized_tactics else ()):
            bound = max(bound, _check_tactic(layer, layer.specialized_tactics[k], registry, graph, graph, label,
                                             f"layers[{i}].specialized_tactics[{k}]", i))
        if layer.workspace_bytes > bound:
            whose = "its tactic needs at the profile's" if len(graphs) == 1 else "its tactics need at the profiles'"
            raise _refuse(label, f"layers[{i}].workspace_bytes", f"{layer.workspace_bytes} is more than the "
                          f"{bound} bytes {whose} max shapes")
    return max((layer.workspace_bytes for layer in layers), default=0)


def _check_tactic(layer, tactic: dict, registry, opt_graph, max_graph, label: str, where: str, i: int) -> int:
    """``tactic`` is offered at opt shapes; returns what it needs at max shapes."""
    from plugrt.ir.specialize import is_host_node

    node = max_graph.nodes[layer.node_index]
    pick = opt_graph if not is_host_node(opt_graph, opt_graph.nodes[layer.node_index]) else max_graph
    offered = _tactics(registry, node, pick, label, i)
    same = [t for t in offered if t.name == tactic["name"] and t.provider == tactic.get("provider")
            and _json(dict(t.params)) == _json(tactic["params"])]
    if not same:
        raise _refuse(label, where, f"{node.describe()}: plugin {layer.plugin!r} offers no "
                      f"tactic {tactic['name']!r} with params {tactic['params']} "
                      f"(it offers {sorted({t.name for t in offered})})")
    at_max = _tactics(registry, node, max_graph, label, i) if pick is not max_graph else offered
    needs = [int(t.workspace_bytes) for t in at_max if (t.name, t.provider) == (tactic["name"], tactic.get("provider"))]
    return max(needs or [int(t.workspace_bytes) for t in at_max] or [0])


def _check_aliases(layers, registry, max_graph, label: str) -> None:
    """The alias layers are ones the plugins and the binding rules allow at max shapes."""
    recorded = _aliases(layers)
    problem = alias_rules.check_recorded(max_graph, registry, recorded, [layer.node_index for layer in layers])
    if problem is not None:
        index, why = problem
        i = next(k for k, layer in enumerate(layers) if layer.node_index == index)
        raise _refuse(label, f"layers[{i}].alias", why)


def _aliases(layers) -> dict[int, int]:
    return {layer.node_index: layer.alias for layer in layers if layer.alias is not None}


def _tactics(registry, node, graph, label: str, i: int) -> list:
    ins = [graph.info(name) if name else None for name in node.inputs]
    outs = [graph.info(name) for name in node.outputs if name]
    try:
        return registry.tactics(registry.op(node), node, ins, outs)
    except PlugrtError as exc:
        raise _refuse(label, f"layers[{i}]", exc) from None
    except Exception as exc:  # a plugin's bug, reached through this plan's data
        raise _refuse(label, f"layers[{i}]", f"{node.describe()}: the plugin failed to offer tactics "
                                             f"({type(exc).__name__}: {exc})") from None


def _json(value):
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def check_memory(header: dict, layers, max_graphs: list, workspace: int, label: str) -> None:
    """Offsets place every arena tensor aligned, inside
    the arena and apart from those live at the same time; the arena is no larger than all
    tensors side by side, the workspace the largest layer's."""
    memory = header["memory"]
    if memory["workspace_bytes"] != workspace:
        raise _refuse(label, "memory.workspace_bytes", f"{memory['workspace_bytes']} differs from the layers' "
                                                        f"largest workspace, {workspace}")
    nodes = [layer.node_index for layer in layers]
    sizes, lifetimes = liveness_all(max_graphs, nodes, alias_rules.storage(max_graphs[0], _aliases(layers), nodes))
    offsets, arena = memory["offsets"], memory["arena_bytes"]
    if set(offsets) != set(sizes):
        extra = sorted(set(offsets) ^ set(sizes))[0]
        raise _refuse(label, "memory.offsets", f"must place exactly the arena tensors {sorted(sizes)}; "
                                               f"{extra!r} differs")
    spans = {}
    for name, size in sizes.items():
        offset, end = offsets[name], offsets[name] + align(max(size, 1))
        if offset % ALIGNMENT or end > arena:
            raise _refuse(label, f"memory.offsets[{name!r}]", f"{offset} must be a multiple of {ALIGNMENT} with "
                                                               f"its {size} bytes inside the {arena}-byte arena")
        spans[name] = (offset, end)
    names = sorted(sizes)
    for k, a in enumerate(names):
        for b in names[k + 1:]:
            (fa, la), (fb, lb) = lifetimes[a], lifetimes[b]
            live_together = fa <= lb and fb <= la
            if live_together and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]:
                raise _refuse(label, f"memory.offsets[{b!r}]", f"{b!r} shares arena bytes with {a!r}, "
                                                               "which is live at the same time")
    bound = sum(align(max(size, 1)) for size in sizes.values())
    if arena > max(bound, 1):
        raise _refuse(label, "memory.arena_bytes", f"{arena} is more than its tensors need side by side "
                                                   f"({bound} bytes at the profile's max shapes)")
