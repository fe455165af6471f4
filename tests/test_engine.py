"""The GPU engine end to end (in the CUDA simulator without a GPU): build, plan files,
fresh-process loading, plugin version checks, corrupt plans, bindings, profiles."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugin_fixtures import ECHO_PLUGIN, SysPath, env_with_path, install_distribution
from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile
from plugrt.errors import BindingError, PlanError, PlugrtError
from plugrt.reference import ReferenceExecutor
from plugrt.registry import Registry

def mixed_model():
    """ScaleShift (a third-party op) -> Relu -> Add(bias) -> Reshape(N*3) via Shape arithmetic."""
    nodes = [
        helper.make_node("ScaleShift", ["x"], ["t"], domain="com.example", scale=2.0, shift=0.5, name="ss"),
        helper.make_node("Relu", ["t"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "bias"], ["a"], name="add"),
        helper.make_node("Shape", ["a"], ["s"], name="shape"),
        helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1, name="numel"),
        helper.make_node("Reshape", ["a", "n"], ["y"], name="flatten"),
    ]
    bias = numpy_helper.from_array(np.array([0.25, -1.0, 2.0], np.float32), "bias")
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


def _config(low=1, opt=2, high=4):
    config = BuilderConfig()
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (low, 3), (opt, 3), (high, 3)))
    return config


@pytest.fixture
def plugin_dir(tmp_path):
    root = tmp_path / "site"
    install_distribution(root, "plugrt-gpu-example", "plugrt_gpu_example", ECHO_PLUGIN.format(version="1.2"),
                         version="1.2")
    return root


def _build(plugin_dir, tmp_path, rng):
    with SysPath(plugin_dir, ["plugrt_gpu_example"]):
        registry = Registry.load()
        model = mixed_model()
        engine = Builder(registry).build_engine(model, _config())
        plan = tmp_path / "mixed.plan"
        engine.save(str(plan))
        x = rng.standard_normal((3, 3)).astype(np.float32)
        got = engine.create_execution_context().execute({"x": x})["y"]
        from plugrt.onnx.importer import import_model

        want = ReferenceExecutor(import_model(model, registry), registry).run({"x": x})["y"]
    return engine, plan, x, got, want


def test_build_run_matches_reference_and_host_computes_shapes(plugin_dir, tmp_path, rng):
    engine, _, x, got, want = _build(plugin_dir, tmp_path, rng)
    assert got.shape == (9,)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    report = engine.inspect()
    # the third-party pointwise op fuses with the built-in ones into one generated kernel
    assert [layer["op"] for layer in report["layers"]] == ["ScaleShift+Relu+Add", "Reshape"]
    assert set(report["host_nodes"]) == {"shape", "numel"}
    assert report["layers"][0]["parts"][0]["distribution"] == "plugrt-gpu-example"
    assert report["memory"]["arena_bytes"] > 0 and report["memory"]["weights_bytes"] == 12


def test_plan_loads_in_a_fresh_process_with_identical_outputs(plugin_dir, tmp_path, rng):
    _, plan, x, got, _ = _build(plugin_dir, tmp_path, rng)
    np.save(tmp_path / "x.npy", x)
    script = ("import numpy as np, sys; from plugrt.engine import Engine; "
              "e = Engine.load(sys.argv[1]); "
              "np.save(sys.argv[3], e.create_execution_context().execute({'x': np.load(sys.argv[2])})['y'])")
    subprocess.run([sys.executable, "-c", script, str(plan), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                   env=env_with_path(plugin_dir), check=True)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), got)


def test_plan_without_its_plugin_names_distribution_and_version(plugin_dir, tmp_path, rng):
    _, plan, *_ = _build(plugin_dir, tmp_path, rng)
    with pytest.raises(PlanError, match=r"plugrt-gpu-example.*1\.2.*pip install plugrt-gpu-example==1\.2"):
        Engine.load(str(plan), Registry.load())
    result = subprocess.run([sys.executable, "-m", "plugrt", "inspect", str(plan)], capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "pip install plugrt-gpu-example==1.2" in result.stderr


def test_plan_with_another_plugin_version_says_which_to_install(plugin_dir, tmp_path, rng):
    _, plan, *_ = _build(plugin_dir, tmp_path, rng)
    other = tmp_path / "other"
    install_distribution(other, "plugrt-gpu-example", "plugrt_gpu_example", ECHO_PLUGIN.format(version="2.0"),
                         version="2.0")
    with SysPath(other, ["plugrt_gpu_example"]):
        with pytest.raises(PlanError, match=r"built with plugrt-gpu-example 1\.2.*2\.0.*is installed"):
            Engine.load(str(plan), Registry.load())


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "foreign"])
def test_corrupt_or_truncated_plan_fails_cleanly(plugin_dir, tmp_path, rng, damage):
    _, plan, *_ = _build(plugin_dir, tmp_path, rng)
    data = plan.read_bytes()
    bad = {"truncate": data[: len(data) // 2], "flip": data[:100] + bytes([data[100] ^ 0xFF]) + data[101:],
           "empty": b"", "foreign": b"\x08\x07" + data[2:]}[damage]
    plan.write_bytes(bad)
    with pytest.raises(PlanError):
        Engine.load(str(plan))
    result = subprocess.run([sys.executable, "-m", "plugrt", "run", str(plan)], capture_output=True, text=True,
                            env=env_with_path(plugin_dir))
    assert result.returncode == 2 and "Traceback" not in result.stderr and "plan" in result.stderr


def test_bindings_are_checked_and_the_context_stays_usable(plugin_dir, tmp_path, rng):
    with SysPath(plugin_dir, ["plugrt_gpu_example"]):
        registry = Registry.load()
        engine = Builder(registry).build_engine(mixed_model(), _config())
        context = engine.create_execution_context()
        x = rng.standard_normal((2, 3)).astype(np.float32)
        good = context.execute({"x": x})["y"]
        for feeds, message in [({"x": x.astype(np.float64)}, "expected dtype float32, got float64"),
                               ({"x": rng.standard_normal((5, 3)).astype(np.float32)}, r"dim 0 is 5, outside .*\[1, 4\]"),
                               ({"x": x[:, :2].copy()}, "dim 1 must be 3, got 2"),
                               ({"z": x}, "unknown input binding"), ({}, "missing input binding")]:
            with pytest.raises(BindingError, match=message):
                context.execute(feeds)
        np.testing.assert_array_equal(context.execute({"x": x})["y"], good)


def test_dynamic_input_without_a_profile_is_refused(plugin_dir):
    with SysPath(plugin_dir, ["plugrt_gpu_example"]):
        with pytest.raises(PlugrtError, match=r"input 'x' has dynamic shape \[N,3\].*min/opt/max"):
            Builder(Registry.load()).build_engine(mixed_model(), BuilderConfig())


def test_memory_plan_reuses_arena_bytes(registry, rng):
    """A chain of 6 Relus at batch 4 needs two live buffers, not six."""
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(6)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("v6", TensorProto.FLOAT, [4, 64])])
    engine = Builder(registry).build_engine(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert engine.arena_bytes <= 3 * 4 * 64 * 4
    x = rng.standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(engine.create_execution_context().execute({"v0": x})["v6"],
                                  np.maximum(x, 0))


def test_cli_build_inspect_run_compare(plugin_dir, tmp_path):
    import onnx

    model_path = tmp_path / "m.onnx"
    onnx.save(mixed_model(), str(model_path))
    plan = tmp_path / "m.plan"
    env = env_with_path(plugin_dir)
    run = lambda *args: subprocess.run([sys.executable, "-m", "plugrt", *args], capture_output=True, text=True, env=env)
    result = run("build", str(model_path), "-o", str(plan), "--min-shapes", "x:1x3", "--opt-shapes", "x:2x3",
                 "--max-shapes", "x:4x3")
    assert result.returncode == 0, result.stderr
    report = json.loads(run("inspect", str(plan), "--json").stdout)
    assert report["profile"]["x"] == {"min": [1, 3], "opt": [2, 3], "max": [4, 3]}
    result = run("run", str(plan), "--save", str(tmp_path / "out.npz"), "--compare-onnxruntime", str(model_path))
    # onnxruntime does not know com.example::ScaleShift: a clean user error, not a traceback, and
    # before anything runs or is written
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert not (tmp_path / "out.npz").exists()
    assert run("run", str(plan), "--save", str(tmp_path / "out.npz")).returncode == 0
    assert np.load(tmp_path / "out.npz")["y"].shape == (6,)
    bad = run("build", str(model_path), "-o", str(plan), "--max-shapes", "x:2by3")
    assert bad.returncode == 2 and "NAME:DxDx" in bad.stderr
