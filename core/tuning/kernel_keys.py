"""Kernel keys: a string naming the code of a layer's kernels, for the kernel cache and plans.

:func:`layer_key` is the sha256 of the canonical JSON of everything a layer's kernels can
depend on:

- plugrt's version and a fingerprint of its own sources (the fusion passes generate
  kernels);
- every plugin involved (the op's owner; each inner node's for a fused layer; the plugin
  that contributed the tactic): name, distribution, version, and a fingerprint of the
  ``.py`` sources of its top-level package, so that editing an editable install changes
  the key;
- the op (``domain::op_type``), opset and op version, the attributes (a fused layer's body
  as the timing cache spells it, :func:`plugrt.tuning.timing_cache.fused_body`);
- the input and output dtypes and ranks (not their shapes: the kernel's identity, part of
  every full key, spells whatever a kernel baked in, so one compiled kernel serves every
  shape it can), and the bytes of constant inputs (up to :data:`HASHED_VALUE_BYTES`;
  larger weights by dtype only);
- the tactic: name, parameters, math and who contributed it.

A launch's key is the layer key plus its kernel's rank among the tactic's distinct kernels
(:func:`launch_keys`: the launch's index where no kernel repeats; a recurrence launching
its step kernel once a time step compiles it once, however many steps a shape has); the
kernel store adds the argument types, the architecture and the kernel itself
(:func:`plugrt.binaries.full_key`). Fingerprints
are computed once per process; keys are the same in every process.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import types
import weakref
from functools import lru_cache

import numpy as np

from plugrt import __version__
from plugrt.fusion.op import body_nodes, is_fused
from plugrt.tuning.timing_cache import canonical, canonical_json, fused_body

#: Host-known input values up to this many bytes enter the key by their bytes.
HASHED_VALUE_BYTES = 64 * 1024


def layer_key(registry, node, graph, tactic) -> str | None:
    """The key of ``node``'s kernels under ``tactic`` at ``graph``'s concrete shapes, or
    ``None`` where the kernels cannot be named (they are then always compiled).

    No shape enters it, so it is remembered per node (while the node lives), registry,
    tactic and the dtypes, ranks and constants of the node's tensors: a new shape's
    specialization finds every layer's key again without hashing. (Package fingerprints
    are read once per process; :func:`forget` drops what was remembered.)"""
    values = [graph.info(name).value for name in node.inputs
              if name and graph.values[name].const is not None and graph.info(name).value is not None]
    memo = (id(registry), tactic.name, repr(tactic.params), getattr(tactic, "math", ""),
            repr(getattr(tactic, "source", None)), tuple(_signature(graph, name) for name in node.inputs + node.outputs))
    entries = _keys.get(node)
    found = None if entries is None else entries.get(memo)
    if found is not None and found[0]() is registry and all(ref() is v for ref, v in zip(found[2], values)):
        return found[1]
    key = _layer_key(registry, node, graph, tactic)
    try:
        remembered = (weakref.ref(registry), key, [weakref.ref(v) for v in values])
    except TypeError:  # (a value that takes no weak reference: not remembered)
        return key
    entries = _keys.setdefault(node, {})
    if len(entries) >= 64:
        entries.clear()
    entries[memo] = remembered
    return key


def forget() -> None:
    """Drop :func:`layer_key`'s memo (after changing what a key is made from in-process)."""
    _keys.clear()
    _spellings.clear()


def _signature(graph, name: str) -> tuple | None:
    """What :func:`_tensor` reads of a tensor: a constant's value by identity (checked
    through a weak reference beside the key)."""
    if not name:
        return None
    info = graph.info(name)
    known = graph.values[name].const is not None and info.value is not None
    return (np.dtype(info.dtype).str, len(info.shape), id(info.value) if known else None)


#: :func:`layer_key`'s memo: node -> {memo: (registry ref, key, refs of the node's constants)},
#: dropped with the node.
_keys: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _layer_key(registry, node, graph, tactic) -> str | None:
    source = dict(tactic.source) if getattr(tactic, "source", None) else None
    try:
        op = registry.op(node)
        objects = [registry.pm.get_plugin(registry.owner(op).name), op]
        names = [registry.owner(op).name]
        if is_fused(node):
            for part, entry in zip(body_nodes(node), node.attrs["body"]):
                inner = registry.op(part)
                objects += [registry.pm.get_plugin(registry.owner(inner).name), inner]
                names.append(registry.owner(inner).name)
        if source is not None:
            objects.append(registry.pm.get_plugin(source["plugin"]))
            names.append(source["plugin"])
        plugins = {name: _plugin(registry.plugins[name]) for name in names}
        packages = sorted({package_of(obj) for obj in objects if obj is not None} - {None})
        sources = {package: package_fingerprint(package) for package in packages}
    except Exception:  # noqa: BLE001 - an op or plugin this registry cannot name: no key
        return None
    if None in sources.values():
        return None
    return hashlib.sha256(canonical_json({
        "plugrt": {"version": __version__, "sources": package_fingerprint("plugrt")},
        "plugins": [plugins[name] for name in sorted(plugins)],
        "sources": sources,
        "op": {"op": node.qualified_op, "opset": int(node.opset), "version": op.version},
        "layer": _spelled(node, tactic, source),
        "inputs": [_tensor(graph, name) for name in node.inputs],
        "outputs": [_tensor(graph, name) for name in node.outputs],
    }).encode("utf-8")).hexdigest()


def _spelled(node, tactic, source) -> str:
    """The node's attributes (a fused layer's body as the timing cache spells it) and the
    tactic, as canonical JSON; remembered per node object and tactic, since a new shape's
    specialization names every launch of the engine again."""
    memo = (id(node), tactic.name, repr(tactic.params), getattr(tactic, "math", ""), repr(source))
    found = _spellings.get(memo)
    if found is not None and found[0] is node:
        return found[1]
    text = canonical_json({
        "attributes": {str(k): canonical(fused_body(node) if k == "body" and is_fused(node) else v)
                       for k, v in node.attrs.items()},
        "tactic": {"name": tactic.name, "params": canonical(dict(tactic.params)),
                   "math": getattr(tactic, "math", ""), "source": canonical(source)},
    })
    if len(_spellings) >= _SPELLINGS:
        _spellings.clear()
    _spellings[memo] = (node, text)
    return text


#: (node, tactic) -> (node, spelling) for :func:`_spelled` (the node kept: ids stay unique).
_spellings: dict[tuple, tuple] = {}
_SPELLINGS = 65536


def _plugin(record) -> dict:
    return {"name": record.name, "distribution": record.distribution, "version": record.version}


def _tensor(graph, name: str):
    """A tensor as a layer's kernels may depend on it: dtype and rank (not the shape: a
    kernel that bakes a shape in says so in its own identity,
    :func:`plugrt.binaries.kernel_identity`, so that one kernel serves every shape it can),
    and a constant's bytes."""
    if not name:
        return None
    info = graph.info(name)
    entry = {"dtype": np.dtype(info.dtype).str, "rank": len(info.shape)}
    if graph.values[name].const is not None and info.value is not None:
        value = np.ascontiguousarray(info.value)
        entry["value"] = (hashlib.sha256(value.tobytes()).hexdigest() if value.nbytes <= HASHED_VALUE_BYTES
                          else "large")
    return entry


def package_of(obj) -> str | None:
    """The top-level package whose code ``obj`` (a plugin module, or an op or plugin
    object) comes from."""
    module = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
    return module.split(".")[0] if module else None


@lru_cache(maxsize=None)
def package_fingerprint(package: str) -> str | None:
    """sha256 over the relative paths and contents of a top-level package's ``.py`` files
    (a single-module plugin: its file); ``None`` when its sources cannot be found."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    digest = hashlib.sha256()
    if spec.submodule_search_locations:
        files = []
        for root in spec.submodule_search_locations:
            base = pathlib.Path(root)
            files += [(str(path.relative_to(base)), path) for path in base.rglob("*.py")
                      if "__pycache__" not in path.parts]
    elif spec.origin and spec.origin.endswith(".py") and os.path.isfile(spec.origin):
        files = [(os.path.basename(spec.origin), pathlib.Path(spec.origin))]
    else:
        return None
    for relative, path in sorted(files):
        data = path.read_bytes()
        digest.update(f"{relative}\0{len(data)}\0".encode("utf-8"))
        digest.update(data)
    return digest.hexdigest()


def launch_keys(key: str | None, launches) -> list:
    """Each launch's key in one tactic's launch list (:class:`plugrt.launcher.PreparedLaunch`):
    ``KEY/i`` with ``i`` the kernel's rank among the distinct kernels of the list, in the
    order they first appear (:func:`plugrt.binaries.kernel_identity`): a list that launches
    no kernel twice keeps ``KEY/index``, and a kernel launched again, or after a run whose
    length a shape decides, has the same key at every shape. ``None`` each without a
    layer key."""
    from plugrt import binaries

    if key is None:
        return [None] * len(launches)
    ranks: dict[str, int] = {}
    return [f"{key}/{ranks.setdefault(binaries.kernel_identity(launch.kernel), len(ranks))}" for launch in launches]
