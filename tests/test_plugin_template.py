"""The plugin template: ``plugrt new-plugin`` renders a package that installs into a fresh
environment, passes its own tests there, and runs its op in an engine built by the CLI."""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, save

from plugrt import PlugrtError
from plugrt.cli import main
from plugrt.scaffold import plugin_spec, render_plugin, template_root

ROOT = Path(__file__).resolve().parents[1]
POINTWISE_FILES = ["README.md", "pyproject.toml", "src/plugrt_soft_clip/__init__.py", "src/plugrt_soft_clip/kernels.py",
                   "src/plugrt_soft_clip/op.py", "tests/test_soft_clip.py"]


def _fresh_environment(path: Path) -> Path:
    """A new virtual environment that sees this interpreter's packages (plugrt, numba,
    pytest) but has its own site-packages, where the rendered plugin gets installed.
    No pip of its own: ``python -m pip`` finds the system's through the system site."""
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(path)
    # When this interpreter is itself a virtual environment, the system site is not where
    # its packages are: add its site directories (their .pth files included) after the new
    # environment's own.
    own = path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    parents = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    (own / "_plugrt_parent_site.pth").write_text(f"import site; list(map(site.addsitedir, {parents!r}))\n")
    return path / "bin" / "python"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PLUGRT_PLUGINS", "PLUGRT_DISABLE_PLUGIN_AUTOLOAD")}
    env.update(NUMBA_ENABLE_CUDASIM="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **extra)
    return env


def _run(args, cwd, timeout=120) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, env=_env(),
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _install(python: Path, package: Path) -> None:
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", package],
         cwd=package.parent)


def _run_its_tests(python: Path, package: Path) -> str:
    out = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"], cwd=package).stdout
    assert re.search(r"^\d+ passed in ", out, re.M) and "skipped" not in out and "deselected" not in out, out
    return out


def _chain_model(path: Path) -> None:
    """x -> SoftClip(alpha=0.5) -> Relu -> y, with a dynamic batch dimension."""
    nodes = [helper.make_node("SoftClip", ["x"], ["t"], domain="com.soft_clip", alpha=0.5, name="soft_clip"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "soft_clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.soft_clip", 1)]),
         str(path))


def test_scaffold_install_test_and_run_an_engine(tmp_path, capsys):
    """The whole road of an op author, in the simulator: scaffold -> install into a fresh
    environment -> its tests pass -> plugrt build and plugrt run an engine using the op."""
    started = time.perf_counter()
    package = tmp_path / "plugrt-soft-clip"
    assert main(["new-plugin", "soft-clip", "--op", "SoftClip", "--dest", str(package)]) == 0
    assert "created plugrt-soft-clip (com.soft_clip::SoftClip, pointwise)" in capsys.readouterr().out
    assert sorted(p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file()) == POINTWISE_FILES
    entry_points = tomllib.loads((package / "pyproject.toml").read_text())["project"]["entry-points"]
    assert entry_points == {"plugrt.plugins": {"plugrt-soft-clip": "plugrt_soft_clip"}}

    python = _fresh_environment(tmp_path / "venv")
    _install(python, package)
    outside = subprocess.run([sys.executable, "-c", "import plugrt_soft_clip"], capture_output=True, env=_env())
    assert outside.returncode != 0, "the plugin leaked out of the fresh environment"
    _run_its_tests(python, package)

    plugins = _run([python, "-m", "plugrt", "plugins"], cwd=tmp_path).stdout
    assert "plugrt-soft-clip  (plugrt-soft-clip 0.1.0)" in plugins and "com.soft_clip::SoftClip" in plugins
    _chain_model(tmp_path / "model.onnx")
    x = np.linspace(-4, 4, 12, dtype=np.float32).reshape(4, 3)
    np.savez(tmp_path / "x.npz", x=x)
    _run([python, "-m", "plugrt", "build", "model.onnx", "-o", "model.plan", "--min-shapes", "x:1x3",
          "--opt-shapes", "x:2x3", "--max-shapes", "x:4x3", "--no-progress"], cwd=tmp_path)
    _run([python, "-m", "plugrt", "run", "model.plan", "--inputs", "x.npz", "--save", "y.npz"], cwd=tmp_path)
    with np.load(tmp_path / "y.npz") as saved:
        y = saved["y"]
    np.testing.assert_allclose(y, np.maximum(0.5 * x / (1 + np.abs(x)), 0), rtol=1e-6, atol=1e-7)
    inspect = _run([python, "-m", "plugrt", "inspect", "model.plan"], cwd=tmp_path).stdout
    assert re.search(r"plugrt-soft-clip +plugrt-soft-clip 0\.1\.0: com\.soft_clip::SoftClip \(op version 1\)", inspect)
    elapsed = time.perf_counter() - started
    print(f"scaffold -> install -> tests -> engine: {elapsed:.1f} s")
    assert elapsed < 120


def test_custom_kind_installs_and_passes_its_tests(tmp_path, capsys):
    """--kind custom: explicit @cuda.jit kernels and a workspace, no pointwise function."""
    package = tmp_path / "plugrt-row-center"
    assert main(["new-plugin", "row_center", "--op", "RowCenter", "--kind", "custom", "--domain", "org.test",
                 "--dest", str(package)]) == 0
    op_source = (package / "src/plugrt_row_center/op.py").read_text()
    assert 'domain = "org.test"' in op_source and "def pointwise" not in op_source
    assert "workspace_bytes=need" in (package / "src/plugrt_row_center/kernels.py").read_text()
    python = _fresh_environment(tmp_path / "venv")
    _install(python, package)
    _run_its_tests(python, package)


def test_tactic_kind_contributes_to_an_installed_op_and_passes_its_tests(tmp_path, capsys):
    """--kind tactic: no op, a provider of more tactics for the built-in Sigmoid; installed
    into a fresh environment, its tests (the conformance kit among them) pass."""
    package = tmp_path / "plugrt-fast-sigmoid"
    assert main(["new-plugin", "fast-sigmoid", "--op", "Sigmoid", "--kind", "tactic", "--dest", str(package)]) == 0
    assert "created plugrt-fast-sigmoid (Sigmoid, tactic)" in capsys.readouterr().out
    files = sorted(p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file())
    assert files == ["README.md", "pyproject.toml", "src/plugrt_fast_sigmoid/__init__.py",
                     "src/plugrt_fast_sigmoid/tactics.py", "tests/test_sigmoid.py"]
    source = (package / "src/plugrt_fast_sigmoid/tactics.py").read_text()
    assert 'domain = ""' in source and 'op_type = "Sigmoid"' in source
    python = _fresh_environment(tmp_path / "venv")
    _install(python, package)
    _run_its_tests(python, package)
    plugins = _run([python, "-m", "plugrt", "plugins"], cwd=tmp_path).stdout
    assert "tactics for Sigmoid: grid_stride_t512, grid_stride_t128" in plugins


@pytest.mark.parametrize("args, message", [
    (["t", "--op", "NoSuchOp", "--kind", "tactic"], "no installed plugin provides op NoSuchOp"),
    (["t", "--op", "MatMul", "--kind", "tactic"], "is not a one-input pointwise op on float32"),
])
def test_tactic_kind_needs_an_installed_pointwise_op(tmp_path, capsys, args, message):
    assert main(["new-plugin", *args, "--dest", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_rendered_kernels_compile_for_a_gpu(tmp_path):
    """The simulator never types kernels: compile both kinds' kernels for sm_90, and keep
    float64 out of the float32 ones."""
    from cuda_typing import compile_kernels

    render_plugin(plugin_spec("typing-p", "TypingP"), tmp_path / "p")
    render_plugin(plugin_spec("typing-c", "TypingC", kind="custom"), tmp_path / "c")
    render_plugin(plugin_spec("typing-t", "Relu", domain="ai.onnx", kind="tactic"), tmp_path / "t")
    pointwise, custom, tactic = (tmp_path / kind / "src" for kind in "pct")
    failures = compile_kernels(f"""
        import sys
        sys.path[:0] = [{str(pointwise)!r}, {str(custom)!r}, {str(tactic)!r}]
        from plugrt_typing_p import kernels as pk
        from plugrt_typing_c import kernels as ck
        from plugrt_typing_t import tactics as tk
        fn = pk.scalar_function(np.dtype(np.float32), 0.5)
        check("tactic grid_stride", tk._kernel(fn), [arr(np.float32), arr(np.float32)], f64_free=True)
        for dt in (np.float32, np.float64):
            fn = pk.scalar_function(np.dtype(dt), 0.5)
            check(f"direct {{dt.__name__}}", pk._direct_kernel(fn), [arr(dt), arr(dt)], f64_free=dt is np.float32)
            row_means, center = ck._kernels(ck.compute_type(dt))
            check(f"row_means {{dt.__name__}}", row_means, [arr(dt), arr(dt), I64, I64], f64_free=dt is np.float32)
            check(f"center {{dt.__name__}}", center, [arr(dt), arr(dt), arr(dt), scalar(dt), I64],
                  f64_free=dt is np.float32)
    """)
    assert not failures, failures


# ------------------------------------------------------------------------------ names and validation


def test_names_are_derived_from_few_answers():
    spec = plugin_spec("Soft_Clip", "SoftClip")
    assert (spec.distribution, spec.module, spec.domain, spec.op_snake) == \
        ("plugrt-soft-clip", "plugrt_soft_clip", "com.soft_clip", "soft_clip")
    assert plugin_spec("plugrt-fft", "STFTMagnitude").distribution == "plugrt-fft"
    assert plugin_spec("plugrt-fft", "STFTMagnitude").op_snake == "stft_magnitude"
    standard = plugin_spec("hardmax", "Hardmax2", domain="ai.onnx")
    assert standard.domain == "" and standard.qualified_op == "Hardmax2"
    assert standard.context()["model_opset"] == 17 and spec.context()["model_opset"] == 1


@pytest.mark.parametrize("args, message", [
    (["1abc", "--op", "Foo"], "plugin name '1abc' is not valid"),
    (["soft clip", "--op", "Foo"], "plugin name 'soft clip' is not valid"),
    (["a--b", "--op", "Foo"], "plugin name 'a--b' is not valid"),
    (["plugrt", "--op", "Foo"], "the core's own distribution"),
    (["good", "--op", "9Lives"], "--op '9Lives' is not a valid op type"),
    (["good", "--op", "class"], "--op 'class' is not a valid op type"),
    (["good", "--op", "Soft-Clip"], "--op 'Soft-Clip' is not a valid op type"),
    (["good", "--op", "OpPlugin"], "would shadow a name"),
    (["good", "--op", "Foo", "--domain", "com..x"], "--domain 'com..x' is not a valid ONNX domain"),
    (["good", "--op", "Foo", "--domain", "plugrt.fused"], "plugrt's own"),
    (["good", "--op", "Relu", "--domain", "ai.onnx"], "op Relu is already provided by plugin 'builtin-activation'"),
])
def test_bad_answers_fail_cleanly_and_write_nothing(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["new-plugin", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plugrt: error: ") and message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_cli_error_has_no_traceback_in_a_subprocess(tmp_path):
    result = subprocess.run([sys.executable, "-m", "plugrt", "new-plugin", "x y", "--op", "Foo"], cwd=tmp_path,
                            capture_output=True, text=True, env=_env())
    assert result.returncode == 2 and result.stderr.startswith("plugrt: error: plugin name 'x y'")
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


def test_destination_must_be_new_or_empty(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for dest, message in [(taken, "exists and is not empty"), (a_file, "is a file"),
                          (tmp_path / "missing" / "x", "does not exist; create it first")]:
        assert main(["new-plugin", "good", "--op", "Good", "--dest", str(dest)]) == 2
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "taken"]
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["new-plugin", "good", "--op", "Good", "--dest", str(empty)]) == 0
    assert (empty / "pyproject.toml").is_file()


def test_default_destination_is_the_distribution_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["new-plugin", "good", "--op", "Good"]) == 0
    assert (tmp_path / "plugrt-good" / "src" / "plugrt_good" / "op.py").is_file()


def test_a_template_that_fails_to_render_leaves_nothing(tmp_path, monkeypatch):
    broken = tmp_path / "template"
    (broken / "src").mkdir(parents=True)
    (broken / "README.md.j2").write_text("# {{ distribution }}\n")
    (broken / "src" / "op.py.j2").write_text("{{ no_such_variable }}\n")
    monkeypatch.setattr("plugrt.scaffold.template_root", lambda: broken)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PlugrtError, match=r"src/op\.py\.j2 does not render \(UndefinedError"):
        render_plugin(plugin_spec("good", "Good"), out / "plugrt-good")
    assert list(out.iterdir()) == []


def test_the_template_ships_in_the_wheel():
    """Every template file is package data of plugrt.plugin_template, so `plugrt new-plugin`
    works from a non-editable install (an editable one would hide a gap)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = config["tool"]["setuptools"]
    assert setuptools["package-dir"]["plugrt.plugin_template"] == "plugin_template"
    assert "plugrt.plugin_template" in setuptools["packages"]
    assert "jinja2" in " ".join(config["project"]["dependencies"]).lower()
    patterns = setuptools["package-data"]["plugrt.plugin_template"]
    package = ROOT / "plugin_template"
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    files = {p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".py"}
    assert files and files <= shipped, sorted(str(p) for p in files - shipped)
    assert template_root().is_dir()
