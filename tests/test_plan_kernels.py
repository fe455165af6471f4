"""Compiled kernels inside plans (plugrt.engine.plan_kernels): the ``kernels`` section
round-trips under the checksum, a malformed one is refused, a plan without one loads.
The GPU tests at the end load a plan in a fresh process with an empty kernel cache (no
kernel compiled) and build twice with one cache (the second compiles none)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from fuzz_plan_targets import MODELS, feed
from test_fuzz_plans import join_plan, split_plan
from test_plan_validation import REBUILD, edited, refused

from plugrt import PlanError, binaries, cli_options
from plugrt.device import simulated
from plugrt.engine import Builder, Engine, plan_kernels
from plugrt.engine.plan_file import decode_plan
from plugrt.kernel_cache import KernelBinary

ARCH = "sm_90a"
CUBIN_A = b"\x7fELF" + b"cubin A" * 20
CUBIN_B = b"\x7fELF" + b"cubin B" * 20
KERNELS = {
    "1" * 64: KernelBinary("relu_kernel", ARCH, CUBIN_A, b".version 8.0 // A"),
    "2" * 64: KernelBinary("relu_kernel", ARCH, CUBIN_A, b".version 8.0 // A"),  # the same code again
    "3" * 64: KernelBinary("other_kernel", ARCH, CUBIN_B, b""),
}


def _engine(which: int = 0):
    model, profile_shapes, _ = MODELS[which]()
    builder = Builder()
    config = builder.create_builder_config()
    config.optimization_level, config.progress = 0, False
    if profile_shapes:
        profile = builder.create_optimization_profile()
        profile.set_shape("x", *profile_shapes)
        config.add_optimization_profile(profile)
    return builder.build_engine(model, config)


@pytest.fixture(scope="module")
def plan() -> bytes:
    """The Relu plan carrying :data:`KERNELS`, as a GPU build would write it."""
    patch = pytest.MonkeyPatch()
    patch.setattr(plan_kernels, "collect", lambda engine: plan_kernels.encode(KERNELS, ARCH))
    try:
        return _engine().serialize()
    finally:
        patch.undo()


@pytest.fixture
def supplied(monkeypatch):
    """What loading hands the kernel store: ``[(binaries, arch, label)]``."""
    calls = []
    monkeypatch.setattr(binaries, "supply", lambda found, arch, label="": calls.append((found, arch, label)))
    return calls


def test_a_plan_carries_its_kernels_once_each_under_the_checksum(plan, supplied):
    header, arrays = decode_plan(plan)
    section = header["kernels"]
    assert section["arch"] == ARCH and set(section["functions"]) == set(KERNELS)
    kernel_arrays = sorted(name for name in arrays if name.startswith("kernel/"))
    assert len(kernel_arrays) == 4  # cubin A, PTX A, cubin B, the empty PTX: identical code stored once
    entry = section["functions"]["1" * 64]
    same = section["functions"]["2" * 64]
    assert (entry["cubin"], entry["ptx"]) == (same["cubin"], same["ptx"]) and entry["check"] != same["check"]
    assert entry["cubin"] == "kernel/" + hashlib.sha256(CUBIN_A).hexdigest()
    assert arrays[entry["cubin"]].tobytes() == CUBIN_A

    Engine.deserialize(plan, label="'m.plan'")
    assert supplied == [(KERNELS, ARCH, "'m.plan'")]

    at = plan.index(CUBIN_B)
    damaged = plan[:at + 9] + bytes([plan[at + 9] ^ 1]) + plan[at + 10:]
    with pytest.raises(PlanError, match="checksum mismatch"):
        Engine.deserialize(damaged)


def test_a_simulator_plan_has_an_empty_section_and_plans_without_one_still_load(supplied, monkeypatch):
    engine = _engine()
    plan = engine.serialize()
    header, arrays = decode_plan(plan)
    if simulated():
        assert header["kernels"] == {"arch": None, "functions": {}}
        assert not [name for name in arrays if name.startswith("kernel/")]
    else:
        assert header["kernels"]["arch"] == binaries.current_arch() and header["kernels"]["functions"]
    # An older plugrt's plan: no section, no kernel arrays (a GPU plan's section alone
    # removed leaves arrays nothing uses, which is refused).
    with monkeypatch.context() as patch:
        patch.setattr(plan_kernels, "collect", lambda engine: ({"arch": None, "functions": {}}, {}))
        older = edited(engine.serialize(), lambda h: h.pop("kernels"))
    engine = Engine.deserialize(older)
    x = feed((2, 3))
    assert np.array_equal(engine.create_execution_context().execute({"x": x})["y"], np.maximum(x, 0))
    assert supplied == []


def _function(h, key="1" * 64):
    return h["kernels"]["functions"][key]


@pytest.mark.parametrize("edit, field, expected", [
    (lambda h: h.update(kernels=None), "kernels", "an object"),
    (lambda h: h.update(kernels=[]), "kernels", "an object"),
    (lambda h: h["kernels"].pop("arch"), "kernels.arch", "missing"),
    (lambda h: h["kernels"].update(arch="gfx90a"), "kernels.arch", "such as 'sm_90a'"),
    (lambda h: h["kernels"].update(arch=None), "kernels.arch", "such as 'sm_90a'"),
    (lambda h: h["kernels"].update(arch=90), "kernels.arch", "such as 'sm_90a'"),
    (lambda h: h["kernels"].update(functions=[]), "kernels.functions", "an object"),
    (lambda h: h["kernels"].update(extra=1), "kernels.extra", "absent"),
    (lambda h: h["kernels"]["functions"].update(xyz=_function(h)), "kernels.functions['xyz']", "64 hexadecimal"),
    (lambda h: _function(h).pop("entry"), "kernels.functions['1111", "missing"),
    (lambda h: _function(h).update(entry=""), ".entry", "a non-empty string"),
    (lambda h: _function(h).update(flags=0), ".flags", "absent"),
    (lambda h: _function(h).update(cubin="init/w"), ".cubin", "'kernel/SHA256' array"),
    (lambda h: _function(h).update(cubin="kernel/" + "0" * 64), ".cubin", "'kernel/SHA256' array"),
    (lambda h: _function(h).update(ptx=7), ".ptx", "'kernel/SHA256' array"),
    (lambda h: _function(h, "3" * 64).update(cubin=_function(h, "3" * 64)["ptx"]), ".cubin", "non-empty"),
    (lambda h: h["kernels"]["functions"].pop("3" * 64), "arrays", "is not"),
    (lambda h: _function(h).pop("check"), ".check", "missing"),
    (lambda h: _function(h).update(entry="other_kernel"), ".check", "copied or edited under another key"),
    (lambda h: h["kernels"]["functions"].update({"1" * 64: _function(h, "3" * 64)}), "kernels.functions['1111",
     "copied or edited under another key"),
])
def test_a_malformed_kernels_section_is_refused(plan, edit, field, expected):
    message = refused(edited(plan, edit), field, expected, REBUILD)
    assert "plan 'm.plan'" in message


def test_kernel_arrays_must_be_bytes(plan):
    def edit(h):
        name = _function(h, "3" * 64)["cubin"]
        entry = next(e for e in h["arrays"] if e["name"] == name)
        entry["dtype"] = "|i1"

    refused(edited(plan, edit), "kernels.functions['3333", "uint8", REBUILD)


def test_kernel_arrays_hold_the_bytes_their_names_say(plan):
    def edit(h):
        a, b = (next(e for e in h["arrays"] if e["name"] == _function(h, key)["cubin"]) for key in ("1" * 64, "3" * 64))
        assert a["nbytes"] == b["nbytes"]
        a["offset"], b["offset"] = b["offset"], a["offset"]

    refused(edited(plan, edit), ".cubin", "sha256 is its name", REBUILD)


def test_kernel_arrays_may_not_double_as_weights(plan):
    head, header, blob = split_plan(plan)
    name = _function(header)["cubin"]
    header["graph"]["initializers"].append(name[len("kernel/"):])
    refused(join_plan(head, header, blob), "graph.initializers", REBUILD)


# ---------------------------------------------------------------------- the command line


def test_build_options_choose_the_kernel_cache(tmp_path, monkeypatch):
    from plugrt import kernel_cache
    from plugrt.cli import _parser

    monkeypatch.setenv("PLUGRT_KERNEL_CACHE", str(tmp_path / "env"))
    parse = _parser().parse_args
    try:
        args = parse(["build", "m.onnx", "-o", "m.plan", "--kernel-cache", str(tmp_path / "mine")])
        cli_options.use_kernel_cache(args)
        assert kernel_cache.directory() == str(tmp_path / "mine")
        cli_options.use_kernel_cache(parse(["build", "m.onnx", "-o", "m.plan", "--no-kernel-cache"]))
        assert kernel_cache.directory() is None
        (tmp_path / "file").write_text("x")
        with pytest.raises(Exception, match="is a file, not a folder"):
            cli_options.use_kernel_cache(parse(["build", "m", "-o", "p", "--kernel-cache",
                                                           str(tmp_path / "file")]))
        with pytest.raises(SystemExit):
            parse(["build", "m.onnx", "-o", "m.plan", "--kernel-cache", "d", "--no-kernel-cache"])
    finally:
        kernel_cache.configure(True)
    assert kernel_cache.directory() == str(tmp_path / "env")


def test_the_build_reports_kernels_on_a_gpu_only():
    report = cli_options.kernel_report
    stats = {"compiled": 3, "from_cache": 40, "from_plan": 0, "loaded": 9}
    assert report(stats, simulated=False) == "kernels: 3 compiled, 40 from the kernel cache"
    assert report(stats, simulated=True) is None


# ---------------------------------------------------------------------- on a GPU

gpu = pytest.mark.skipif(simulated(), reason="kernels are compiled and loaded only on a GPU")
TESTS = pathlib.Path(__file__).resolve().parent

_LOAD_AND_RUN = """
import json, sys
import numpy as np
from plugrt import binaries
from plugrt.engine import Engine
engine = Engine.load(sys.argv[1])
out = engine.create_execution_context().execute({"x": np.load(sys.argv[2])})["y"]
np.save(sys.argv[3], out)
print(json.dumps(binaries.stats()))
"""


def _fresh(args: list, cache, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PLUGRT_KERNEL_CACHE=str(cache))
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env,
                            cwd=str(TESTS), **kwargs)
    assert result.returncode == 0, result.stderr
    return result


@gpu
def test_a_plan_loads_in_a_fresh_process_without_compiling(tmp_path):
    engine = _engine(1)  # Conv + Relu: a fused layer
    path = str(tmp_path / "m.plan")
    engine.save(path)
    header, arrays = decode_plan(pathlib.Path(path).read_bytes())
    assert header["kernels"]["arch"] == binaries.current_arch() and header["kernels"]["functions"]
    x = feed(MODELS[1]()[2])
    expected = engine.create_execution_context().execute({"x": x})["y"]
    np.save(tmp_path / "x.npy", x)
    empty = tmp_path / "empty-cache"
    result = _fresh(["-c", _LOAD_AND_RUN, path, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], empty)
    stats = json.loads(result.stdout.strip().splitlines()[-1])
    assert stats["compiled"] == 0 and stats["from_cache"] == 0, stats
    assert stats["from_plan"] == len(header["kernels"]["functions"]), stats
    assert np.array_equal(np.load(tmp_path / "y.npy"), expected)
    assert not empty.exists() or not os.listdir(empty)


@gpu
def test_a_second_build_with_the_kernel_cache_compiles_nothing(tmp_path):
    import onnx

    model = tmp_path / "m.onnx"
    onnx.save(MODELS[1]()[0], str(model))
    cache = tmp_path / "cache"
    build = ["-m", "plugrt", "build", str(model), "-o", str(tmp_path / "m.plan"), "--no-progress", "--force"]
    first = _fresh(build, cache).stdout
    assert "kernels: " in first and " 0 compiled" not in first, first
    assert os.listdir(cache)
    second = _fresh(build, cache).stdout
    assert "kernels: 0 compiled" in second, second
