"""Kernel keys (plugrt.tuning.kernel_keys): the same in every process and at build and
load, different whenever what a layer's kernels are made from differs."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from fuzz_plan_targets import MODELS, build_plans
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, Engine
from plugrt.engine.specialization import find_tactic
from plugrt.ir.specialize import concretize
from plugrt.ir.tensor import TensorInfo
from plugrt.tuning import kernel_keys
from plugrt.tuning.kernel_keys import layer_key

TESTS = pathlib.Path(__file__).resolve().parent

_PRINT_KEYS = """
import json, sys
sys.path.insert(0, {tests!r})
from fuzz_plan_targets import build_plans
from test_kernel_keys import plan_keys
print(json.dumps([plan_keys(Engine.deserialize(plan)) for plan in build_plans()]))
"""


def opt_graph(engine):
    return concretize(engine.graph, {n: s[1] for n, s in engine.profile.shapes.items()}, engine.registry,
                      engine.profile.shape_values)


def plan_keys(engine) -> list:
    """The key of each device layer of ``engine`` at its opt shapes, as a context makes them."""
    graph = opt_graph(engine)
    keys = []
    for layer in engine.layers:
        node = graph.nodes[layer.node_index]
        keys.append(layer_key(engine.registry, node, graph, find_tactic(engine.registry, node, graph, layer.tactic)))
    return keys


def test_keys_are_the_same_in_another_process():
    here = [plan_keys(Engine.deserialize(plan)) for plan in build_plans()]
    assert all(isinstance(k, str) and len(k) == 64 for keys in here for k in keys)
    assert len({k for keys in here for k in keys}) == sum(map(len, here))  # three models, three keys
    script = "from plugrt.engine import Engine\n" + _PRINT_KEYS.format(tests=str(TESTS))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=str(TESTS))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == here


def test_the_builder_times_tactics_under_the_keys_a_loaded_plan_runs_them_with(monkeypatch):
    from plugrt import launcher

    seen = []
    original = launcher.PreparedLaunch.__init__

    def record(self, launch, key=None):
        seen.append(key)
        original(self, launch, key)

    monkeypatch.setattr(launcher.PreparedLaunch, "__init__", record)
    model, _, shape = MODELS[1]()  # Conv + Relu: a fused layer whose anchor has several tactics
    config = Builder().create_builder_config()
    config.optimization_level, config.progress = 5, False
    engine = Builder(measure=lambda run: 1.0).build_engine(model, config)
    timed = {k for k in seen if k}
    assert timed and None not in seen
    seen.clear()
    Engine.deserialize(engine.serialize()).create_execution_context()
    assert seen and set(seen) <= timed


def _relu_engine(dtype=TensorProto.FLOAT, shape=(2, 3)):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info("y", dtype, list(shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = Builder().create_builder_config()
    config.optimization_level, config.progress = 0, False
    return Builder().build_engine(model, config)


def _first_layer(engine):
    graph = opt_graph(engine)
    node = graph.nodes[engine.layers[0].node_index]
    return engine.registry, node, graph, find_tactic(engine.registry, node, graph, engine.layers[0].tactic)


def test_keys_differ_with_tactic_ranks_dtypes_attributes_and_plugin_sources(monkeypatch):
    registry, node, graph, tactic = _first_layer(_relu_engine())
    base = layer_key(registry, node, graph, tactic)
    assert base == layer_key(*_first_layer(_relu_engine()))  # another build of the same model
    variants = {
        "tactic params": layer_key(registry, node, graph, dataclasses.replace(tactic, params={"block": 64})),
        "tactic name": layer_key(registry, node, graph, dataclasses.replace(tactic, name="other")),
        "tactic provider": layer_key(registry, node, graph, dataclasses.replace(
            tactic, source={"plugin": "core-fusion", "distribution": "plugrt", "version": "0",
                            "provider_version": "1"})),
        "rank": layer_key(*_first_layer(_relu_engine(shape=(2, 3, 1)))),
        "dtype": layer_key(*_first_layer(_relu_engine(dtype=TensorProto.DOUBLE))),
        "attributes": layer_key(registry, node.replace(attrs={**node.attrs, "alpha": 0.5}), graph, tactic),
        "opset": layer_key(registry, node.replace(opset=14), graph, tactic),
    }
    # Another shape of the same rank: the same key (the kernel's identity, in its full key,
    # tells a kernel that baked the shape in apart).
    assert layer_key(*_first_layer(_relu_engine(shape=(4, 3)))) == base
    real = kernel_keys.package_fingerprint
    assert layer_key(registry, node, graph, tactic) == base  # (remembered: the same key)
    monkeypatch.setattr(kernel_keys, "package_fingerprint",
                        lambda package: "edited" if package == "plugrt_builtin_ops" else real(package))
    kernel_keys.forget()  # (fingerprints are read once per process; an edit in-process is forgotten by hand)
    variants["plugin sources"] = layer_key(registry, node, graph, tactic)
    monkeypatch.setattr(kernel_keys, "package_fingerprint",
                        lambda package: "edited" if package == "plugrt" else real(package))
    kernel_keys.forget()
    variants["plugrt sources"] = layer_key(registry, node, graph, tactic)
    assert all(isinstance(k, str) for k in variants.values()), variants
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants), variants


def test_a_plugin_whose_sources_cannot_be_found_gets_no_key(monkeypatch):
    registry, node, graph, tactic = _first_layer(_relu_engine())
    monkeypatch.setattr(kernel_keys, "package_fingerprint", lambda package: None)
    kernel_keys.forget()
    assert layer_key(registry, node, graph, tactic) is None


def _with_value(graph, name, value):
    changed = graph.copy()
    info = changed.info(name)
    changed.values[name].info = TensorInfo(info.dtype, info.shape, value)
    return changed


def _conv_engine():
    """A one-Conv engine whose weight (``w``, 2x1x3x3) is a constant input."""
    weight = numpy_helper.from_array(np.linspace(-1, 1, 18, dtype=np.float32).reshape(2, 1, 3, 3), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])], [weight])
    config = Builder().create_builder_config()
    config.optimization_level, config.progress, config.fusion = 0, False, False
    return Builder().build_engine(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), config)


def test_small_host_values_enter_the_key_by_their_bytes_large_ones_by_shape():
    engine = _conv_engine()
    registry, node, graph, tactic = _first_layer(engine)
    base = layer_key(registry, node, graph, tactic)
    small = np.array(graph.info("w").value) * 2
    assert layer_key(registry, node, _with_value(graph, "w", small), tactic) != base
    big = np.zeros(kernel_keys.HASHED_VALUE_BYTES // 4 + 1, np.float32)
    big_graph = _with_value(graph, "w", big)
    same = layer_key(registry, node, big_graph, tactic)
    assert layer_key(registry, node, _with_value(graph, "w", big + 1), tactic) == same != base


def test_package_fingerprints_follow_edits_of_the_sources(tmp_path, monkeypatch):
    package = tmp_path / "plugrt_probe_kernels"
    package.mkdir()
    (package / "__init__.py").write_text("TILE = 16\n")
    (package / "ops.py").write_text("def kernel(): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kernel_keys.package_fingerprint.cache_clear()
    try:
        first = kernel_keys.package_fingerprint("plugrt_probe_kernels")
        assert first and first == kernel_keys.package_fingerprint("plugrt_probe_kernels")
        (package / "__pycache__").mkdir()
        (package / "__pycache__" / "ops.py").write_text("not a source")
        kernel_keys.package_fingerprint.cache_clear()
        assert kernel_keys.package_fingerprint("plugrt_probe_kernels") == first
        (package / "ops.py").write_text("def kernel(): return 1\n")
        assert kernel_keys.package_fingerprint("plugrt_probe_kernels") == first  # computed once per process
        kernel_keys.package_fingerprint.cache_clear()
        assert kernel_keys.package_fingerprint("plugrt_probe_kernels") != first
        assert kernel_keys.package_fingerprint("plugrt_no_such_package") is None
    finally:
        kernel_keys.package_fingerprint.cache_clear()


@pytest.mark.parametrize("obj, package", [(kernel_keys, "plugrt"), (np.float32(1), "numpy")])
def test_package_of(obj, package):
    assert kernel_keys.package_of(obj) == package


def test_remembered_keys_hold_no_model_alive():
    """:func:`layer_key` remembers keys per node, weakly: once an engine and its graphs are
    gone, its weights are freed (a process building many models does not keep them)."""
    import gc
    import weakref

    engine = _conv_engine()
    registry, node, concrete, tactic = _first_layer(engine)
    key = layer_key(registry, node, concrete, tactic)
    assert layer_key(registry, node, concrete, tactic) == key
    alive = weakref.ref(concrete.info("w").value)
    del engine, node, concrete, tactic
    gc.collect()
    assert alive() is None


def test_a_kernel_launched_again_has_one_key_whatever_the_count():
    """Launch keys rank a tactic's distinct kernels in order of appearance: a list without
    repeats keeps its indices; a repeated kernel (a recurrence's step, once a time step)
    and the kernels after a run of it keep their keys however long the run."""
    from plugrt.kernels import jit
    from plugrt.plugin import Launch

    @jit
    def first(x):
        pass

    @jit
    def step(x):
        pass

    @jit
    def last(x):
        pass

    def keys(steps):
        launches = [Launch(first, 1, 1, ())] + [Launch(step, 1, 1, ())] * steps + [Launch(last, 1, 1, ())]
        return kernel_keys.launch_keys("k", launches)

    assert keys(1) == ["k/0", "k/1", "k/2"]
    assert keys(4) == ["k/0"] + ["k/1"] * 4 + ["k/2"]
    assert kernel_keys.launch_keys(None, [Launch(first, 1, 1, ())]) == [None]
