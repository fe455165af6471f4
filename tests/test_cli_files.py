"""The command line and the files it names: every bad path is one ``plugrt: error:`` line
naming it, exit status 2, no traceback, checked before the work starts; no command writes
over its own input, or without ``--force`` over a file of another kind; written files
honour the umask; a reader that closes the pipe early ends the command quietly."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

import plugrt.cli
import plugrt.engine
from plugrt.cli import main
from plugrt.engine.plan_file import MAGIC
from plugrt.paths import NPZ, ONNX, PLAN, PLAN_MAGIC, TIMING_CACHE, file_kind
from plugrt.testing import single_node_model
from plugrt.tuning import TimingCache

PLUGRT = [sys.executable, "-m", "plugrt"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A one-Relu model, its plan, and the other kinds of file a user may name by mistake."""
    folder = tmp_path_factory.mktemp("built")
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    (folder / "m.onnx").write_bytes(single_node_model("Relu", {"x": x}).SerializeToString())
    assert main(["build", str(folder / "m.onnx"), "-o", str(folder / "m.plan"), "--no-progress"]) == 0
    other = single_node_model("Relu", {"other": x})  # another input name
    (folder / "other.onnx").write_bytes(other.SerializeToString())
    np.savez(folder / "in.npz", x=x)
    np.save(folder / "x.npy", x)
    TimingCache({"L": {"t": 1.0}}).save(str(folder / "t.json"))
    (folder / "notes.txt").write_text("my notes\n")
    return folder


@pytest.fixture
def work(built, tmp_path, monkeypatch):
    """A fresh copy of the built files, as the current folder."""
    for path in built.iterdir():
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def no_build(monkeypatch):
    """Fail the test if a build starts: the checks must come before the work."""
    def build_engine(*args, **kwargs):
        raise AssertionError("the build started before the paths were checked")

    monkeypatch.setattr(plugrt.engine.Builder, "build_engine", build_engine)


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.lstat().st_mode)
            for p in sorted(folder.rglob("*"))}


def refused(argv, folder, capsys, *names) -> str:
    """Run ``plugrt ARGV`` and check it refuses: status 2, one error line naming ``names``,
    no traceback, no file in ``folder`` changed or added."""
    before = snapshot(folder)
    code = main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("plugrt: error:")]
    assert code == 2, err
    assert len(errors) == 1, err
    assert all(name in errors[0] for name in names), err
    assert "Traceback" not in err
    assert snapshot(folder) == before
    return errors[0]


# ---------------------------------------------------------------------------- build


def test_build_never_writes_over_its_model(work, capsys, no_build):
    line = refused(["build", "m.onnx", "-o", "m.onnx"], work, capsys, "'m.onnx'", "MODEL")
    assert "destroy" in line
    line = refused(["build", "m.onnx", "-o", "m.onnx", "--force"], work, capsys, "'m.onnx'")
    assert "even with --force" in line
    os.symlink("m.onnx", "link.onnx")
    os.link("m.onnx", "hard.onnx")
    refused(["build", "m.onnx", "-o", "link.onnx", "--force"], work, capsys, "link.onnx")
    refused(["build", "m.onnx", "-o", "hard.onnx", "--force"], work, capsys, "hard.onnx")


def test_build_output_folder_is_checked_before_the_build(work, capsys, no_build):
    refused(["build", "m.onnx", "-o", "missing_dir/x.plan"], work, capsys, "missing_dir", "mkdir -p")
    refused(["build", "m.onnx", "-o", "folder"], work, capsys, "'folder'", "is a folder")
    refused(["build", "m.onnx", "-o", ""], work, capsys, "-o is empty")
    refused(["build", "m.onnx", "-o", "x" * 300 + ".plan"], work, capsys, "longer than")


def test_build_refuses_a_file_of_another_kind_unless_forced(work, capsys):
    for victim in ("notes.txt", "in.npz", "other.onnx", "t.json"):
        line = refused(["build", "m.onnx", "-o", victim], work, capsys, victim, "--force")
        assert "not a plugrt plan file" in line
    assert main(["build", "m.onnx", "-o", "notes.txt", "--force", "--no-progress"]) == 0
    assert file_kind("notes.txt") == PLAN
    before = (work / "m.plan").stat().st_mtime_ns
    assert main(["build", "m.onnx", "-o", "m.plan", "--no-progress"]) == 0  # a rebuild replaces a plan
    assert (work / "m.plan").stat().st_mtime_ns >= before and file_kind("m.plan") == PLAN
    (work / "empty.plan").write_bytes(b"")
    assert main(["build", "m.onnx", "-o", "empty.plan", "--no-progress"]) == 0


def test_build_model_must_be_a_readable_model(work, capsys, no_build):
    line = refused(["build", "m.plan", "-o", "x.plan"], work, capsys, "'m.plan'", "not an ONNX model")
    assert "plugrt run" in line
    refused(["build", "missing.onnx", "-o", "x.plan"], work, capsys, "missing.onnx", "does not exist")
    refused(["build", "folder", "-o", "x.plan"], work, capsys, "'folder'", "is a folder")
    refused(["build", "in.npz", "-o", "x.plan"], work, capsys, "in.npz", "not an ONNX model")
    refused(["check", "m.plan"], work, capsys, "m.plan", "not an ONNX model")
    os.symlink("gone.onnx", "dangling.onnx")
    refused(["check", "dangling.onnx"], work, capsys, "dangling.onnx", "broken symbolic link")


def test_unreadable_input_is_a_clean_error(work, capsys, monkeypatch):
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path).endswith("m.onnx"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    refused(["check", "m.onnx"], work, capsys, "m.onnx", "cannot be read", "permissions")


def test_build_timing_cache_that_is_a_model_is_named_not_deleted(work, capsys, no_build):
    line = refused(["build", "m.onnx", "-o", "x.plan", "--timing-cache", "other.onnx"], work, capsys,
                   "other.onnx", "not a plugrt timing cache", "ONNX model")
    assert "delete" not in line
    line = refused(["build", "m.onnx", "-o", "x.plan", "--timing-cache", "m.onnx", "--force"], work, capsys, "m.onnx")
    assert "delete" not in line
    refused(["build", "m.onnx", "-o", "x.plan", "--timing-cache", "x.plan"], work, capsys, "x.plan", "both name")
    refused(["build", "m.onnx", "-o", "x.plan", "--timing-cache", "missing_dir/t.json"], work, capsys, "missing_dir")
    refused(["build", "m.onnx", "-o", "x.plan", "--timing-cache", "folder"], work, capsys, "folder")


def test_damaged_timing_cache_says_delete_it(work, capsys):
    text = (work / "t.json").read_text()
    (work / "t.json").write_text(text[: len(text) // 2])  # truncated
    line = refused(["timing-cache", "merge", "t.json", "-o", "out.json"], work, capsys, "t.json", "corrupt")
    assert "delete it" in line
    (work / "t.json").write_text(json.dumps({"format": "plugrt-timing-cache", "version": 99, "entries": {}}))
    assert "delete it" in refused(["timing-cache", "merge", "t.json", "-o", "out.json"], work, capsys, "t.json")


# ---------------------------------------------------------------------------- run and inspect


def test_run_inputs_must_be_an_npz(work, capsys):
    line = refused(["run", "m.plan", "--inputs", "x.npy"], work, capsys, "'x.npy'", "numpy.savez")
    assert ".npy array" in line
    refused(["run", "m.plan", "--inputs", "notes.txt"], work, capsys, "notes.txt", "numpy.savez")
    refused(["run", "m.plan", "--inputs", "missing.npz"], work, capsys, "missing.npz", "does not exist")
    refused(["run", "m.plan", "--inputs", "folder"], work, capsys, "folder", "is a folder")


def test_run_and_inspect_take_a_plan(work, capsys):
    line = refused(["run", "m.onnx"], work, capsys, "'m.onnx'", "not a plugrt plan file")
    assert "plugrt build m.onnx" in line
    refused(["inspect", "m.onnx"], work, capsys, "m.onnx", "not a plugrt plan file")
    refused(["inspect", "missing.plan"], work, capsys, "missing.plan", "does not exist")
    refused(["inspect", "in.npz"], work, capsys, "in.npz", "not a plugrt plan file")


def test_run_save_never_writes_over_an_input(work, capsys):
    for argv, name in ((["--save", "m.plan"], "m.plan"), (["--save", "m.plan", "--force"], "m.plan"),
                       (["--inputs", "in.npz", "--save", "in.npz", "--force"], "in.npz"),
                       (["--compare-onnxruntime", "m.onnx", "--save", "m.onnx", "--force"], "m.onnx")):
        refused(["run", "m.plan", *argv], work, capsys, name, "destroy")


def test_run_save_is_checked_before_the_run(work, capsys, monkeypatch):
    monkeypatch.setattr(plugrt.engine.Engine, "load", lambda *a, **k: pytest.fail("the run started"))
    refused(["run", "m.plan", "--save", "missing_dir/o.npz"], work, capsys, "missing_dir")
    refused(["run", "m.plan", "--save", "folder"], work, capsys, "'folder'", "is a folder")
    refused(["run", "m.plan", "--save", "other.onnx"], work, capsys, "other.onnx", "ONNX model", "--force")
    refused(["run", "m.plan", "--save", "notes.txt"], work, capsys, "notes.txt", "--force")


def test_run_save_replaces_an_npz_and_forced_other_kinds(work, capsys):
    assert main(["run", "m.plan", "--inputs", "in.npz", "--save", "out.npz"]) == 0
    assert main(["run", "m.plan", "--inputs", "in.npz", "--save", "out.npz"]) == 0
    assert main(["run", "m.plan", "--inputs", "in.npz", "--save", "notes.txt", "--force"]) == 0
    assert file_kind("out.npz") == NPZ and file_kind("notes.txt") == NPZ
    with np.load("out.npz") as data:
        assert np.array_equal(data["out0"], np.maximum(np.load("x.npy"), 0))


def test_compare_onnxruntime_with_another_model_names_the_mismatch(work, capsys):
    line = refused(["run", "m.plan", "--compare-onnxruntime", "other.onnx"], work, capsys, "other.onnx")
    assert "'other'" in line and "'x'" in line and "inputs" in line
    x = np.zeros((2, 3), np.float32)
    (work / "renamed.onnx").write_bytes(single_node_model("Relu", {"x": x}, n_outputs=1).SerializeToString()
                                        .replace(b"out0", b"zzz0"))
    line = refused(["run", "m.plan", "--compare-onnxruntime", "renamed.onnx"], work, capsys, "renamed.onnx")
    assert "'zzz0'" in line and "'out0'" in line and "outputs" in line
    refused(["run", "m.plan", "--compare-onnxruntime", "m.plan"], work, capsys, "m.plan", "not an ONNX model")
    refused(["run", "m.plan", "--compare-onnxruntime", "notes.txt"], work, capsys, "notes.txt",
            "onnxruntime cannot load")
    assert main(["run", "m.plan", "--compare-onnxruntime", "m.onnx"]) == 0
    assert "match" in capsys.readouterr().out


# ---------------------------------------------------------------------------- timing caches, new-plugin


def test_merge_refuses_to_overwrite_another_kind(work, capsys):
    refused(["timing-cache", "merge", "t.json", "-o", "m.onnx"], work, capsys, "m.onnx", "ONNX model", "--force")
    refused(["timing-cache", "merge", "t.json", "-o", "m.plan"], work, capsys, "m.plan", "plan", "--force")
    refused(["timing-cache", "merge", "t.json", "-o", "folder"], work, capsys, "folder")
    refused(["timing-cache", "merge", "t.json", "-o", "missing_dir/t.json"], work, capsys, "missing_dir")
    line = refused(["timing-cache", "merge", "m.onnx", "-o", "out.json"], work, capsys, "m.onnx", "ONNX model")
    assert "not a plugrt timing cache" in line and "delete" not in line
    assert main(["timing-cache", "merge", "t.json", "-o", "t.json"]) == 0  # merging into one of them loses nothing
    assert main(["timing-cache", "merge", "t.json", "-o", "notes.txt", "--force"]) == 0
    assert file_kind("notes.txt") == TIMING_CACHE


def test_new_plugin_dest_is_checked(work, capsys, monkeypatch):
    refused(["new-plugin", "soft-clip", "--op", "SoftClip", "--dest", "missing_dir/p"], work, capsys, "missing_dir")
    refused(["new-plugin", "soft-clip", "--op", "SoftClip", "--dest", "notes.txt"], work, capsys, "notes.txt")
    real_access = os.access
    locked = str(work / "folder")

    def access(path, mode, **kwargs):
        return False if str(path) == locked else real_access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)
    refused(["new-plugin", "soft-clip", "--op", "SoftClip", "--dest", "folder/p"], work, capsys, "folder/p",
            "not writable")
    refused(["build", "m.onnx", "-o", "folder/x.plan"], work, capsys, "folder/x.plan", "not writable")


def test_an_os_error_during_the_work_is_one_line(work, capsys, monkeypatch):
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr("plugrt.engine.plan_file.write_atomically", full)
    refused(["build", "m.onnx", "-o", "x.plan", "--no-progress"], work, capsys, "x.plan", "No space left")


# ---------------------------------------------------------------------------- modes, pipes, processes


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_written_files_honour_the_umask(work, capsys, mask, mode):
    old = os.umask(mask)
    try:
        assert main(["build", "m.onnx", "-o", "new.plan", "--no-progress"]) == 0
        assert main(["run", "new.plan", "--save", "new.npz"]) == 0
        assert main(["timing-cache", "merge", "t.json", "-o", "new.json"]) == 0
        assert main(["new-plugin", "soft-clip", "--op", "SoftClip", "--dest", "plugin"]) == 0
    finally:
        os.umask(old)
    for name in ("new.plan", "new.npz", "new.json", "plugin/pyproject.toml"):
        assert stat.S_IMODE(os.stat(name).st_mode) == mode, name
    assert stat.S_IMODE(os.stat("plugin").st_mode) == 0o777 & ~mask  # not always mkdtemp's 0o700


def test_plan_magic_is_the_plan_files():
    assert PLAN_MAGIC == MAGIC


def test_file_kinds(work):
    kinds = {"m.onnx": ONNX, "m.plan": PLAN, "in.npz": NPZ, "t.json": TIMING_CACHE, "x.npy": "an .npy array",
             "notes.txt": "a text file"}
    assert {name: file_kind(name) for name in kinds} == kinds
    (work / "long.txt").write_text("x" * 4095 + "é")  # a character cut by the 4096-byte look
    assert file_kind("long.txt") == "a text file"


def _child_env():
    return dict(os.environ, PLUGRT_DISABLE_PLUGIN_AUTOLOAD="1")


@pytest.mark.parametrize("argv", [["plugins"], ["plugins", "--json"], ["--help"]])
def test_a_closed_pipe_ends_quietly(argv):
    child = subprocess.Popen(PLUGRT + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env())
    child.stdout.close()  # the reader is gone before the first line
    err = child.stderr.read().decode()
    code = child.wait(timeout=120)
    assert code in (0, 141), err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err


def test_head_reads_a_little_and_closes(tmp_path):
    shell = f"{' '.join(PLUGRT)} plugins | head -c 10; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=_child_env(), timeout=120)
    assert done.returncode in (0, 141) and len(done.stdout) == 10
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_the_real_command_refuses_without_a_traceback(work):
    before = snapshot(work)
    for argv in (["build", "m.onnx", "-o", "m.onnx"], ["run", "m.plan", "--inputs", "x.npy"],
                 ["run", "m.plan", "--save", "missing_dir/o.npz"], ["timing-cache", "merge", "t.json", "-o", "m.onnx"]):
        done = subprocess.run(PLUGRT + argv, capture_output=True, text=True, env=_child_env(), timeout=120)
        errors = [line for line in done.stderr.splitlines() if line.startswith("plugrt: error:")]
        assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert snapshot(work) == before
