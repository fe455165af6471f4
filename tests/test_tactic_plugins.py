"""Tactic plugins (``plugrt_tactics``): a distribution contributes tactics to an op that
another plugin owns. Registration and its validation, the candidates the builder offers,
the tuner timing them beside the owner's, plans recording and requiring the contributor,
``plugrt inspect`` and ``plugrt plugins``, and the conformance kit judging a contribution
against the owner's reference (a planted wrong one fails).

The owner is the tuner tests' ``com.test.tuning::Twice`` (y = 2x), with tactics the test
chooses, and the built-in Relu for the kit.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from test_tuner import DOMAIN, Clock, Twice, _launches, _variant, make_model

from plugrt import hookimpl
from plugrt.cli import main
from plugrt.engine import Builder, BuilderConfig, Engine
from plugrt.errors import PlanError, PluginError
from plugrt.plugin import Example, Tactic, TacticProvider, TensorInfo, pointwise_tactic
from plugrt.registry import Registry
from plugrt.testing import ConformanceError, check_node, check_plugin, node_tactics
from plugrt.tuning import Tuner, tactic_key

CONTRIBUTOR = "planted"
CONTRIBUTOR_DIST = "plugrt-planted"


class TwiceTactics(TacticProvider):
    """More tactics for ``Twice``, described as :func:`test_tuner._variant` objects."""

    domain = DOMAIN
    op_type = "Twice"
    version = "2.0"

    def __init__(self, variants):
        self.variants = variants
        self.tactic_names = tuple(v.name for v in variants)

    def tactics(self, node, inputs, outputs):
        return [Tactic(v.name, _launches(v.kind), {"variant": v.name}, math=v.math) for v in self.variants]


class Holder:
    """A plugin module stand-in: ops and tactic providers."""

    def __init__(self, ops=(), providers=()):
        self.ops, self.providers = list(ops), list(providers)

    @hookimpl
    def plugrt_ops(self):
        return list(self.ops)

    @hookimpl
    def plugrt_tactics(self):
        return list(self.providers)


def registry_with(owner_variants, contributed, version="1.0"):
    registry = Registry()
    registry.register(Holder(ops=[Twice(owner_variants)]), name="tuning-test", distribution="plugrt-tuning-test",
                      version="1.0")
    if contributed is not None:
        registry.register(Holder(providers=[TwiceTactics(contributed)]), name=CONTRIBUTOR,
                          distribution=CONTRIBUTOR_DIST, version=version)
    registry.finish()
    return registry


def build(registry, clock, **config):
    config.setdefault("progress", False)
    return Builder(registry, measure=clock).build_engine(make_model(), BuilderConfig(**config))


OWNER = [_variant("plain", 3.0), _variant("tiled", 2.0)]
FAST = [_variant("fast", 1.0)]


# ---------------------------------------------------------------------------- registration


def test_contributed_tactics_follow_the_owners_and_carry_their_source():
    registry = registry_with(OWNER, FAST)
    record = registry.plugins[CONTRIBUTOR]
    assert record.ops == [] and len(record.providers) == 1
    assert record.as_json()["tactics"] == [{"domain": DOMAIN, "op_type": "Twice", "since_opset": 1,
                                            "until_opset": None, "version": "2.0", "tactic_names": ["fast"]}]
    graph = _graph(registry)
    tactics = node_tactics(graph, registry)
    assert [(t.name, t.provider) for t in tactics] == [("plain", None), ("tiled", None), ("fast", CONTRIBUTOR)]
    assert tactics[2].source == {"plugin": CONTRIBUTOR, "distribution": CONTRIBUTOR_DIST, "version": "1.0",
                                 "provider_version": "2.0"}
    assert tactics[2].identity() == {"name": "fast", "params": {"variant": "fast"}, "provider": CONTRIBUTOR}
    assert tactics[0].identity() == {"name": "plain", "params": {"variant": "plain"}}
    assert record.providers[0].owner(graph.nodes[0]) is registry.op(graph.nodes[0])


class _NoNames(TacticProvider):
    op_type = "Relu"

    def tactics(self, node, inputs, outputs):
        return []


class _NoTactics(TacticProvider):
    op_type = "Relu"
    tactic_names = ("x",)


class _NoOp(TacticProvider):
    tactic_names = ("x",)

    def tactics(self, node, inputs, outputs):
        return []


@pytest.mark.parametrize("providers, words", [
    ([object()], "is not a TacticProvider"),
    ([_NoNames()], "tactic_names must be a non-empty tuple"),
    ([_NoTactics()], "does not implement tactics()"),
    ([_NoOp()], "names no op_type"),
    ([_NoTactics.__mro__[1]], "is not a TacticProvider instance"),
])
def test_bad_providers_are_refused_at_registration(providers, words):
    registry = Registry()
    with pytest.raises(PluginError, match=words.replace("(", r"\(").replace(")", r"\)")):
        registry.register(Holder(providers=providers), name="bad")
    assert "bad" not in registry.plugins


def test_a_provider_that_raises_is_left_out_with_a_warning(caplog):
    class Broken(TwiceTactics):
        def tactics(self, node, inputs, outputs):
            raise RuntimeError("no tactic today")

    registry = registry_with(OWNER, None)
    registry.register(Holder(providers=[Broken(FAST)]), name="broken", distribution="plugrt-broken", version="1")
    with caplog.at_level(logging.WARNING):
        engine = build(registry, Clock(OWNER))
    assert engine.layers[0].tactic["name"] == "tiled" and engine.layers[0].tactic_provider is None
    assert "'broken'" in caplog.text and "no tactic today" in caplog.text


# ---------------------------------------------------------------------------- tuning and plans


def test_the_tuner_times_contributed_tactics_and_the_plan_records_who_supplied_it(tmp_path):
    registry = registry_with(OWNER, FAST)
    clock = Clock(OWNER + FAST)
    engine = build(registry, clock)
    assert sorted(clock.calls) == ["fast", "plain", "tiled"]
    layer = engine.layers[0]
    assert layer.tactic == {"name": "fast", "params": {"variant": "fast"}, "provider": CONTRIBUTOR}
    assert layer.tactic_provider == {"plugin": CONTRIBUTOR, "distribution": CONTRIBUTOR_DIST, "version": "1.0",
                                     "provider_version": "2.0"}
    assert layer.runner_up["name"] == "tiled" and "provider" not in layer.runner_up
    path = tmp_path / "model.plan"
    engine.save(str(path))
    loaded = Engine.load(str(path), registry)
    x = np.random.default_rng(1).standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(loaded.create_execution_context().execute({"x": x})["y"], 2 * x, rtol=1e-6)
    report = loaded.inspect()
    assert report["layers"][0]["tactic_provider"]["plugin"] == CONTRIBUTOR
    needs = {entry["plugin"]: entry for entry in report["plugins"]}
    assert needs[CONTRIBUTOR]["tactics"] == {f"{DOMAIN}::Twice": "2.0"}


def test_a_plan_whose_contributor_is_missing_or_changed_is_refused(tmp_path):
    path = tmp_path / "model.plan"
    build(registry_with(OWNER, FAST), Clock(OWNER + FAST)).save(str(path))
    with pytest.raises(PlanError, match=f"contributed by plugin '{CONTRIBUTOR}'.*pip install {CONTRIBUTOR_DIST}==1.0"):
        Engine.load(str(path), registry_with(OWNER, None))
    with pytest.raises(PlanError, match="release series differ"):
        Engine.load(str(path), registry_with(OWNER, FAST, version="2.0"))


def test_a_wrong_contributed_tactic_is_never_chosen(caplog):
    registry = registry_with(OWNER, [_variant("fast", 0.5, kind="wrong")])
    with caplog.at_level(logging.WARNING):
        engine = build(registry, Clock(OWNER + [_variant("fast", 0.5)]))
    assert engine.layers[0].tactic["name"] == "tiled" and engine.layers[0].tactic_provider is None
    assert "'fast' gives results unlike tactic 'plain'" in caplog.text


def test_each_contributor_gets_the_levels_count():
    owner = [_variant(f"own{i}", 1.0) for i in range(5)]
    contributed = [_variant(f"more{i}", 1.0) for i in range(5)]
    registry = registry_with(owner, contributed)
    candidates = node_tactics(_graph(registry), registry)
    timed = Tuner(BuilderConfig(optimization_level=1), measure=float, device={}).to_time(candidates)
    assert [t.name for t in timed] == ["own0", "own1", "more0", "more1"]
    assert Tuner(BuilderConfig(optimization_level=0), measure=float, device={}).to_time(candidates) == []


def test_the_cache_keys_a_contributed_tactic_by_its_source():
    registry = registry_with(OWNER, FAST)
    contributed = node_tactics(_graph(registry), registry)[-1]
    again = node_tactics(_graph(registry_with(OWNER, FAST, version="1.1")), registry)[-1]
    assert "planted" in tactic_key(contributed)
    assert tactic_key(contributed) != tactic_key(Tactic("fast", contributed.launches, {"variant": "fast"}))
    upgraded = registry_with(OWNER, FAST, version="1.1")
    assert tactic_key(node_tactics(_graph(upgraded), upgraded)[-1]) != tactic_key(contributed)
    assert again.name == contributed.name


def _asking(who, tactics, asked, takes_wanted):
    """``tactics`` wrapped to record who was asked and the ``wanted`` name it got; one that
    ``takes_wanted`` returns only the tactics of that name."""
    if takes_wanted:
        def wanting(node, inputs, outputs, epilogue=None, wanted=None):
            asked.append((who, wanted and wanted["name"]))
            return [t for t in tactics(node, inputs, outputs) if wanted is None or t.name == wanted["name"]]
        return wanting

    def plain(node, inputs, outputs, epilogue=None):
        asked.append((who, None))
        return tactics(node, inputs, outputs)
    return plain


@pytest.mark.parametrize("takes_wanted", [False, True])
def test_a_recorded_tactic_is_looked_for_at_its_supplier_alone(monkeypatch, takes_wanted):
    """A new shape's specialization finds a plan's tactic again: only the plugin that
    supplied it is asked (given the identity where its ``tactics`` takes ``wanted``), and
    every plugin again, without it, when that finds none of the name."""
    from plugrt.engine.specialization import find_tactic
    from plugrt.ir.infer import infer_graph

    registry = registry_with(OWNER, FAST)
    graph = _graph(registry)
    infer_graph(graph, registry)
    node = graph.nodes[0]
    op, provider = registry.op(node), registry.plugins[CONTRIBUTOR].providers[0]
    asked = []
    monkeypatch.setattr(op, "tactics", _asking("owner", op.tactics, asked, takes_wanted))
    monkeypatch.setattr(provider, "tactics", _asking("provider", provider.tactics, asked, takes_wanted))
    hint = (lambda name: name) if takes_wanted else (lambda name: None)

    fast = find_tactic(registry, node, graph, {"name": "fast", "params": {"variant": "fast"}, "provider": CONTRIBUTOR})
    assert (fast.name, fast.provider, asked) == ("fast", CONTRIBUTOR, [("provider", hint("fast"))])
    asked.clear()
    tiled = find_tactic(registry, node, graph, {"name": "tiled", "params": {"variant": "tiled"}})
    assert (tiled.name, tiled.provider, asked) == ("tiled", None, [("owner", hint("tiled"))])
    asked.clear()
    gone = find_tactic(registry, node, graph, {"name": "gone", "params": {}})  # (the first offered, as before)
    assert (gone.name, asked) == ("plain", [("owner", hint("gone")), ("owner", None), ("provider", None)])


def _graph(registry):
    from plugrt.onnx.importer import import_model

    return import_model(make_model(), registry=registry)


# ---------------------------------------------------------------------------- the conformance kit


class ReluTactics(TacticProvider):
    """Relu by a kernel of the provider's own: the owner's scalar function, or a wrong one."""

    op_type = "Relu"
    tactic_names = ("contributed",)

    def __init__(self, wrong=False):
        self.wrong = wrong

    def tactics(self, node, inputs, outputs):
        fn = self.owner(node).pointwise(node, inputs)
        if self.wrong:
            from plugrt.kernels import jit

            @jit(device=True)
            def fn(x):  # forgets the clamp at zero
                return x
        return [pointwise_tactic(fn, inputs, outputs[0], name="contributed")]

    def examples(self):
        return [Example((TensorInfo(np.float32, (3, 4)),))]


def _kit_registry(provider):
    registry = Registry.load(autoload=False)
    registry.register(Holder(providers=[provider]), name=CONTRIBUTOR, distribution=CONTRIBUTOR_DIST, version="1.0")
    return registry


def test_the_kit_passes_a_right_contribution_on_the_owners_reference():
    registry = _kit_registry(ReluTactics())
    report = check_plugin(CONTRIBUTOR_DIST, registry=registry)
    assert {(r.op, r.check) for r in report.results} == {("Relu", c) for c in
                                                          ("claims", "tactics", "guards", "plan", "pickle")}
    assert all(r.status == "passed" for r in report.results)


def test_the_kit_fails_a_planted_wrong_contribution():
    registry = _kit_registry(ReluTactics(wrong=True))
    with pytest.raises(ConformanceError, match="tactic 'contributed'.*differs from the reference"):
        check_plugin(CONTRIBUTOR_DIST, registry=registry)
    x = np.random.default_rng(3).standard_normal((2, 5)).astype(np.float32)
    with pytest.raises(AssertionError, match="contributed"):
        check_node("Relu", {"x": x}, registry=registry)


def test_the_kit_names_a_provider_whose_op_nobody_owns():
    registry = Registry()
    registry.register(Holder(providers=[ReluTactics()]), name=CONTRIBUTOR, distribution=CONTRIBUTOR_DIST)
    with pytest.raises(ConformanceError, match="contributes tactics to Relu, which no installed plugin provides"):
        check_plugin(CONTRIBUTOR, registry=registry)


def test_the_kit_refuses_undeclared_tactic_names():
    class Undeclared(ReluTactics):
        tactic_names = ("something_else",)

    with pytest.raises(ConformanceError, match="not among the provider's tactic_names"):
        check_plugin(CONTRIBUTOR, registry=_kit_registry(Undeclared()), checks=["tactics"])


def test_a_provider_instance_is_a_check_target():
    report = check_plugin(ReluTactics(), checks=["tactics"])
    assert report.ok


# ---------------------------------------------------------------------------- the command line


def test_cli_plugins_lists_contributed_tactics(monkeypatch, capsys):
    registry = registry_with(OWNER, FAST)
    monkeypatch.setattr("plugrt.registry.default_registry", lambda: registry)
    assert main(["plugins", "--json"]) == 0
    plugins = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plugins"]}
    assert plugins[CONTRIBUTOR]["tactics"][0]["tactic_names"] == ["fast"]
    assert main(["plugins"]) == 0
    assert f"tactics for {DOMAIN}::Twice: fast" in capsys.readouterr().out


def test_cli_inspect_names_the_contributor(tmp_path, monkeypatch, capsys):
    registry = registry_with(OWNER, FAST)
    path = tmp_path / "model.plan"
    build(registry, Clock(OWNER + FAST)).save(str(path))
    monkeypatch.setattr("plugrt.registry.default_registry", lambda: registry)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"tactic from {CONTRIBUTOR} ({CONTRIBUTOR_DIST})" in out and "tactics for" in out
