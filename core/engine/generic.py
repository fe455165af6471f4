"""Shape-generic tactics: kernels that serve every shape of a profile, so that a shape no
context has seen compiles nothing.

A layer runs its tuned tactic (:attr:`LayerRecord.tactic`, per profile
:meth:`LayerRecord.tactic_for`) at the profile's opt shapes, the one it was timed at, and
its *generic* tactic at any other shape (:meth:`LayerRecord.generic_for`). A tactic is
generic when its launches run the same code at the profile's min and max shapes, at an
odd shape between them and at one of powers of two (:func:`probe_shapes`): the same launch keys and the same kernel
identities (:func:`plugrt.binaries.kernel_identity`), so one compiled kernel each (the
plan carries them, :mod:`plugrt.engine.plan_kernels`) serves every shape. The tuned
tactic is kept as the generic one where it is generic itself; otherwise the first generic
tactic the plugin offers at opt shapes, those named most like the tuned one first (a
plugin offers a twin without its shape-specialized code paths, as the attention plugin's
bounds-checked ``NAME_ragged`` tiles), ties in its preference order. A layer with none
is named in a warning: a new shape compiles its kernels at run time.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field

import numpy as np

from plugrt import binaries
from plugrt.errors import PlugrtError
from plugrt.ir.specialize import concretize, is_host_node
from plugrt.tactic import allowed
from plugrt.tuning.kernel_keys import launch_keys, layer_key

log = logging.getLogger("plugrt.builder")


@dataclass(frozen=True)
class Probe:
    """One probe: input shapes, shape-tensor input values, and how data-dependent outputs
    are sized (a rule of :data:`plugrt.ir.infer.SIZE_RULES`)."""

    shapes: dict
    values: dict = field(default_factory=dict)
    sizes: str = "max"

    def graph(self, graph, registry):
        return concretize(graph, self.shapes, registry, self.values, self.sizes)


def probes(profile, data_dependent: bool = False) -> list[Probe]:
    """What a tactic must run the same code at to be generic over ``profile``: its min and
    max (shapes, shape-tensor values and, for a graph with ``data_dependent`` layers, the
    sizes those report), one between (each dim halfway, made odd where the range allows)
    and one of powers of two (each the largest in its range: where tiles divide the sizes);
    fewer where they coincide. Empty where all coincide."""
    corners = [{name: tuple(entry[which]) for name, entry in profile.shapes.items()} for which in (0, 2)]
    values = [profile.values_at(which) for which in (0, 1, 2)]
    middle = {name: tuple(_odd_between(a, c) for a, c in zip(*(s[name] for s in corners))) for name in corners[0]}
    even = {name: tuple(_power_of_two_within(a, c) for a, c in zip(*(s[name] for s in corners))) for name in corners[0]}
    found = []
    for shapes, vals, sizes in ((corners[0], values[0], "min"), (corners[1], values[2], "max"),
                                (middle, _between(values, _odd_between), "odd"),
                                (even, _between(values, _power_of_two_within), "even")):
        probe = Probe(shapes, vals, sizes if data_dependent else "max")
        if probe not in found:
            found.append(probe)
    return found if len(found) > 1 else []


def probe_shapes(profile) -> list[dict]:
    """The input shapes of :func:`probes` (a profile without shape-tensor inputs)."""
    return [probe.shapes for probe in probes(profile)]


def _between(values: list[dict], pick) -> dict:
    """Shape-tensor values between min and max by ``pick``; the opt values where they are
    not all whole numbers."""
    low, opt, high = values
    return {name: [pick(int(a), int(c)) for a, c in zip(low[name], high[name])]
            if all(float(v) == int(v) for v in low[name] + high[name]) else opt[name] for name in opt}


def _power_of_two_within(a: int, c: int) -> int:
    """The largest power of two in ``[a, c]`` (tiles divide it: a kernel that leaves out
    bounds checks there shows it), else ``a``."""
    power = 1 << max(int(c), 1).bit_length() - 1
    return power if a <= power <= c else a


def _odd_between(a: int, c: int) -> int:
    middle = (a + c) // 2
    if middle % 2 == 0 and a < middle + 1 <= c:
        return middle + 1
    return middle


def choose_generic(engine, tf32: bool = True) -> None:
    """Set each layer's generic tactic per profile (:attr:`LayerRecord.generic_tactics`),
    among the tactics the build allows (none on TF32 tensor cores unless ``tf32``); warn
    once naming the layers with none."""
    registry, layers = engine.registry, engine.layers
    generic: dict[int, list] = {}
    missing: list[str] = []
    opt_graphs = [concretize(engine.graph, {n: e[1] for n, e in p.shapes.items()}, registry, p.shape_values)
                  for p in engine.profiles]
    for index, profile in enumerate(engine.profiles):
        opt = opt_graphs[index]
        found = probes(profile, bool(opt.data_dependent))
        if not found:
            continue
        graphs = [probe.graph(engine.graph, registry) for probe in found]
        for k, layer in enumerate(layers):
            node = engine.graph.nodes[layer.node_index]
            if layer.alias is not None or is_host_node(graphs[0], graphs[0].nodes[layer.node_index]):
                continue
            tuned = layer.tactic_for(index)
            chosen = _generic_tactic(registry, opt.nodes[layer.node_index], opt, graphs, layer, tuned,
                                     engine.device_weights(), tf32)
            if chosen is None:
                missing.append(f"{node.name} (profile {index})")
            generic.setdefault(k, [None] * len(engine.profiles))[index] = chosen if chosen != tuned else None
    for k, entries in generic.items():
        if any(entry is not None for entry in entries):
            layers[k] = layers[k].with_generic(entries)
    if missing:
        log.warning("%d layer(s) have no tactic that runs the same kernels at every shape of their profile: %s; "
                    "a shape other than the opt shape compiles their kernels when a context first runs it",
                    len(missing), ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))


def _generic_tactic(registry, node, opt_graph, graphs: list, layer, tuned: dict, weights: dict,
                    tf32: bool = True) -> dict | None:
    """The tuned tactic when it is generic, else the first generic one offered at opt
    shapes by the tuned tactic's provider (and allowed: :func:`plugrt.tactic.allowed`);
    ``None`` when none is."""
    from plugrt.engine.specialization import find_tactic

    op = registry.op(node)
    offered = allowed(registry.tactics(op, node, [opt_graph.info(n) if n else None for n in node.inputs],
                                       [opt_graph.info(n) for n in node.outputs if n]), tf32)
    others = [t.identity() for t in offered if t.provider == tuned.get("provider")
              and (t.name, dict(t.params)) != (tuned["name"], tuned["params"])]
    # Those named most like the tuned tactic first (a plugin's twin of it without its
    # shape-specialized code paths: "NAME_ragged" for "NAME", "NAME_splitk_ragged" for
    # "NAME_splitk12"), ties in the plugin's order.
    candidates = [tuned] + sorted(others, key=lambda t: -_common_prefix(t["name"], tuned["name"]))
    for candidate in candidates:
        signatures = set()
        for graph in graphs:
            try:
                tactic = find_tactic(registry, graph.nodes[layer.node_index], graph, candidate)
                if tactic.name != candidate["name"]:
                    break
                signatures.add(signature(registry, graph.nodes[layer.node_index], graph, tactic, weights))
            except PlugrtError:
                break
            except Exception as exc:  # noqa: BLE001 - a plugin failing at a probe shape: not generic
                log.info("%s: tactic %s not probed (%s: %s)", node.describe(), candidate["name"],
                         type(exc).__name__, exc)
                break
            if len(signatures) > 1:
                break
        else:
            return candidate
    return None


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def signature(registry, node, graph, tactic, weights: dict | None = None) -> tuple:
    """What ``tactic``'s launches for ``node`` at ``graph``'s shapes compile: the distinct
    launch keys and kernel identities, sorted (how many times a kernel is launched is no
    part of it: a recurrence's step kernel once a time step); the engine's ``weights`` on
    the device, and arrays of the right shapes for the other tensors, stand in."""
    from numba import cuda

    weights = weights or {}
    ins = [weights.get(name) if name in weights else _stand_in(graph, name) if name else None
           for name in node.inputs]
    outs = [_stand_in(graph, name) if name else None for name in node.outputs]
    if node.name in graph.data_dependent:  # (where it reports its outputs' shapes)
        outs.append(cuda.device_array(sum(len(bound) for bound in graph.data_dependent[node.name]), np.int64))
    workspace = _buffer(int(tactic.workspace_bytes)) if tactic.workspace_bytes else None
    key = layer_key(registry, node, graph, tactic)
    launches = tactic.launches(ins, outs, workspace)
    return tuple(sorted({launch_key(k, launch.kernel) for k, launch in zip(launch_keys(key, launches), launches)}))


def launch_key(key: str | None, kernel) -> str:
    """One launch's code: its key and its kernel's identity (the full key but for the
    argument types, which dtypes and ranks fix, and the GPU)."""
    text = f"{key}\n{binaries.kernel_identity(kernel)}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _stand_in(graph, name: str):
    from numba import cuda

    info = graph.info(name)
    value = graph.values[name].const if graph.values[name].const is not None else info.value
    if value is not None:
        return cuda.to_device(np.ascontiguousarray(np.asarray(value, info.dtype).reshape(info.shape)))
    return cuda.device_array(tuple(int(d) for d in info.shape), info.dtype)


def _buffer(nbytes: int):
    from numba import cuda

    return cuda.device_array(nbytes, np.uint8)
