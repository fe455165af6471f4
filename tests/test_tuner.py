"""The tactic tuner and its timing cache, in the simulator with injected measure functions.

A test op (``com.test.tuning::Twice``, y = 2x on a 1-D tensor) offers tactics the test
chooses: correct ones, a wrong one, one that raises, one that writes nothing, TF32-marked
ones. ``Builder(registry, measure=...)`` runs the tuner's whole GPU path (random inputs,
verification against the reference tactic, timing) with kernels in the simulator and the
times the test gives.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

from plugrt import hookimpl
from plugrt.cli import main
from plugrt.device import simulated
from plugrt.engine import Builder, BuilderConfig, Engine
from plugrt.engine.plan_file import decode_plan, encode_plan
from plugrt.errors import PlugrtError, UnsupportedError
from plugrt.ir.graph import Graph, Node
from plugrt.kernels import cuda, jit
from plugrt.plugin import OpPlugin, TensorInfo
from plugrt.registry import Registry
from plugrt.tactic import Launch, Tactic
from plugrt.tuning import PLAUSIBLE_TACTICS, TACTICS_BY_LEVEL, TimingCache, TimingCacheError, Tuner, layer_key, tactic_key
from plugrt.tuning.timing import verify
from plugrt.tuning.timing_cache import FAILED

DOMAIN = "com.test.tuning"


@jit
def _affine(x, y, n, scale, shift):
    i = cuda.grid(1)
    if i < n:
        y[i] = x[i] * scale + shift


def _variant(name, time_ms, kind="ok", math=""):
    """A tactic description: ``kind`` is ok, wrong (adds 1), raises or lazy (writes nothing)."""
    return SimpleNamespace(name=name, time_ms=time_ms, kind=kind, math=math)


def _launches(kind):
    def launches(inputs, outputs, workspace):
        if kind == "raises":
            raise RuntimeError("this tactic cannot run here")
        if kind == "lazy":
            return []
        x, y = inputs[0], outputs[0]
        shift = np.float32(1.0 if kind == "wrong" else 0.0)
        return [Launch(_affine, 1, 32, (x, y, np.int64(x.size), np.float32(2.0), shift))]
    return launches


class Twice(OpPlugin):
    """y = 2x, with the tactics in ``variants``."""

    domain = DOMAIN
    op_type = "Twice"
    version = "1.0"

    def __init__(self, variants):
        self.variants = variants

    def infer(self, node, inputs):
        return [TensorInfo(inputs[0].dtype, inputs[0].shape)]

    def reference(self, node, inputs):
        return [inputs[0] * 2]

    def tactics(self, node, inputs, outputs, epilogue=None):
        return [Tactic(v.name, _launches(v.kind), {"variant": v.name}, math=v.math) for v in self.variants]


class _TuningPlugin:
    def __init__(self, op):
        self.op = op

    @hookimpl
    def plugrt_ops(self):
        return [self.op]


def make_registry(variants, version="1.0"):
    registry = Registry()
    registry.register(_TuningPlugin(Twice(variants)), name="tuning-test", distribution="plugrt-tuning-test",
                      version=version)
    registry.finish()
    return registry


def make_model(nodes=1, size=8):
    names = ["x"] + [f"t{i}" for i in range(1, nodes)] + ["y"]
    graph = helper.make_graph(
        [helper.make_node("Twice", [names[i]], [names[i + 1]], domain=DOMAIN, name=f"twice{i}") for i in range(nodes)],
        "tuning", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


class Clock:
    """A measure function: each tactic's stated time; remembers what it timed."""

    def __init__(self, variants):
        self.times = {v.name: v.time_ms for v in variants}
        self.calls = []

    def __call__(self, run):
        run.enqueue(0)
        run.enqueue(1)  # every buffer set has prepared launches
        self.calls.append(run.tactic.name)
        return self.times[run.tactic.name]


def build(variants, clock=None, registry=None, nodes=1, **config):
    config.setdefault("progress", False)
    registry = registry or make_registry(variants)
    return Builder(registry, measure=clock).build_engine(make_model(nodes), BuilderConfig(**config))


def chosen(engine, layer=0):
    return engine.layers[layer].tactic["name"]


# ---------------------------------------------------------------------------- selection


def test_picks_the_fastest_verified_tactic_and_records_times(caplog):
    variants = [_variant("a", 3.0), _variant("b", 1.0), _variant("wrong", 0.5, "wrong"), _variant("c", 2.0)]
    clock = Clock(variants)
    with caplog.at_level(logging.WARNING, logger="plugrt.tuning"):
        engine = build(variants, clock, optimization_level=4)  # times up to 6
    assert chosen(engine) == "b"
    assert sorted(clock.calls) == ["a", "b", "c"]  # the wrong one is never timed
    assert "'wrong'" in caplog.text and "unlike tactic 'a'" in caplog.text
    layer = engine.layers[0]
    assert layer.time_ms == 1.0
    assert layer.runner_up == {"name": "c", "params": {"variant": "c"}, "time_ms": 2.0}
    report = engine.inspect()["layers"][0]
    assert report["time_ms"] == 1.0 and report["runner_up"]["name"] == "c"
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(engine.create_execution_context().execute({"x": x})["y"], 2 * x)


@pytest.mark.parametrize("kind", ["wrong", "raises", "lazy"])
def test_a_broken_tactic_is_never_chosen(kind):
    variants = [_variant("good", 2.0), _variant("broken", 0.1, kind)]
    clock = Clock(variants)
    engine = build(variants, clock)
    assert chosen(engine) == "good" and clock.calls == ["good"]
    assert engine.layers[0].runner_up is None


def test_a_broken_reference_hands_over_to_the_next_tactic():
    variants = [_variant("first", 0.1, "raises"), _variant("second", 2.0), _variant("third", 1.0)]
    clock = Clock(variants)
    engine = build(variants, clock)
    assert chosen(engine) == "third" and sorted(clock.calls) == ["second", "third"]


def test_ties_go_to_the_plugins_preference():
    variants = [_variant("a", 1.0), _variant("b", 1.0)]
    assert chosen(build(variants, Clock(variants))) == "a"


def test_optimization_levels():
    variants = [_variant(f"v{i}", 10.0 - i) for i in range(PLAUSIBLE_TACTICS + 2)]
    level0, level3, level5 = Clock(variants), Clock(variants), Clock(variants)
    engine = build(variants, level0, optimization_level=0)
    assert chosen(engine) == "v0" and level0.calls == [] and engine.layers[0].time_ms is None
    assert chosen(build(variants, level3)) == f"v{PLAUSIBLE_TACTICS - 1}"
    assert len(level3.calls) == PLAUSIBLE_TACTICS
    assert chosen(build(variants, level5, optimization_level=5)) == f"v{PLAUSIBLE_TACTICS + 1}"
    assert len(level5.calls) == len(variants) > len(level3.calls)
    with pytest.raises(PlugrtError, match="optimization level 6"):
        build(variants, optimization_level=6)


def test_tuner_candidates_by_level():
    tactics = [f"t{i}" for i in range(max(TACTICS_BY_LEVEL) + 2)]

    def timed(level, candidates=tactics):
        return Tuner(BuilderConfig(optimization_level=level), measure=float, device={}).to_time(candidates)

    assert timed(0) == []
    assert [timed(level) for level in (1, 2, 3, 4)] == [tactics[:n] for n in (2, 3, 3, 6)]
    assert len(timed(3)) == PLAUSIBLE_TACTICS
    assert timed(5) == tactics
    assert timed(5, tactics[:1]) == []  # no choice to make
    if simulated():  # no measure: nothing is timed there (on a GPU the default measure times)
        assert Tuner(BuilderConfig(optimization_level=5), device={}).to_time(tactics) == []


def test_tf32_off_drops_tf32_tactics():
    variants = [_variant("tc", 0.5, math="tf32"), _variant("plain", 2.0), _variant("plain2", 3.0)]
    on = Clock(variants)
    assert chosen(build(variants, on)) == "tc" and "tc" in on.calls
    off = Clock(variants)
    assert chosen(build(variants, off, tf32=False)) == "plain" and "tc" not in off.calls
    assert chosen(build(variants, tf32=False, optimization_level=0)) == "plain"
    with pytest.raises(UnsupportedError, match="TF32"):
        build([_variant("tc", 0.5, math="tf32")], tf32=False)


@pytest.mark.skipif(not simulated(), reason="on a GPU the tuner times for real")
def test_in_the_simulator_without_a_measure_nothing_is_timed():
    variants = [_variant("a", 3.0), _variant("b", 1.0)]
    engine = build(variants, optimization_level=5)
    assert chosen(engine) == "a" and engine.layers[0].time_ms is None


def test_identical_layers_are_timed_once():
    variants = [_variant("a", 3.0), _variant("b", 1.0)]
    clock = Clock(variants)
    engine = build(variants, clock, nodes=3)
    assert [chosen(engine, i) for i in range(3)] == ["b"] * 3
    assert sorted(clock.calls) == ["a", "b"]


def test_progress_line_only_on_a_terminal_and_only_when_timing(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    variants = [_variant("a", 3.0), _variant("b", 1.0)]
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    build(variants, Clock(variants), nodes=2, progress=True)
    shown = terminal.getvalue()
    assert "timing layer 1/2 twice0 (2 tactics)" in shown
    assert "layer 2/2" not in shown  # its twin's times were known
    assert shown.endswith("\r")  # the line is cleared at the end
    for config in ({"progress": False}, {"progress": True, "optimization_level": 0}):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        build(variants, Clock(variants), **config)
        assert terminal.getvalue() == ""


# ---------------------------------------------------------------------------- the cache


def test_warm_cache_times_nothing_and_gives_a_byte_identical_plan(tmp_path):
    variants = [_variant("a", 3.0), _variant("wrong", 0.1, "wrong"), _variant("b", 1.0)]
    path = str(tmp_path / "timing.json")
    cold = Clock(variants)
    first = build(variants, cold, timing_cache=path)
    assert sorted(cold.calls) == ["a", "b"]
    saved = open(path, "rb").read()
    warm = Clock(variants)
    second = build(variants, warm, timing_cache=path)
    assert warm.calls == []
    assert second.serialize() == first.serialize()
    assert open(path, "rb").read() == saved
    assert [f for f in os.listdir(tmp_path) if f.startswith(".plugrt-")] == []
    cache = TimingCache.load(path)
    assert sorted(cache.entries[next(iter(cache.entries))].values()) == [1.0, 3.0, FAILED]


def test_a_new_plugin_version_misses_the_cache(tmp_path):
    variants = [_variant("a", 3.0), _variant("b", 1.0)]
    path = str(tmp_path / "timing.json")
    build(variants, Clock(variants), timing_cache=path)
    clock = Clock(variants)
    build(variants, clock, registry=make_registry(variants, version="2.0"), timing_cache=path)
    assert sorted(clock.calls) == ["a", "b"]
    assert len(TimingCache.load(path).entries) == 2


def test_plan_records_times_and_old_plans_still_load():
    variants = [_variant("a", 3.0), _variant("b", 1.0)]
    registry = make_registry(variants)
    engine = build(variants, Clock(variants), registry=registry)
    again = Engine.deserialize(engine.serialize(), registry)
    assert again.layers == engine.layers
    header, arrays = decode_plan(engine.serialize())
    for layer in header["layers"]:
        del layer["time_ms"], layer["runner_up"]
    old = Engine.deserialize(encode_plan(header, arrays), registry)
    assert old.layers[0].time_ms is None and old.inspect()["layers"][0]["runner_up"] is None


def _key_parts():
    graph = Graph()
    graph.add_input("x", TensorInfo(np.float32, (2, 8)))
    graph.add_const("axes", np.array([1], np.int64))
    graph.add_const("w", np.ones(100, np.float32))
    node = graph.add_node(Node("n", "Op", "com.test", ("x", "axes", "w"), ("y",),
                               {"alpha": 1.0, "table": np.arange(4, dtype=np.int64),
                                "body": [{"op_type": "Relu", "attrs": {}, "version": "1.0"}]}, 3))
    graph.values["y"].info = TensorInfo(np.float32, (2, 8))
    owner = SimpleNamespace(name="p", distribution="dist", version="1.0")
    return node, graph, SimpleNamespace(version="1"), owner, {"name": "H200", "compute_capability": [9, 0]}


def test_layer_key_changes_with_every_component():
    node, graph, op, owner, device = _key_parts()
    base = layer_key(node, graph, op, owner, device)
    assert base == layer_key(*_key_parts())
    assert json.loads(base)["inputs"][1]["value"] == [1]
    assert "value" not in json.loads(base)["inputs"][2]  # a large constant: dtype and shape only

    def with_graph(change):
        n, g, o, w, d = _key_parts()
        change(g)
        return layer_key(n, g, o, w, d)

    variants = [
        layer_key(node, graph, op, owner, {**device, "name": "A100"}),
        layer_key(node, graph, op, owner, {**device, "compute_capability": [8, 0]}),
        layer_key(node, graph, op, SimpleNamespace(name="p", distribution="dist", version="1.1"), device),
        layer_key(node, graph, SimpleNamespace(version="2"), owner, device),
        layer_key(node.replace(opset=4), graph, op, owner, device),
        layer_key(node.replace(attrs={**node.attrs, "alpha": 2.0}), graph, op, owner, device),
        layer_key(node.replace(attrs={**node.attrs, "table": np.arange(1, 5, dtype=np.int64)}), graph, op, owner,
                  device),
        layer_key(node.replace(attrs={**node.attrs, "body": [{"op_type": "Relu", "attrs": {}, "version": "1.1"}]}),
                  graph, op, owner, device),
        with_graph(lambda g: setattr(g.values["x"], "info", TensorInfo(np.float32, (4, 8)))),
        with_graph(lambda g: setattr(g.values["x"], "info", TensorInfo(np.float16, (2, 8)))),
        with_graph(lambda g: setattr(g.values["axes"], "info", TensorInfo.of(np.array([0], np.int64)))),
    ]
    assert len(set(variants)) == len(variants) and base not in variants
    tactic = Tactic("tiled", lambda *a: [], {"tile": 64})
    assert tactic_key(tactic) != tactic_key(Tactic("tiled", lambda *a: [], {"tile": 128}))
    assert tactic_key(tactic) != tactic_key(Tactic("direct", lambda *a: [], {"tile": 64}))


def test_fused_layers_differing_only_in_names_share_a_key():
    from plugrt.fusion.op import FUSED_DOMAIN, FUSED_OP

    def fused(prefix, alpha=0.1):
        graph = Graph()
        graph.add_input(f"{prefix}x", TensorInfo(np.float32, (4,)))
        body = [{"name": f"{prefix}relu", "op_type": "LeakyRelu", "domain": "", "opset": 17,
                 "inputs": [f"{prefix}x"], "outputs": [f"{prefix}r"], "attrs": {"alpha": alpha},
                 "origin": [f"{prefix}relu"], "plugin": "p", "distribution": "d", "version": "1", "op_version": "1"},
                {"name": f"{prefix}neg", "op_type": "Neg", "domain": "", "opset": 17, "inputs": [f"{prefix}r"],
                 "outputs": [f"{prefix}y"], "attrs": {}, "origin": [f"{prefix}neg"], "plugin": "p",
                 "distribution": "d", "version": "1", "op_version": "1"}]
        node = graph.add_node(Node(f"{prefix}layer", FUSED_OP, FUSED_DOMAIN, (f"{prefix}x",), (f"{prefix}y",),
                                   {"body": body}, 1))
        graph.values[f"{prefix}y"].info = TensorInfo(np.float32, (4,))
        owner = SimpleNamespace(name="core-fusion", distribution="plugrt", version="0.1")
        return layer_key(node, graph, SimpleNamespace(version="1"), owner, {"name": "H200"})

    assert fused("a_") == fused("b_")
    assert fused("a_") != fused("a_", alpha=0.2)


def test_cache_round_trip_and_merge(tmp_path):
    cache = TimingCache()
    cache.record("L1", "a", 1.5)
    cache.record("L1", "b", FAILED)
    path = str(tmp_path / "c.json")
    cache.save(path)
    loaded = TimingCache.load(path)
    assert loaded.entries == cache.entries and loaded.lookup("L1", "a") == 1.5
    assert loaded.lookup("L1", "zzz") is None and loaded.lookup("L9", "a") is None
    assert json.load(open(path))["entries"]["L1"]["b"] is None
    other = TimingCache({"L1": {"a": 1.0, "b": 0.1, "c": 2.0}, "L2": {"a": 4.0}})
    cache.merge(other)
    assert cache.entries == {"L1": {"a": 1.0, "b": FAILED, "c": 2.0}, "L2": {"a": 4.0}}
    assert len(cache) == 4
    assert len(TimingCache.load(str(tmp_path / "missing.json"))) == 0


@pytest.mark.parametrize("text, message, fix", [
    ("{not json", "is not a plugrt timing cache: it is a text file", "name a timing cache file"),
    ('{"entries": {"L": {"a": 1', "is corrupt", "delete it"),  # a truncated cache
    ('{"format": "something-else"}', "is not a plugrt timing cache: it is a JSON file", "name a timing cache file"),
    ('[1, 2]', "is not a plugrt timing cache", "name a timing cache file"),
    ('{"format": "plugrt-timing-cache", "version": 99, "entries": {}}', "version 99", "delete it"),
    ('{"format": "plugrt-timing-cache", "version": 1, "entries": {"L": {"a": "fast"}}}', "malformed", "delete it"),
])
def test_a_bad_cache_file_names_the_file_and_the_fix(tmp_path, text, message, fix):
    """Only a file that is (or was) a timing cache is one to delete; anything else is named."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TimingCacheError, match=message) as info:
        TimingCache.load(str(path))
    assert str(path) in str(info.value) and fix in str(info.value)
    if fix != "delete it":
        assert "delete" not in str(info.value)


def test_verify_tolerances():
    want = [np.array([1.0, -2.0, np.nan], np.float32)]
    assert verify([want[0] + np.float32(5e-4)], want, tf32=False) is None
    assert "differs" in verify([want[0] + np.float32(2e-2)], want, tf32=False)
    assert verify([want[0] + np.float32(8e-3)], want, tf32=True) is None
    assert "NaN" in verify([np.array([1.0, -2.0, 0.0], np.float32)], want, tf32=False)
    assert verify([np.array([3, 4], np.int64)], [np.array([3, 4], np.int64)], tf32=False) is None
    assert "differs" in verify([np.array([3, 5], np.int64)], [np.array([3, 4], np.int64)], tf32=True)
    scalar = np.array(-0.614, np.float32)  # 0-d outputs (a 1-D MatMul, a full reduction)
    assert verify([scalar + np.float32(1e-7)], [scalar], tf32=False) is None
    assert "differs" in verify([scalar + np.float32(1.0)], [scalar], tf32=False)
    assert verify([np.array(np.inf, np.float32)], [np.array(np.inf, np.float32)], tf32=True) is None


# ---------------------------------------------------------------------------- command line


def test_cli_merges_caches(tmp_path, capsys):
    a, b, out = (str(tmp_path / n) for n in ("a.json", "b.json", "out.json"))
    TimingCache({"L1": {"t": 2.0}}).save(a)
    TimingCache({"L1": {"t": 1.0}, "L2": {"t": 3.0}}).save(b)
    assert main(["timing-cache", "merge", a, b, "-o", out]) == 0
    assert TimingCache.load(out).entries == {"L1": {"t": 1.0}, "L2": {"t": 3.0}}
    assert "2 layers, 2 timings" in capsys.readouterr().out
    assert main(["timing-cache", "merge", a, str(tmp_path / "nope.json"), "-o", out]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_corrupt_cache_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    TimingCache({"L1": {"t": 2.0}}).save(str(bad))
    bad.write_bytes(bad.read_bytes()[:20])  # truncated: a damaged cache, to delete
    model = tmp_path / "m.onnx"
    model.write_bytes(make_model().SerializeToString())
    code = main(["build", str(model), "-o", str(tmp_path / "m.plan"), "--timing-cache", str(bad), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "\nplugrt: error: timing cache" in "\n" + err and str(bad) in err
    assert "Traceback" not in err and "delete it" in err
    bad.write_text("\x00garbage")  # not a cache: named for what it is, never "delete it"
    code = main(["build", str(model), "-o", str(tmp_path / "m.plan"), "--timing-cache", str(bad), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a plugrt timing cache: it is binary data" in err and "delete" not in err


def test_cli_build_flags_and_inspect_shows_times(tmp_path, capsys, monkeypatch):
    import plugrt.registry

    variants = [_variant("a", 3.0), _variant("b", 1.0)]
    registry = make_registry(variants)
    monkeypatch.setattr(plugrt.registry, "default_registry", lambda: registry)
    model = tmp_path / "m.onnx"
    model.write_bytes(make_model().SerializeToString())
    plan = str(tmp_path / "m.plan")
    assert main(["build", str(model), "-o", plan, "--optimization-level", "5", "--no-tf32", "--no-progress",
                 "--timing-cache", str(tmp_path / "t.json")]) == 0
    if simulated():
        assert Engine.load(plan, registry).layers[0].time_ms is None  # the simulator times nothing
    build(variants, Clock(variants)).save(plan)
    capsys.readouterr()
    assert main(["inspect", plan]) == 0
    assert "time 1.0000 ms; runner-up a {'variant': 'a'} 3.0000 ms" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["build", str(model), "-o", plan, "--optimization-level", "7"])
    assert exit_info.value.code == 2
