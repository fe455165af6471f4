"""The plugin contract: loading, validation, visibility, and built-ins taking the third party's road."""

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from plugin_fixtures import ECHO_PLUGIN, SysPath, env_with_path, install_distribution
from plugrt import PluginError, hookimpl, hookspecs
from plugrt.onnx import import_model
from plugrt.plugin import OpPlugin, TensorInfo
from plugrt.reference import ReferenceExecutor
from plugrt.registry import CORE_PLUGIN, Registry

ROOT = Path(__file__).resolve().parents[1]


def scale_shift_model():
    node = helper.make_node("ScaleShift", ["x"], ["t"], domain="com.example", scale=2.0, shift=0.5)
    relu = helper.make_node("Relu", ["t"], ["y"])
    graph = helper.make_graph(
        [node, relu], "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


def test_builtin_ops_come_through_entry_points(registry):
    builtins = [r for r in registry.plugins.values() if r.distribution == "plugrt" and r.name != CORE_PLUGIN]
    assert builtins, "no built-in plugin was loaded through the entry point group"
    assert all(r.name.startswith("builtin-") and r.version for r in builtins)
    assert registry.find_op("", "Relu", 17) is not None
    assert not registry.failures


def test_third_party_distribution_is_found_and_its_op_runs(tmp_path, rng):
    install_distribution(tmp_path, "plugrt-example", "plugrt_example", ECHO_PLUGIN.format(version="1.2"))
    with SysPath(tmp_path, ["plugrt_example"]):
        registry = Registry.load()
        record = registry.plugins["plugrt-example"]
        assert record.distribution == "plugrt-example" and record.version == "1.0"
        assert [op.op_type for op in record.ops] == ["ScaleShift"]
        graph = import_model(scale_shift_model(), registry)
        x = rng.standard_normal((4, 3)).astype(np.float32)
        y = ReferenceExecutor(graph, registry).run({"x": x})["y"]
    np.testing.assert_allclose(y, np.maximum(x * 2.0 + 0.5, 0), rtol=1e-6)


def test_cli_lists_third_party_plugin(tmp_path):
    install_distribution(tmp_path, "plugrt-example", "plugrt_example", ECHO_PLUGIN.format(version="1.2"))
    out = subprocess.run([sys.executable, "-m", "plugrt", "plugins", "--json"], capture_output=True, text=True,
                         env=env_with_path(tmp_path), check=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)["plugins"]}
    assert plugins["plugrt-example"]["distribution"] == "plugrt-example"
    assert plugins["plugrt-example"]["ops"][0] == {"domain": "com.example", "op_type": "ScaleShift",
                                                   "since_opset": 1, "until_opset": None, "version": "1.2"}
    assert any(p["distribution"] == "plugrt" and any(o["op_type"] == "Relu" for o in p["ops"])
               for p in plugins.values())


def test_broken_plugin_is_reported_and_others_keep_working(tmp_path):
    install_distribution(tmp_path, "plugrt-broken", "plugrt_broken", "raise ImportError('needs libfoo')\n")
    with SysPath(tmp_path, ["plugrt_broken"]):
        registry = Registry.load()
    (failure,) = [f for f in registry.failures if f.name == "plugrt-broken"]
    assert failure.distribution == "plugrt-broken" and "needs libfoo" in failure.error
    assert registry.find_op("", "Relu", 17) is not None


def test_duplicate_op_names_both_owners(tmp_path):
    install_distribution(tmp_path / "a", "plugrt-one", "plugrt_one", ECHO_PLUGIN.format(version="1"))
    install_distribution(tmp_path / "b", "plugrt-two", "plugrt_two", ECHO_PLUGIN.format(version="2"))
    with SysPath(tmp_path / "a", ["plugrt_one"]), SysPath(tmp_path / "b", ["plugrt_two"]):
        registry = Registry.load()
    (failure,) = registry.failures
    assert "plugrt-one" in failure.error and "plugrt-two" in failure.error
    assert "ScaleShift" in failure.error


def test_duplicate_builtin_op_is_refused(registry):
    class MyRelu(OpPlugin):
        op_type = "Relu"

        def infer(self, node, inputs):
            return [inputs[0]]

        def reference(self, node, inputs):
            return [inputs[0]]

    class Plugin:
        @hookimpl
        def plugrt_ops(self):
            return [MyRelu()]

    fresh = Registry.load()
    with pytest.raises(PluginError, match=r"Relu.*builtin-activation"):
        fresh.register(Plugin(), name="my-relu", distribution="my-dist")
    assert "my-relu" not in fresh.plugins


def test_unknown_hook_and_bad_arguments_are_refused():
    class Typo:
        @hookimpl
        def plugrt_opz(self):
            return []

    class BadArgs:
        @hookimpl
        def plugrt_ops(self, wrong):
            return []

    registry = Registry()
    with pytest.raises(PluginError, match="plugrt_opz"):
        registry.register(Typo(), name="typo")
    with pytest.raises(PluginError, match="wrong"):
        registry.register(BadArgs(), name="bad")


def test_invalid_op_objects_are_refused():
    class NoReference(OpPlugin):
        op_type = "Foo"

        def infer(self, node, inputs):
            return []

    for item, pattern in [(object(), "not an OpPlugin"), (NoReference(), "reference")]:
        class Plugin:
            @hookimpl
            def plugrt_ops(self, _item=item):
                return [_item]

        with pytest.raises(PluginError, match=pattern):
            Registry().register(Plugin(), name="p")


def test_unsupported_api_version_is_refused():
    class Future:
        PLUGRT_API = (7, 9)

        @hookimpl
        def plugrt_ops(self):
            return []

    with pytest.raises(PluginError, match=r"API 7\.\.9.*install"):
        Registry().register(Future(), name="future", distribution="plugrt-future")


def test_disable_autoload_and_allow_list(tmp_path, monkeypatch):
    install_distribution(tmp_path, "plugrt-example", "plugrt_example", ECHO_PLUGIN.format(version="1"))
    with SysPath(tmp_path, ["plugrt_example"]):
        monkeypatch.setenv("PLUGRT_DISABLE_PLUGIN_AUTOLOAD", "1")
        registry = Registry.load()
        assert "plugrt-example" not in registry.plugins and "builtin-activation" in registry.plugins
        monkeypatch.delenv("PLUGRT_DISABLE_PLUGIN_AUTOLOAD")
        monkeypatch.setenv("PLUGRT_PLUGINS", "plugrt-example,builtin-activation")
        registry = Registry.load()
        assert sorted(registry.plugins) == ["builtin-activation", CORE_PLUGIN, "plugrt-example"]


def test_trace_switch_prints_hook_calls(tmp_path):
    code = "from plugrt.registry import Registry; Registry.load()"
    env = env_with_path(tmp_path)
    env["PLUGRT_TRACE_PLUGINS"] = "1"
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stderr
    assert "plugrt_ops" in err


def test_passes_hook_is_collected_in_order():
    from plugrt.plugin import GraphPass

    class Passes:
        @hookimpl
        def plugrt_passes(self):
            return [GraphPass("late", lambda g, r: 0, priority=200), GraphPass("early", lambda g, r: 0, priority=10)]

    registry = Registry()
    registry.register(Passes(), name="passes")
    assert [p.name for _, p in registry.passes()] == ["early", "late"]


def test_every_hook_has_a_test():
    """Each hookspec is exercised by name somewhere in the test suite."""
    specs = [name for name in dir(hookspecs) if name.startswith("plugrt_")]
    sources = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    assert specs and all(sources.count(name) >= 1 for name in specs), specs


def test_core_never_imports_builtin_ops():
    offenders = []
    for path in (ROOT / "core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "plugrt_builtin_ops" for n in names):
                offenders.append(str(path))
        if "plugrt_builtin_ops" in path.read_text():
            offenders.append(str(path))
    assert not offenders


def test_builtin_ops_are_one_package_per_family():
    """builtin_ops/ has no module at its top level but ``__init__.py``; each family package
    (with its ``ops.py``) is one ``builtin-<family>`` entry point; and no module imports a
    private name from another family (what families share is in ``plugrt_builtin_ops.common``)."""
    builtin = ROOT / "builtin_ops"
    assert [p.name for p in builtin.glob("*.py")] == ["__init__.py"]
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["plugrt.plugins"]
    families = {p.parent.name for p in builtin.glob("*/__init__.py")} - {"common"}
    assert entry_points == {f"builtin-{family}": f"plugrt_builtin_ops.{family}" for family in families}
    assert all((builtin / family / "ops.py").is_file() for family in families)
    offenders = []
    for path in builtin.rglob("*.py"):
        package = ["plugrt_builtin_ops", *path.relative_to(builtin).parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{module}.{alias.name}".split(".")
                if target[0] == "plugrt_builtin_ops" and target[1:2] != package[1:2] and target[-1].startswith("_"):
                    offenders.append(f"{path.relative_to(ROOT)}: {'.'.join(target)}")
    assert not offenders


def test_graph_of_builtin_and_custom_op_infers_symbolic_shapes(tmp_path):
    install_distribution(tmp_path, "plugrt-example", "plugrt_example", ECHO_PLUGIN.format(version="1"))
    with SysPath(tmp_path, ["plugrt_example"]):
        graph = import_model(scale_shift_model(), Registry.load())
    assert graph.values["y"].info.shape == ("N", 3)
    assert isinstance(graph.values["y"].info, TensorInfo)
