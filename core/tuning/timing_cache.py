"""The timing cache: tactic timings that outlive a build, in a JSON file (never pickle).

A layer key is the canonical JSON (sorted keys, no spaces) of everything a tactic's speed
depends on: the op (domain, op type, opset), its attributes (arrays by dtype, shape and
sha256 of their bytes; a fused layer's ``body`` canonicalized: its inner nodes' ops,
attributes, plugins and wiring, not their names), the input and output dtypes and
concrete shapes, the values of small constant inputs (at most :data:`SMALL_CONSTANT`
elements: shape tensors, axes), the GPU (name and compute capability) and the plugin
(name, distribution, distribution version, op version). A
tactic key is the canonical JSON of the tactic's name and parameters. The cache maps a
layer key to ``{tactic key: median milliseconds}``; ``null`` (in memory :data:`FAILED`)
marks a tactic that failed verification or raised, which is never chosen for that key.

The file::

    {"format": "plugrt-timing-cache", "version": 1, "entries": {LAYER_KEY: {TACTIC_KEY: ms}}}

It holds no timestamps, so a cache says the same thing however often it is saved, and it
is written atomically (a temporary file in the same folder, then ``os.replace``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np

from plugrt.errors import PlugrtError
from plugrt.files import write_atomically
from plugrt.fusion.op import is_fused
from plugrt.paths import TIMING_CACHE_FORMAT, file_kind, looks_like_timing_cache, with_article

CACHE_FORMAT = TIMING_CACHE_FORMAT
CACHE_VERSION = 1
#: Constant inputs with at most this many elements enter the key with their values.
SMALL_CONSTANT = 64
#: What the cache holds for a tactic that failed verification or raised.
FAILED = math.inf


class TimingCacheError(PlugrtError):
    """A timing cache file is unreadable, corrupt or not a plugrt timing cache."""


def canonical_json(value) -> str:
    """One spelling of a JSON-safe value: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def layer_key(node, graph, op, owner, device: dict) -> str:
    """The key of one layer: ``node`` at the concrete shapes of ``graph``, run by ``op``
    (whose registry record is ``owner``) on ``device`` (:func:`plugrt.device.describe`)."""
    return canonical_json({
        "op": {"domain": node.domain, "op_type": node.op_type, "opset": int(node.opset)},
        "attributes": {str(k): canonical(fused_body(node) if k == "body" and is_fused(node) else v)
                       for k, v in node.attrs.items()},
        "inputs": [_tensor(graph, name) for name in node.inputs],
        "outputs": [_tensor(graph, name) for name in node.outputs],
        "device": {"name": device.get("name"), "compute_capability": device.get("compute_capability")},
        "plugin": {"name": owner.name, "distribution": owner.distribution, "version": owner.version,
                   "op_version": op.version},
    })


def tactic_key(tactic) -> str:
    """The key of one tactic of a layer: its name and parameters, and for a contributed
    tactic its ``source`` (plugin, distribution and versions: an upgrade is timed again)."""
    key = {"name": tactic.name, "params": canonical(dict(tactic.params))}
    if getattr(tactic, "source", None):
        key["source"] = canonical(dict(tactic.source))
    return canonical_json(key)


def fused_body(node) -> list:
    """A fused layer's body as it is, less what only labels it: inner node names and ONNX
    origins go, and value names become their roles (``in0``: the layer's first input,
    ``out0``, ``v0``: the first inner value), so repeated blocks of a model share a key."""
    roles = {name: f"in{i}" for i, name in enumerate(node.inputs) if name}
    roles.update({name: f"out{i}" for i, name in enumerate(node.outputs) if name})

    def role(name: str) -> str:
        if name and name not in roles:
            roles[name] = f"v{sum(r.startswith('v') for r in roles.values())}"
        return roles.get(name, "")

    body = []
    for entry in node.attrs["body"]:
        entry = {k: v for k, v in entry.items() if k not in ("name", "origin")}
        entry["inputs"] = [role(n) for n in entry.get("inputs", ())]
        entry["outputs"] = [role(n) for n in entry.get("outputs", ())]
        body.append(entry)
    return body


def _tensor(graph, name: str):
    if not name:
        return None
    info = graph.info(name)
    entry = {"dtype": str(info.dtype), "shape": [int(d) for d in info.shape]}
    if info.value is not None:
        entry["const"] = True
        if np.size(info.value) <= SMALL_CONSTANT:
            entry["value"] = np.asarray(info.value).tolist()
    return entry


def canonical(value):
    """Attribute values as JSON: arrays by dtype, shape and digest; tuples as lists."""
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return {"array": {"dtype": data.dtype.str, "shape": list(data.shape),
                          "sha256": hashlib.sha256(data.tobytes()).hexdigest()}}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return {"type": type(value).__name__, "repr": repr(value)}


class TimingCache:
    """Median tactic times per layer key; see the module doc."""

    def __init__(self, entries: dict[str, dict[str, float]] | None = None):
        self.entries: dict[str, dict[str, float]] = {k: dict(v) for k, v in (entries or {}).items()}

    def __len__(self) -> int:
        """The number of tactic timings held."""
        return sum(len(times) for times in self.entries.values())

    def lookup(self, layer: str, tactic: str) -> float | None:
        """Milliseconds, :data:`FAILED`, or ``None`` when this tactic was never timed here."""
        return self.entries.get(layer, {}).get(tactic)

    def record(self, layer: str, tactic: str, ms: float) -> None:
        """Store a median time (or :data:`FAILED`); replaces what was there."""
        self.entries.setdefault(layer, {})[tactic] = float(ms)

    def merge(self, other: "TimingCache") -> "TimingCache":
        """Add ``other``'s timings to this cache. Where both timed one tactic of one layer,
        a failure wins (a tactic that ever gave wrong results stays out), otherwise the
        smaller time (the run least disturbed by other work on the GPU)."""
        for layer, times in other.entries.items():
            mine = self.entries.setdefault(layer, {})
            for tactic, ms in times.items():
                known = mine.get(tactic)
                if known is None or ms == FAILED or (known != FAILED and ms < known):
                    mine[tactic] = ms
        return self

    # ------------------------------------------------------------------ files

    def as_json(self) -> dict:
        entries = {layer: {tactic: (None if ms == FAILED else ms) for tactic, ms in times.items()}
                   for layer, times in self.entries.items()}
        return {"format": CACHE_FORMAT, "version": CACHE_VERSION, "entries": entries}

    def save(self, path: str) -> None:
        """Write the cache to ``path`` atomically."""
        text = json.dumps(self.as_json(), sort_keys=True, indent=1) + "\n"
        try:
            write_atomically(path, text.encode("utf-8"))
        except OSError as exc:
            raise TimingCacheError(f"cannot write timing cache {path!r}: {exc}") from None

    @classmethod
    def load(cls, path: str) -> "TimingCache":
        """Read ``path``; a missing file is an empty cache.

        :raises TimingCacheError: the file is unreadable, corrupt or not a timing cache. Only
            a file that looks like a timing cache is called one to delete: anything else
            (a model, a plan) is named for what it seems to be.
        """
        if not os.path.exists(path):
            return cls()
        if os.path.isdir(path):
            raise TimingCacheError(f"timing cache {path!r} is a folder; name a timing cache file")
        fix = "delete it and the next build with this --timing-cache writes a new one"
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read().decode("utf-8"))
        except OSError as exc:
            raise TimingCacheError(f"timing cache {path!r} cannot be read ({exc.strerror or exc}); check its "
                                   "permissions") from None
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            if looks_like_timing_cache(path):
                raise TimingCacheError(f"timing cache {path!r} is corrupt ({exc}); {fix}") from None
            raise _not_a_cache(path) from None
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            raise _not_a_cache(path)
        if data.get("version") != CACHE_VERSION:
            raise TimingCacheError(f"timing cache {path!r} has version {data.get('version')!r}; this plugrt "
                                   f"reads version {CACHE_VERSION}: {fix}")
        entries = data.get("entries")
        if not isinstance(entries, dict) or not all(_valid_times(times) for times in entries.values()):
            raise TimingCacheError(f"timing cache {path!r} has malformed entries; {fix}")
        return cls({layer: {tactic: (FAILED if ms is None else float(ms)) for tactic, ms in times.items()}
                    for layer, times in entries.items()})


def _not_a_cache(path: str) -> TimingCacheError:
    try:
        kind = with_article(file_kind(path))
    except OSError:
        kind = "unreadable"
    return TimingCacheError(f"{path!r} is not a plugrt timing cache: it is {kind}; name a timing cache file "
                            "(a new file name starts an empty cache)")


def _valid_times(times) -> bool:
    return isinstance(times, dict) and all(
        ms is None or (isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0) for ms in times.values())
