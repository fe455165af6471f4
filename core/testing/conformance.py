"""The conformance kit's entry points: which plugin, which ops, which cases; run them all.

:func:`check_plugin` resolves its target (an op plugin instance, a plugin name, or a
plugin module) to a registry and ops, asks each op for its :meth:`~plugrt.plugin.OpPlugin.examples`,
and runs every check of every example (see :mod:`plugrt.testing.example_run`).
:func:`conformance_cases` gives the same work as separate cases, one per op x example x
check, which the pytest plugin turns into test items.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from importlib import metadata
from typing import Iterable

from plugrt import hookimpl
from plugrt.device import describe
from plugrt.errors import PlugrtError
from plugrt.plugin import Example, OpPlugin, TacticProvider
from plugrt.registry import ENTRY_POINT_GROUP, Registry, default_registry
from plugrt.testing.example_run import CHECKS, ExampleRun
from plugrt.testing.report import FAILED, PASSED, CheckResult, ConformanceError, ConformanceReport, Failure

#: The op-level check: the op claims at least one well-formed example.
CLAIMS = "claims"
#: The checks of contributed tactics (a ``plugrt_tactics`` provider), on the owner's examples:
#: the owner's inference and serialization are the owner's to check.
PROVIDER_CHECKS = ("tactics", "guards", "plan", "pickle")


@dataclass(eq=False)
class ConformanceCase:
    """One check of one example of one op (or an op's ``claims`` check), ready to run.

    Cases of the same example share an :class:`ExampleRun`, so the model, inputs,
    reference and tactic runs are made once however many of its cases run.
    """

    plugin: str
    op: OpPlugin
    check: str
    example: str = ""
    example_run: ExampleRun | None = field(default=None, repr=False)
    claims: CheckResult | None = field(default=None, repr=False)
    #: Set when the case checks the tactics ``plugin`` contributes to ``op`` (owned by another).
    provider: TacticProvider | None = None

    @property
    def op_label(self) -> str:
        op = self.op if self.op is not None else self.provider
        return f"{op.domain}::{op.op_type}" if op.domain else op.op_type

    @property
    def id(self) -> str:
        """``Relu[0:float32(2,3)]::guards``, or ``Relu::claims``."""
        if not self.example:
            return f"{self.op_label}::{self.check}"
        return f"{self.op_label}[{self.example}]::{self.check}"

    def run(self) -> CheckResult:
        if self.claims is not None:
            return self.claims
        return self.example_run.result(self.check)


def conformance_cases(target, *, registry=None, seed: int = 0, checks: Iterable[str] | None = None,
                      ops: Iterable[str] | None = None, plan_dir: str | None = None) -> list[ConformanceCase]:
    """Every case :func:`check_plugin` would run, unrun, in order.

    Parameters as for :func:`check_plugin`.
    """
    checks = _checks(checks)
    targets = list(target) if isinstance(target, (list, tuple)) else [target]
    entries = []
    for one in targets:
        found, subjects = resolve_target(one, registry)
        if not subjects:
            raise PlugrtError(f"{one!r} provides no ops and no tactics to check")
        entries += [(found, *subject) for subject in subjects]
    cases: list[ConformanceCase] = []
    for found, plugin, op, provider in _select(entries, ops, target):
        examples, claims = _claims(plugin, op, provider)
        cases.append(ConformanceCase(plugin, op, CLAIMS, claims=claims, provider=provider))
        source = found.plugins[plugin].source(provider) if provider is not None else None
        labels: set[str] = set()
        for index, example in enumerate(examples):
            run = ExampleRun(plugin, op, index, example, found, seed, plan_dir,
                             provider=(provider, source) if provider is not None else None)
            if run.label in labels:
                run.label = f"{index}:{run.label}"
            labels.add(run.label)
            cases += [ConformanceCase(plugin, op, check, run.label, run, provider=provider)
                      for check in checks if provider is None or check in PROVIDER_CHECKS]
    return cases


def check_plugin(target, *, registry=None, seed: int = 0, checks: Iterable[str] | None = None,
                 ops: Iterable[str] | None = None, plan_dir: str | None = None) -> ConformanceReport:
    """Check every op of a plugin over every example it claims; return the report.

    :param target: an :class:`~plugrt.plugin.OpPlugin` instance, a plugin name (its entry
        point name in group ``plugrt.plugins``, or its distribution name), a plugin
        module (anything with ``@hookimpl`` functions), or a list of these. A plugin's
        tactic providers (``plugrt_tactics``) are checked too, on the examples of the op
        they serve, against its owner's reference; a distribution may provide only those.
    :param registry: where a plugin name is looked up (default: the installed plugins);
        an instance or module not registered there is checked in a fresh registry.
    :param seed: seeds the random inputs (the same seed draws the same inputs).
    :param checks: a subset of :data:`CHECKS` (default: all of them).
    :param ops: check only these ops (``"Relu"``, or ``"com.example::ScaleShift"``).
    :param plan_dir: keep the plan files the plan check writes there (default: a
        temporary folder, removed afterwards).
    :raises ConformanceError: (an ``AssertionError``) listing every failure, each with the
        op, example, check, tactic and a fix.
    :raises PlugrtError: when the target cannot be resolved, or an argument is invalid.
    """
    cases = conformance_cases(target, registry=registry, seed=seed, checks=checks, ops=ops, plan_dir=plan_dir)
    plugins = sorted({case.plugin for case in cases})
    report = ConformanceReport(plugins, seed, describe())
    report.results = [case.run() for case in cases]
    if not report.ok:
        raise ConformanceError(report.failures, report)
    return report


# ---------------------------------------------------------------------- targets


class _ProviderHolder:
    """A plugin object providing given tactic providers."""

    def __init__(self, providers: list[TacticProvider]):
        self._providers = list(providers)

    @hookimpl
    def plugrt_tactics(self):
        return list(self._providers)


class _OpHolder:
    """A plugin object providing given op instances (how a bare OpPlugin gets registered)."""

    def __init__(self, ops: list[OpPlugin]):
        self._ops = list(ops)

    @hookimpl
    def plugrt_ops(self):
        return list(self._ops)


def resolve_target(target, registry=None) -> tuple[object, list[tuple[str, OpPlugin | None, TacticProvider | None]]]:
    """``(registry, [(plugin name, op, provider), ...])`` for a check target (see
    :func:`check_plugin`): ``provider`` is ``None`` for the plugin's own ops, and otherwise a
    tactic provider of the plugin with ``op`` its owner's op (``None`` if none is installed)."""
    if isinstance(target, type) and issubclass(target, (OpPlugin, TacticProvider)):
        target = target()  # the class given for an instance
    if isinstance(target, OpPlugin):
        if registry is not None and any(op is target for op in registry.ops()):
            return registry, [(registry.owner(target).name, target, None)]
        fresh = Registry()
        record = fresh.register(_OpHolder([target]), name=f"conformance-{type(target).__name__}")
        return fresh, [(record.name, target, None)]
    if isinstance(target, TacticProvider):
        known = Registry.load() if registry is None else registry
        record = known.register(_ProviderHolder([target]), name=f"conformance-{type(target).__name__}")
        return known, _subjects(known, [record])
    if isinstance(target, str):
        return _by_name(target, registry)
    if isinstance(target, (types.ModuleType, type)) or any(hasattr(target, h) for h in ("plugrt_ops", "plugrt_tactics")):
        known = registry if registry is not None else default_registry()
        for name in known.plugins:
            if known.pm.get_plugin(name) is target:
                return known, _subjects(known, [known.plugins[name]])
        fresh = Registry.load() if registry is None else registry
        name = getattr(target, "__name__", None) or type(target).__name__
        record = fresh.register(target, name=name)
        return fresh, _subjects(fresh, [record])
    raise PlugrtError(f"cannot check {target!r}: pass an OpPlugin instance, a TacticProvider instance, a plugin name "
                      "(entry point or distribution), or a plugin module")


def _subjects(registry, records) -> list[tuple[str, OpPlugin | None, TacticProvider | None]]:
    """Each record's ops, then its tactic providers with the op each serves."""
    found = [(r.name, op, None) for r in records for op in r.ops]
    for record in records:
        for provider in record.providers:
            owner = next((op for op in registry.ops() if op.op_type == provider.op_type
                          and provider.serves(op.domain, op.op_type, max(op.since_opset, provider.since_opset))), None)
            found.append((record.name, owner, provider))
    return found


def _by_name(name: str, registry) -> tuple[object, list]:
    candidates = [registry] if registry is not None else [default_registry()]
    for known in candidates:
        records = [r for r in known.plugins.values() if name in (r.name, r.distribution)]
        if records:
            return known, _subjects(known, records)
        failed = [f for f in known.failures if name in (f.name, f.distribution)]
        if failed and registry is not None:
            raise PlugrtError(f"plugin {name!r} is installed but failed to load: {failed[0].error}")
    # Maybe left out by PLUGRT_PLUGINS or PLUGRT_DISABLE_PLUGIN_AUTOLOAD, or refused beside another
    # plugin that provides the same op: load it alone.
    if registry is None:
        loaded = Registry.load(allow=[name])
        records = [r for r in loaded.plugins.values() if name in (r.name, r.distribution)]
        if records:
            if any(r.providers for r in records):  # the ops they serve come from the other plugins
                loaded = Registry.load(allow=[name, *(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))])
                records = [r for r in loaded.plugins.values() if name in (r.name, r.distribution)]
            return loaded, _subjects(loaded, records)
        if loaded.failures:
            raise PlugrtError(f"plugin {name!r} is installed but failed to load: {loaded.failures[0].error}")
    known = sorted(candidates[0].plugins)
    raise PlugrtError(f"no plugin named {name!r} is installed (entry point or distribution name in group "
                      f"'plugrt.plugins'); installed: {', '.join(known)}. Install the plugin (pip install -e .) "
                      "or pass the OpPlugin or module itself")


def _select(entries: list, ops: Iterable[str] | None, target) -> list:
    """The ``(registry, plugin, op, provider)`` entries whose op is named in ``ops`` (all if ``None``)."""
    if ops is None:
        return entries
    wanted = set(ops)
    chosen = [entry for entry in entries if _names_of(entry[3] or entry[2]) & wanted]
    missing = sorted(wanted - set().union(*(_names_of(entry[3] or entry[2]) for entry in chosen)))
    if missing:
        have = ", ".join(sorted({(entry[3] or entry[2]).op_type for entry in entries}))
        raise PlugrtError(f"{target!r} provides no op {', '.join(map(repr, missing))}; it provides: {have}")
    return chosen


def _names_of(op: OpPlugin | TacticProvider) -> set[str]:
    return {op.op_type, f"{op.domain}::{op.op_type}"}


def _checks(checks: Iterable[str] | None) -> tuple[str, ...]:
    if checks is None:
        return CHECKS
    checks = tuple(checks)
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise PlugrtError(f"unknown conformance check(s) {', '.join(map(repr, unknown))}; the checks are "
                          f"{', '.join(CHECKS)}")
    return tuple(c for c in CHECKS if c in checks)


def _claims(plugin: str, op: OpPlugin | None, provider: TacticProvider | None = None) -> tuple[list, CheckResult]:
    """The op's examples, and the result of its ``claims`` check (for a tactic provider: the
    examples of the op it serves, which some installed plugin must own)."""
    subject = provider if provider is not None else op
    label = f"{subject.domain}::{subject.op_type}" if subject.domain else subject.op_type

    def failed(message: str, hint: str) -> tuple[list, CheckResult]:
        failure = Failure(plugin, label, "", CLAIMS, message, hint)
        return [], CheckResult(plugin, label, "", CLAIMS, FAILED, [failure])

    if op is None:
        return failed(f"contributes tactics to {label}, which no installed plugin provides at opsets "
                      f"{provider.since_opset}..{provider.until_opset or ''}",
                      "install the plugin that owns the op, or fix the provider's domain, op_type and opsets")

    try:
        examples = list((provider.examples() if provider is not None else []) or op.examples())
    except Exception as exc:
        return failed(f"examples() raised {type(exc).__name__}: {exc}", "examples() must return a list of Example")
    if not examples:
        return failed("claims nothing: examples() returns no Example, so nothing about this op can be checked",
                      f"return plugrt.plugin.Example objects from {type(op).__name__}.examples(), one per supported "
                      "dtype and shape family (small shapes: tens of elements)")
    bad = [e for e in examples if not isinstance(e, Example)]
    if bad:
        return failed(f"examples() returned {type(bad[0]).__name__}, not plugrt.plugin.Example",
                      "return Example objects")
    return examples, CheckResult(plugin, label, "", CLAIMS, PASSED, [], f"{len(examples)} example(s)")


__all__ = ["CHECKS", "CLAIMS", "ConformanceCase", "check_plugin", "conformance_cases", "resolve_target"]
