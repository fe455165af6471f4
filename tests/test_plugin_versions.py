"""Plugin versions: the API range a plugin states, what plans record, and which installed
versions a plan loads under (see plugrt.registry and plugrt.engine.engine)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from plugin_fixtures import ECHO_PLUGIN, SysPath, env_with_path, install_distribution
from plugrt import PluginError, PlanError, hookimpl
from plugrt.engine import Builder, BuilderConfig, Engine
from plugrt.engine.engine import release_series
from plugrt.engine.plan_file import read_plan
from plugrt.registry import ASSUMED_API, Registry

DIST = "plugrt-example"
MODULE = "plugrt_example"


def _plugin(api=None):
    class Plugin:
        @hookimpl
        def plugrt_ops(self):
            return []

    if api is not None:
        Plugin.PLUGRT_API = api
    return Plugin()


# ------------------------------------------------------------------------------ API ranges


def test_plugin_stating_no_api_is_taken_as_api_1_and_refused_past_it(monkeypatch):
    record = Registry().register(_plugin(), name="plain", distribution="plugrt-plain", version="0.3")
    assert record.api == ASSUMED_API == (1, 1) and record.api_stated is False
    registry = Registry()
    monkeypatch.setattr("plugrt.registry.API_VERSION", 2)  # the core moved on
    with pytest.raises(PluginError, match=r"'plain' \(plugrt-plain 0\.3\) states no PLUGRT_API.*API 1.*implements "
                                          r"API 2.*pip install --upgrade plugrt-plain"):
        registry.register(_plugin(), name="plain", distribution="plugrt-plain", version="0.3")


def test_stated_api_range_is_recorded():
    record = Registry().register(_plugin((1, 3)), name="ranged", distribution="plugrt-ranged")
    assert record.api == (1, 3) and record.api_stated is True
    assert Registry().register(_plugin(1), name="single").api == (1, 1)
    assert record.as_json()["api"] == [1, 3]


@pytest.mark.parametrize("api", [(2, 1), "1", (1,), (1.0, 2), True, (1, 2, 3)])
def test_malformed_api_range_is_refused(api):
    with pytest.raises(PluginError, match=r"'odd'.*PLUGRT_API must be an int or a \(low, high\) pair"):
        Registry().register(_plugin(api), name="odd")


def test_plugin_too_new_says_upgrade_plugrt():
    with pytest.raises(PluginError, match=r"supports plugrt API 2\.\.3, but plugrt .* implements API 1: upgrade "
                                          r"plugrt.*or install a release of plugrt-future built for API 1"):
        Registry().register(_plugin((2, 3)), name="future", distribution="plugrt-future")


def test_plugin_too_old_says_upgrade_the_plugin(monkeypatch):
    registry = Registry()
    monkeypatch.setattr("plugrt.registry.API_VERSION", 3)
    with pytest.raises(PluginError, match=r"supports plugrt API 1\.\.2, but .* implements API 3: install a release "
                                          r"of plugrt-old built for API 3 \(pip install --upgrade plugrt-old\)"):
        registry.register(_plugin((1, 2)), name="old", distribution="plugrt-old")


def test_cli_plugins_shows_api_ranges_and_refusals(tmp_path):
    install_distribution(tmp_path / "good", DIST, MODULE, ECHO_PLUGIN.format(version="1") + "\nPLUGRT_API = (1, 2)\n")
    install_distribution(tmp_path / "bad", "plugrt-future", "plugrt_future", "PLUGRT_API = (5, 6)\n")
    env = env_with_path(tmp_path / "good")
    env["PYTHONPATH"] = f"{tmp_path / 'bad'}:{env['PYTHONPATH']}"
    text = subprocess.run([sys.executable, "-m", "plugrt", "plugins"], capture_output=True, text=True, env=env,
                          check=True).stdout
    assert text.startswith("plugrt ") and "plugin API 1" in text.splitlines()[0]
    block = text[text.index(f"{DIST}  ({DIST} 1.0)"):]
    assert block.split("\n    ops:")[0].endswith("    plugrt API: 1..2")
    assert "FAILED plugrt-future (plugrt-future 1.0)" in text and "API 5..6" in text
    data = json.loads(subprocess.run([sys.executable, "-m", "plugrt", "plugins", "--json"], capture_output=True,
                                     text=True, env=env, check=True).stdout)
    plugins = {p["name"]: p for p in data["plugins"]}
    assert data["api_version"] == 1
    assert plugins[DIST]["api"] == [1, 2] and plugins[DIST]["api_stated"] is True
    assert plugins["builtin-activation"]["api"] == [1, 1] and plugins["builtin-activation"]["api_stated"] is True
    (failure,) = [f for f in data["failures"] if f["name"] == "plugrt-future"]
    assert "upgrade plugrt" in failure["error"]


# ------------------------------------------------------------------------------ plans


def _model():
    nodes = [helper.make_node("ScaleShift", ["x"], ["t"], domain="com.example", scale=2.0, shift=0.5, name="ss"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "versions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)


@pytest.fixture
def built(tmp_path):
    """A plan built with plugrt-example 1.2.0 whose ScaleShift is op version 1."""
    root = tmp_path / "built-with"
    install_distribution(root, DIST, MODULE, ECHO_PLUGIN.format(version="1"), version="1.2.0")
    with SysPath(root, [MODULE]):
        engine = Builder(Registry.load()).build_engine(_model(), BuilderConfig())
        plan = tmp_path / "example.plan"
        engine.save(str(plan))
        want = engine.create_execution_context().execute({"x": X})["y"]
    return plan, want


def _installed(tmp_path, version, op_version, dist=DIST):
    root = tmp_path / f"installed-{dist}-{version}-{op_version}"
    install_distribution(root, dist, MODULE, ECHO_PLUGIN.format(version=op_version), version=version,
                         entry_name=dist)
    return root


def test_plan_records_each_plugins_distribution_and_version(built):
    plan, _ = built
    header, _ = read_plan(str(plan))
    (layer,) = header["layers"]
    assert (layer["plugin"], layer["distribution"]) == ("core-fusion", "plugrt")
    (fused,) = [n for n in header["graph"]["nodes"] if n["op_type"] == "Fused"]
    scale_shift = next(e for e in fused["attrs"]["body"] if e["op_type"] == "ScaleShift")
    assert (scale_shift["plugin"], scale_shift["distribution"], scale_shift["version"], scale_shift["op_version"]) \
        == (DIST, DIST, "1.2.0", "1")
    with SysPath(plan.parent / "built-with", [MODULE]):
        plugins = Engine.load(str(plan), Registry.load()).inspect()["plugins"]
    assert {"plugin": DIST, "distribution": DIST, "version": "1.2.0", "ops": {"com.example::ScaleShift": "1"}} \
        in plugins
    builtin = next(p for p in plugins if p["plugin"] == "builtin-activation")
    assert builtin["distribution"] == "plugrt" and builtin["version"] and builtin["ops"] == {"Relu": "1.0"}


def test_plan_loads_under_a_patch_release_with_the_same_op_version(built, tmp_path, caplog):
    plan, want = built
    with SysPath(_installed(tmp_path, "1.2.7", "1"), [MODULE]), caplog.at_level(logging.WARNING):
        engine = Engine.load(str(plan), Registry.load())
        got = engine.create_execution_context().execute({"x": X})["y"]
    np.testing.assert_array_equal(got, want)
    assert "built with plugrt-example 1.2.0; running it with plugrt-example 1.2.7" in caplog.text


@pytest.mark.parametrize("version, op_version, dist, why", [
    ("1.3.0", "1", DIST, r"the release series differ \(1\.2 vs 1\.3\)"),
    ("2.0.0", "1", DIST, r"the release series differ \(1\.2 vs 2\.0\)"),
    ("1.2.0", "2", DIST, "the op versions differ"),
    ("1.2.7", "2", DIST, "the op versions differ"),
    ("1.2.0", "1", "plugrt-fork", "another distribution provides the op"),
])
def test_plan_refuses_an_incompatible_plugin_and_names_the_release(built, tmp_path, version, op_version, dist, why):
    plan, _ = built
    with SysPath(_installed(tmp_path, version, op_version, dist), [MODULE]):
        with pytest.raises(PlanError, match=rf"built with plugrt-example 1\.2\.0 \(op version 1\), but {dist} "
                                            rf"{version} \(op version {op_version}\) is installed, and {why}: "
                                            r"pip install plugrt-example==1\.2\.0, or rebuild the plan"):
            Engine.load(str(plan), Registry.load())


def test_plan_without_the_plugin_names_the_release(built):
    plan, _ = built
    with pytest.raises(PlanError, match=r"not installed: pip install plugrt-example==1\.2\.0"):
        Engine.load(str(plan), Registry.load())


def test_cli_run_under_an_incompatible_plugin_fails_with_the_install_command(built, tmp_path):
    plan, _ = built
    env = env_with_path(_installed(tmp_path, "1.3.0", "1"))
    result = subprocess.run([sys.executable, "-m", "plugrt", "run", str(plan)], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "pip install plugrt-example==1.2.0" in result.stderr


@pytest.mark.parametrize("version, series", [("1.2.3", (1, 2)), ("2", (2, 0)), ("v3.1rc1", (3, 1)),
                                             ("1!4.5.6.post2", (4, 5)), ("nightly", None), (None, None)])
def test_release_series(version, series):
    assert release_series(version) == series


def test_plan_loads_under_a_newer_op_version_that_says_it_runs_the_old_one(built, tmp_path):
    """An op that added attributes (defaulting to the old behaviour) names the versions
    whose plans it still runs in ``loads_versions``."""
    plan, want = built
    root = tmp_path / "installed-loads"
    code = ECHO_PLUGIN.format(version="2") + "\nScaleShift.loads_versions = ('1',)\n"
    install_distribution(root, DIST, MODULE, code, version="1.2.0", entry_name=DIST)
    with SysPath(root, [MODULE]):
        got = Engine.load(str(plan), Registry.load()).create_execution_context().execute({"x": X})["y"]
    np.testing.assert_array_equal(got, want)
