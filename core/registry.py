"""The plugin registry: loads plugins through pluggy and indexes the ops they provide.

Plugins come from the entry point group ``plugrt.plugins``; the built-in ops are entry
points of the ``plugrt`` distribution itself, so they take the same road as a third
party's. Environment switches:

- ``PLUGRT_DISABLE_PLUGIN_AUTOLOAD=1``: load only the ``plugrt`` distribution's own entry
  points (plus those named in ``PLUGRT_PLUGINS``);
- ``PLUGRT_PLUGINS=a,b``: an allow-list of entry point or distribution names to load;
- ``PLUGRT_TRACE_PLUGINS=1``: print every hook call to stderr.

A plugin module states the plugin API versions it supports as ``PLUGRT_API = (low, high)``
(inclusive; an int ``n`` means ``(n, n)``). One that states none is taken as written for
API 1 (:data:`ASSUMED_API`), the API before plugins stated it, so it keeps working until
the core moves past API 1 and is then refused like any plugin outside its range.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import weakref
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Iterable

import pluggy

from plugrt import API_VERSION, __version__, hookspecs
from plugrt.errors import PluginError, UnsupportedError
from plugrt.fusion.op import FusionPlugin
from plugrt.plugin import ATTRIBUTE_KINDS, GraphPass, OpIdentity, OpPlugin, TacticProvider, canonical_domain

log = logging.getLogger("plugrt.registry")

ENTRY_POINT_GROUP = "plugrt.plugins"
CORE_DISTRIBUTION = "plugrt"
#: The plugin the core registers itself in every registry (the fused-layer op).
CORE_PLUGIN = "core-fusion"
#: The API range of a plugin that states no ``PLUGRT_API``.
ASSUMED_API = (1, 1)


@dataclass
class PluginRecord:
    """One registered plugin: where it came from and what it provides."""

    name: str
    distribution: str | None
    version: str | None
    module: str
    ops: list[OpPlugin] = field(default_factory=list)
    passes: list[GraphPass] = field(default_factory=list)
    #: Tactics it contributes to ops other plugins own.
    providers: list[TacticProvider] = field(default_factory=list)
    #: The plugin API versions it supports, inclusive (:data:`ASSUMED_API` if it states none).
    api: tuple[int, int] = ASSUMED_API
    #: Whether the plugin stated ``PLUGRT_API`` itself.
    api_stated: bool = False

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "api": list(self.api),
            "api_stated": self.api_stated,
            "ops": [op_json(op) for op in self.ops],
            "passes": [p.name for p in self.passes],
            "tactics": [provider_json(p) for p in self.providers],
        }

    def source(self, provider: TacticProvider) -> dict:
        """What a contributed tactic carries (``Tactic.source``) and a plan records."""
        return {"plugin": self.name, "distribution": self.distribution, "version": self.version,
                "provider_version": provider.version}


@dataclass
class LoadFailure:
    """A plugin that could not be loaded; the others keep working."""

    name: str
    distribution: str | None
    version: str | None
    error: str


def op_json(op: OpIdentity) -> dict:
    return {
        "domain": op.domain,
        "op_type": op.op_type,
        "since_opset": op.since_opset,
        "until_opset": op.until_opset,
        "version": op.version,
    }


def provider_json(provider: TacticProvider) -> dict:
    return {**op_json(provider), "tactic_names": list(provider.tactic_names)}


class Registry:
    """Plugins and their ops. ``Registry.load()`` builds the standard one."""

    def __init__(self):
        self.pm = pluggy.PluginManager("plugrt")
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginRecord] = {}
        self._owners: dict[int, tuple] = {}  # id(op) -> (op, its record): owner()'s memo
        self.failures: list[LoadFailure] = []
        self._ops: dict[tuple[str, str], list[tuple[OpPlugin, str]]] = {}
        if os.environ.get("PLUGRT_TRACE_PLUGINS"):
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self._register_core()

    def _register_core(self) -> None:
        """The core's own op: the fused layers its passes make (no op math; see plugrt.fusion)."""
        try:
            version = metadata.version(CORE_DISTRIBUTION)
        except metadata.PackageNotFoundError:
            version = __version__
        self.register(FusionPlugin(self), name=CORE_PLUGIN, distribution=CORE_DISTRIBUTION, version=version)

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, allow: Iterable[str] | None = None, autoload: bool | None = None) -> "Registry":
        """Load every plugin of the entry point group, filtered by the switches above."""
        registry = cls()
        if allow is None and os.environ.get("PLUGRT_PLUGINS"):
            allow = [a.strip() for a in os.environ["PLUGRT_PLUGINS"].split(",") if a.strip()]
        if autoload is None:
            autoload = not os.environ.get("PLUGRT_DISABLE_PLUGIN_AUTOLOAD")
        allowed = set(allow) if allow is not None else None
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist is not None else None
            if allowed is not None and ep.name not in allowed and dist not in allowed:
                continue
            if allowed is None and not autoload and dist != CORE_DISTRIBUTION:
                continue
            if ep.name in registry.plugins:
                continue  # the same distribution seen twice on sys.path
            registry._load_entry_point(ep, dist)
        registry.finish()
        return registry

    def _load_entry_point(self, ep, dist: str | None) -> None:
        version = ep.dist.version if ep.dist is not None else None
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            self.failures.append(LoadFailure(ep.name, dist, version, f"{type(exc).__name__}: {exc}"))
            return
        try:
            self.register(module, name=ep.name, distribution=dist, version=version)
        except PluginError as exc:
            self.failures.append(LoadFailure(ep.name, dist, version, str(exc)))

    def register(self, plugin: Any, name: str | None = None, distribution: str | None = None,
                 version: str | None = None) -> PluginRecord:
        """Register a plugin module or object, validate it, and index its ops.

        :raises PluginError: on unknown hooks, bad hook arguments, an unsupported API
            version, invalid op plugins, or an op another plugin already owns.
        """
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if name in self.plugins:
            raise PluginError(f"plugin {name!r} is registered twice")
        api, api_stated = plugin_api(plugin, name, distribution, version)
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self._unregister(plugin)
            raise PluginError(f"plugin {name!r} ({distribution or 'no distribution'}): {exc}") from None
        record = PluginRecord(name, distribution, version, getattr(plugin, "__name__", type(plugin).__name__),
                              api=api, api_stated=api_stated)
        try:
            record.ops = self._collect(plugin, "plugrt_ops", name)
            record.passes = self._collect(plugin, "plugrt_passes", name)
            record.providers = self._collect(plugin, "plugrt_tactics", name)
            for op in record.ops:
                self._validate_op(op, name)
            self._validate_providers(record)
            self._index_ops(record)
        except PluginError:
            self._unregister(plugin)
            raise
        self.plugins[name] = record
        return record

    def finish(self) -> None:
        """Called after loading: any hook implemented but not specified is an error."""
        self.pm.check_pending()

    def _unregister(self, plugin) -> None:
        if self.pm.is_registered(plugin):
            self.pm.unregister(plugin)

    def _collect(self, plugin, hook_name: str, name: str) -> list:
        """Call one hook of one plugin (through pluggy, so tracing sees it); flatten lists."""
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
        try:
            results = caller()
        except Exception as exc:
            raise PluginError(f"plugin {name!r}: hook {hook_name} raised {type(exc).__name__}: {exc}") from exc
        items: list = []
        for result in results:
            if not isinstance(result, (list, tuple)):
                raise PluginError(f"plugin {name!r}: hook {hook_name} must return a list, got {type(result).__name__}")
            items.extend(result)
        return items

    def _validate_op(self, op: Any, owner: str) -> None:
        if not isinstance(op, OpPlugin):
            raise PluginError(f"plugin {owner!r}: plugrt_ops returned {op!r}, which is not an OpPlugin instance")
        label = f"plugin {owner!r} op {op.op_type or '?'}"
        if not op.op_type or not isinstance(op.op_type, str):
            raise PluginError(f"plugin {owner!r}: {type(op).__name__} has no op_type")
        if op.until_opset is not None and op.until_opset < op.since_opset:
            raise PluginError(f"{label}: until_opset {op.until_opset} < since_opset {op.since_opset}")
        for attr in op.attributes:
            if attr.kind not in ATTRIBUTE_KINDS:
                raise PluginError(f"{label}: attribute {attr.name!r} has unknown kind {attr.kind!r}")
        for method in ("infer", "reference"):
            if getattr(type(op), method) is getattr(OpPlugin, method):
                raise PluginError(f"{label}: {type(op).__name__} does not implement {method}()")

    def _validate_providers(self, record: PluginRecord) -> None:
        seen = set()
        for provider in record.providers:
            if not isinstance(provider, TacticProvider):
                raise PluginError(f"plugin {record.name!r}: plugrt_tactics returned {provider!r}, which is not a "
                                  "TacticProvider instance")
            label = f"plugin {record.name!r} tactics for {provider.domain or 'ai.onnx'}::{provider.op_type or '?'}"
            if not provider.op_type or not isinstance(provider.op_type, str):
                raise PluginError(f"plugin {record.name!r}: {type(provider).__name__} names no op_type")
            if type(provider).tactics is TacticProvider.tactics:
                raise PluginError(f"{label}: {type(provider).__name__} does not implement tactics()")
            names = provider.tactic_names
            if isinstance(names, str) or not names or not all(isinstance(n, str) and n for n in names) \
                    or len(set(names)) != len(names):
                raise PluginError(f"{label}: tactic_names must be a non-empty tuple of distinct names, got {names!r}")
            if (canonical_domain(provider.domain), provider.op_type) in seen:
                raise PluginError(f"{label}: the plugin has two providers for this op; offer every tactic from one")
            seen.add((canonical_domain(provider.domain), provider.op_type))
            provider.registry = self

    def _index_ops(self, record: PluginRecord) -> None:
        new: dict[tuple[str, str], list] = {}
        for op in record.ops:
            for other, other_owner in self._ops.get(op.key, []) + new.get(op.key, []):
                if _overlap(op, other):
                    raise PluginError(
                        f"op {op.domain or 'ai.onnx'}::{op.op_type} is provided twice with overlapping "
                        f"opsets: by plugin {record.name!r} ({record.distribution or 'no distribution'}) "
                        f"and by plugin {other_owner!r} ({self._dist_of(other_owner)}); "
                        "uninstall one, or leave one out with PLUGRT_PLUGINS"
                    )
            new.setdefault(op.key, []).append((op, record.name))
        for key, entries in new.items():
            self._ops.setdefault(key, []).extend(entries)

    def _dist_of(self, plugin_name: str) -> str:
        record = self.plugins.get(plugin_name)
        return (record.distribution if record else None) or "no distribution"

    # ------------------------------------------------------------------ lookup

    def find_op(self, domain: str, op_type: str, opset: int) -> OpPlugin | None:
        """The op plugin for this node identity, or ``None``."""
        for op, _owner in self._ops.get((canonical_domain(domain), op_type), []):
            if op.supports_opset(opset):
                return op
        return None

    def op(self, node) -> OpPlugin:
        """The op plugin for ``node``; :class:`UnsupportedError` if none."""
        op = self.find_op(node.domain, node.op_type, node.opset)
        if op is None:
            raise UnsupportedError(f"{node.describe()}: no installed plugin provides this op at this opset")
        return op

    def owner(self, op: OpPlugin) -> PluginRecord:
        record = self._owners.get(id(op))
        if record is not None and record[0] is op and self.plugins.get(record[1].name) is record[1]:
            return record[1]
        for record in self.plugins.values():
            if any(o is op for o in record.ops):
                self._owners[id(op)] = (op, record)
                return record
        raise KeyError(op)

    def ops(self) -> list[OpPlugin]:
        return [op for entries in self._ops.values() for op, _ in entries]

    def op_types(self, domain: str = "") -> set[str]:
        return {op.op_type for op in self.ops() if op.domain == canonical_domain(domain)}

    def providers(self, node) -> list[tuple[PluginRecord, TacticProvider]]:
        """The contributed tactic providers that serve ``node``, by plugin name."""
        return [(record, provider) for record in sorted(self.plugins.values(), key=lambda r: r.name)
                for provider in record.providers if provider.serves(node.domain, node.op_type, node.opset)]

    def tactics(self, op: OpPlugin, node, inputs, outputs, epilogue=None, wanted=None) -> list:
        """Every candidate tactic for ``node``: its owner ``op``'s, in the owner's order, then
        each provider's (stamped with their ``source``). An epilogue goes to every one of them
        (only ``ANCHOR`` ops get one). A provider that raises is left out, with a warning:
        a contribution must not break a build the owner can do.

        ``wanted``: the identity (:meth:`plugrt.tactic.Tactic.identity`) the caller looks
        for, as a specialization does for a tactic a plan recorded. Then only its supplier
        is asked (the owner, or the provider it names), and a ``tactics`` that takes a
        ``wanted`` keyword gets it, to make just the tactics of that name (a hint: the
        caller still picks by identity, and asks again without it if none matches)."""
        extra = {} if epilogue is None else {"epilogue": epilogue}
        supplier = None if wanted is None else wanted.get("provider")
        found = []
        if supplier is None:
            found = list(op.tactics(node, inputs, outputs, **extra, **_hint(op.tactics, wanted)))
        for record, provider in self.providers(node):
            if wanted is not None and record.name != supplier:
                continue
            try:
                offered = list(provider.tactics(node, inputs, outputs, **extra, **_hint(provider.tactics, wanted)))
            except Exception as exc:
                log.warning("%s: the tactics plugin %r contributes raised %s: %s; its tactics are left out",
                            node.describe(), record.name, type(exc).__name__, exc)
                continue
            source = record.source(provider)
            found += [tactic.from_source(source) for tactic in offered]
        return found

    def passes(self, stage: str | None = None) -> list[tuple[str, GraphPass]]:
        """``(plugin name, pass)`` of the plugins' graph passes (of one ``stage``), in order."""
        found = [(record.name, p) for record in self.plugins.values() for p in record.passes
                 if stage is None or p.stage == stage]
        return sorted(found, key=lambda item: (item[1].priority, item[0], item[1].name))


def _hint(tactics, wanted) -> dict:
    """``{"wanted": wanted}`` where the ``tactics`` method takes that keyword, else ``{}``."""
    if wanted is None:
        return {}
    function = getattr(tactics, "__func__", tactics)
    try:
        takes = _TAKES_WANTED.get(function)
    except TypeError:  # (a callable that takes no weak reference: asked every time)
        takes = None
    if takes is None:
        try:
            takes = "wanted" in inspect.signature(tactics).parameters
        except (TypeError, ValueError):
            takes = False
        try:
            _TAKES_WANTED[function] = takes
        except TypeError:
            pass
    return {"wanted": wanted} if takes else {}


#: A ``tactics`` function -> whether it takes ``wanted`` (:func:`_hint`), dropped with it.
_TAKES_WANTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def plugin_api(plugin, name: str, distribution: str | None = None,
               version: str | None = None) -> tuple[tuple[int, int], bool]:
    """The API range ``plugin`` states (or :data:`ASSUMED_API`) and whether it stated one.

    :raises PluginError: when ``PLUGRT_API`` is malformed, or the range leaves out this
        core's :data:`plugrt.API_VERSION`; the message says which side to upgrade.
    """
    stated = getattr(plugin, "PLUGRT_API", None)
    who = f"plugin {name!r} ({_label(distribution, version)})"
    if stated is None:
        low, high = ASSUMED_API
    else:
        if isinstance(stated, int) and not isinstance(stated, bool):
            stated = (stated, stated)
        try:
            low, high = stated
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) or low > high:
                raise ValueError
        except (TypeError, ValueError):
            raise PluginError(f"{who}: PLUGRT_API must be an int or a (low, high) pair of ints with low <= high, "
                              f"got {stated!r}; e.g. PLUGRT_API = ({API_VERSION}, {API_VERSION})") from None
    if low <= API_VERSION <= high:
        return (low, high), stated is not None
    package = distribution or "the plugin"
    if stated is None:
        raise PluginError(f"{who} states no PLUGRT_API, so it is taken as written for plugrt API {low}, but plugrt "
                          f"{__version__} implements API {API_VERSION}: install a release of {package} that states "
                          f"PLUGRT_API including {API_VERSION} (pip install --upgrade {package})")
    if high < API_VERSION:
        fix = (f"install a release of {package} built for API {API_VERSION} (pip install --upgrade {package}), "
               f"or a plugrt that implements API {high}")
    else:
        fix = (f"upgrade plugrt to one that implements API {low} (pip install --upgrade plugrt), "
               f"or install a release of {package} built for API {API_VERSION}")
    raise PluginError(f"{who} supports plugrt API {low}..{high}, but plugrt {__version__} implements "
                      f"API {API_VERSION}: {fix}")


def _label(distribution: str | None, version: str | None) -> str:
    if distribution is None:
        return "no distribution"
    return f"{distribution} {version}" if version else distribution


def _overlap(a: OpPlugin, b: OpPlugin) -> bool:
    a_hi = a.until_opset if a.until_opset is not None else 10**9
    b_hi = b.until_opset if b.until_opset is not None else 10**9
    return a.since_opset <= b_hi and b.since_opset <= a_hi


_default: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _default
    if _default is None:
        _default = Registry.load()
    return _default


def reset_default_registry() -> None:
    """Forget the process-wide registry (tests that install plugins call this)."""
    global _default
    _default = None
