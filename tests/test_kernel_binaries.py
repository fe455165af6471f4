"""The kernel store and the persistent kernel cache (plugrt.binaries, plugrt.kernel_cache).

Nothing is compiled in the simulator, so the store's device steps (compile with Numba,
load a cubin) are replaced by fakes here and its lookup order, counts and cache files are
what is tested; the real compile and load run in tests/test_plan_kernels.py on a GPU.
"""

from __future__ import annotations

import dataclasses

import logging
import os
from collections import Counter

import numpy as np
import pytest

from plugrt import binaries, kernel_cache
from plugrt.kernel_cache import KernelBinary

KEY = "ab" * 32
ARCH = "sm_90a"


def _kernel_body(x):
    return x


class FakeKernel:
    """What the store reads of a Numba kernel: its Python function and options."""

    def __init__(self, func=_kernel_body, **options):
        self.py_func = func
        self.targetoptions = options


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The store on a fake sm_90a device, with a kernel cache in ``tmp_path/cache``;
    ``store.compiled`` lists the kernels the fake Numba compiled."""
    compiled = []

    def compile_(kernel, argtypes):
        compiled.append((kernel, argtypes))
        return KernelBinary("entry_fn", ARCH, b"\x7fELF" + bytes(range(60)) * (len(compiled)), b".version 8.0")

    for name, empty in (("_functions", {}), ("_modules", []), ("_binaries", {}), ("_supplied", {}),
                        ("_by_key", {}), ("_stats", Counter())):
        monkeypatch.setattr(binaries, name, empty)  # the process's real store is left alone (on a GPU)
    monkeypatch.setattr(binaries, "_device", lambda: (0, ARCH))
    monkeypatch.setattr(binaries, "current_arch", lambda: ARCH)
    monkeypatch.setattr(binaries, "_compile", compile_)
    monkeypatch.setattr(binaries, "_load", lambda binary: ("CUfunction", binary.entry, binary.cubin))
    monkeypatch.setattr(binaries, "_numba_function", lambda kernel, argtypes: ("numba", argtypes))
    kernel_cache.configure(str(tmp_path / "cache"))
    binaries.compiled = compiled
    try:
        yield binaries
    finally:
        kernel_cache.configure(True)
        del binaries.compiled


def cache_files(tmp_path) -> list[str]:
    folder = tmp_path / "cache"
    return sorted(os.listdir(folder)) if folder.exists() else []


# ---------------------------------------------------------------------- the store


def test_a_kernel_is_compiled_once_then_loaded_from_the_process_then_from_the_cache(store, tmp_path):
    kernel, argtypes = FakeKernel(), ("float32[:]", "int64")
    first = store.function(kernel, argtypes, "layer/0")
    assert store.stats() == {"compiled": 1, "from_cache": 0, "from_plan": 0, "loaded": 0}
    assert store.function(kernel, argtypes, "layer/0") == first
    assert store.stats()["loaded"] == 1 and len(store.compiled) == 1
    full = store.full_key("layer/0", argtypes, ARCH, kernel)
    assert cache_files(tmp_path) == [full + ".kernel"]

    store.clear()  # a fresh process, as far as the store knows
    assert store.function(kernel, argtypes, "layer/0") == first
    assert store.stats() == {"compiled": 0, "from_cache": 1, "from_plan": 0, "loaded": 0}
    assert len(store.compiled) == 1


def test_a_plan_supplied_kernel_comes_before_the_cache_and_numba(store):
    kernel, argtypes = FakeKernel(), ("float32[:]",)
    full = store.full_key("layer/0", argtypes, ARCH, kernel)
    supplied = KernelBinary("from_the_plan", ARCH, b"plan cubin", b"")
    store.supply({full: supplied}, ARCH, "'m.plan'")
    assert store.function(kernel, argtypes, "layer/0") == ("CUfunction", "from_the_plan", b"plan cubin")
    assert store.stats()["from_plan"] == 1 and not store.compiled
    assert store.binaries_for(["layer/0"]) == {full: supplied}


def test_what_the_builder_collects_is_what_launch_keys_resolved_to(store):
    kernel = FakeKernel()
    store.function(kernel, ("float32[:]",), "a/0")
    store.function(kernel, ("float64[:]",), "a/0")  # another specialization's argument types
    store.function(kernel, ("float32[:]",), "b/0")
    assert len(store.binaries_for(["a/0"])) == 2
    assert len(store.binaries_for(["a/0", "b/0"])) == 3
    assert store.binaries_for(["never/0"]) == {}


def test_no_key_means_numba_compiles_and_nothing_is_cached(store, tmp_path):
    assert store.function(FakeKernel(), ("int32",), None) == ("numba", ("int32",))
    assert store.stats()["compiled"] == 1 and not store.compiled and cache_files(tmp_path) == []


def test_a_kernel_numba_must_set_up_is_not_cached(store, tmp_path, monkeypatch):
    monkeypatch.setattr(binaries, "_compile", lambda kernel, argtypes: None)
    assert store.function(FakeKernel(), ("int32",), "k/0") == ("numba", ("int32",))
    assert cache_files(tmp_path) == []


def test_a_plan_for_another_architecture_warns_once_naming_both(store, caplog):
    binary = KernelBinary("e", "sm_80", b"cubin", b"")
    with caplog.at_level(logging.WARNING, "plugrt.kernels"):
        store.supply({"1" * 64: binary, "2" * 64: binary}, "sm_80", "'m.plan'")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "sm_80" in warnings[0] and ARCH in warnings[0] and "'m.plan'" in warnings[0]
    assert store.binaries_for(["1" * 64]) == {}


def test_a_supplied_binary_that_does_not_load_is_compiled_again(store, monkeypatch, caplog):
    from plugrt.errors import PlugrtError

    kernel, argtypes = FakeKernel(), ("int32",)
    full = store.full_key("k/0", argtypes, ARCH, kernel)
    store.supply({full: KernelBinary("e", ARCH, b"bad", b"")}, ARCH)

    def load(binary):
        if binary.cubin == b"bad":
            raise PlugrtError("cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE")
        return ("CUfunction", binary.entry, binary.cubin)

    monkeypatch.setattr(binaries, "_load", load)
    with caplog.at_level(logging.WARNING, "plugrt.kernels"):
        assert store.function(kernel, argtypes, "k/0")[1] == "entry_fn"
    assert store.stats()["compiled"] == 1 and "INVALID_IMAGE" in caplog.text


def test_full_keys_name_argument_types_architecture_and_the_kernel():
    kernel = FakeKernel()
    base = binaries.full_key("k/0", ("float32[:]",), ARCH, kernel)
    assert base == binaries.full_key("k/0", ("float32[:]",), ARCH, FakeKernel())
    others = {
        binaries.full_key("k/1", ("float32[:]",), ARCH, kernel),
        binaries.full_key("k/0", ("float64[:]",), ARCH, kernel),
        binaries.full_key("k/0", ("float32[:]",), "sm_80", kernel),
        binaries.full_key("k/0", ("float32[:]",), ARCH, FakeKernel(lambda x: x)),
        binaries.full_key("k/0", ("float32[:]",), ARCH, FakeKernel(fastmath=True)),
    }
    assert base not in others and len(others) == 5


def test_kernel_identity_sees_closure_values_and_never_an_address():
    def factory(tile, table):
        def body(x):
            return x + tile + table[0]
        return body

    one, other = factory(np.int32(16), np.arange(3)), factory(np.int32(32), np.arange(3))
    assert binaries.kernel_identity(FakeKernel(one)) != binaries.kernel_identity(FakeKernel(other))
    assert "0x" not in binaries.kernel_identity(FakeKernel(factory(object(), [object()])))


def test_kernel_identity_follows_device_functions_generated_code_and_globals():
    """What a kernel factory bakes in, however deep: a device function's closure, the
    constants of code made from text, a global the kernel reads, an object's fields."""
    def device(step):
        def add(x):
            return x + step
        return add

    def kernel_of(fn):
        def body(x):
            return fn(x)
        return body

    def generated(size):
        namespace = {}
        exec(f"def body(x):\n    return x * {size}\n", namespace)
        return namespace["body"]

    def reads_global(value):
        namespace = {"SCALE": value}
        exec("def body(x):\n    return x * SCALE\n", namespace)
        return namespace["body"]

    @dataclasses.dataclass
    class Geometry:
        rows: int

    def holding(geometry):
        def body(x):
            return x + geometry.rows
        return body

    for make, a, b in [(lambda v: kernel_of(device(v)), 1, 2), (generated, 64, 128), (reads_global, 2.0, 3.0),
                       (lambda v: holding(Geometry(v)), 16, 17)]:
        same = binaries.kernel_identity(FakeKernel(make(a)))
        assert same == binaries.kernel_identity(FakeKernel(make(a)))
        assert same != binaries.kernel_identity(FakeKernel(make(b))), make


def test_cubins_are_taken_as_numba_returns_them(tmp_path):
    class ObjectCode:  # what cuda.core's linker returns
        def __init__(self, code):
            self.code = code

    assert binaries._code_bytes(ObjectCode(b"\x7fELF")) == b"\x7fELF"
    assert binaries._code_bytes(b"\x7fELF") == b"\x7fELF"
    path = tmp_path / "k.cubin"
    path.write_bytes(b"\x7fELF on disk")
    assert binaries._code_bytes(ObjectCode(str(path))) == b"\x7fELF on disk"


def test_architecture_names_follow_numba():
    assert binaries.arch_name((9, 0)) == "sm_90a"
    assert binaries.arch_name((9, 0, "a")) == "sm_90a"
    assert binaries.arch_name((8, 6)) == "sm_86"
    assert binaries.arch_name((8, 0, "")) == "sm_80"


# ---------------------------------------------------------------------- the cache files


def test_cache_file_round_trip():
    binary = KernelBinary("_Z6kernel", ARCH, b"\x7fELF cubin bytes", b".version 8.0\n.target sm_90a")
    assert kernel_cache.decode(kernel_cache.encode(KEY, binary), KEY, ARCH) == binary
    assert b"pickle" not in kernel_cache.encode(KEY, binary)


@pytest.mark.parametrize("damage, why", [
    (lambda d: d[:len(d) - 5], "truncated"),
    (lambda d: d[:10], "truncated"),
    (lambda d: d[:-3] + bytes([d[-3] ^ 1]) + d[-2:], "checksum mismatch"),
    (lambda d: b"NOTAKERN" + d[8:], "bad magic"),
    (lambda d: d[:8] + b"\x07" + d[9:], "format version 7"),
    (lambda d: d[:17] + b"\xff" + d[18:], "unreadable header"),
    (lambda d: b"", "truncated"),
])
def test_damaged_cache_files_are_refused_with_a_reason(damage, why):
    data = kernel_cache.encode(KEY, KernelBinary("e", ARCH, b"cubin" * 10, b"ptx"))
    with pytest.raises(ValueError, match=why):
        kernel_cache.decode(damage(data), KEY, ARCH)


def test_a_file_of_another_kernel_or_architecture_is_refused():
    data = kernel_cache.encode(KEY, KernelBinary("e", ARCH, b"cubin", b""))
    with pytest.raises(ValueError, match="another kernel"):
        kernel_cache.decode(data, "cd" * 32, ARCH)
    with pytest.raises(ValueError, match="sm_90a, not sm_80"):
        kernel_cache.decode(data, KEY, "sm_80")


def test_a_corrupt_cache_file_is_ignored_once_recompiled_and_overwritten(store, tmp_path, caplog):
    kernel, argtypes = FakeKernel(), ("int32",)
    store.function(kernel, argtypes, "k/0")
    path = tmp_path / "cache" / (store.full_key("k/0", argtypes, ARCH, kernel) + ".kernel")
    good = path.read_bytes()
    path.write_bytes(good[:len(good) // 2])
    store.clear()
    with caplog.at_level(logging.WARNING, "plugrt.kernels"):
        store.function(kernel, argtypes, "k/0")
    assert [r.levelname for r in caplog.records] == ["WARNING"] and str(path) in caplog.text
    assert "truncated" in caplog.text
    assert store.stats()["compiled"] == 1
    assert kernel_cache.decode(path.read_bytes(), path.stem, ARCH).entry == "entry_fn"  # rewritten whole


def test_cache_files_are_written_atomically(tmp_path, monkeypatch):
    folder = str(tmp_path / "cache")
    old = KernelBinary("old", ARCH, b"old cubin", b"")
    assert kernel_cache.write(KEY, old, folder)

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    kernel_cache.write(KEY, KernelBinary("new", ARCH, b"new cubin", b""), folder)
    assert os.listdir(folder) == [KEY + ".kernel"]  # no temporary file left behind
    assert kernel_cache.read(KEY, ARCH, folder) == old


def test_an_unwritable_cache_warns_once_and_the_build_goes_on(store, tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's parent should be")
    kernel_cache.configure(str(blocker / "kernels"))
    with caplog.at_level(logging.WARNING, "plugrt.kernels"):
        for index in range(3):
            store.function(FakeKernel(), ("int32",), f"k/{index}")
    assert store.stats()["compiled"] == 3
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "cannot be written" in warnings[0] and "PLUGRT_KERNEL_CACHE" in warnings[0]


def test_the_cache_directory_comes_from_the_environment(monkeypatch, tmp_path):
    kernel_cache.configure(True)
    monkeypatch.delenv("PLUGRT_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.directory() == str(tmp_path / "plugrt" / "kernels")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert kernel_cache.directory() == os.path.expanduser("~/.cache/plugrt/kernels")
    monkeypatch.setenv("PLUGRT_KERNEL_CACHE", str(tmp_path / "k"))
    assert kernel_cache.directory() == str(tmp_path / "k")
    for off in ("0", "off", "", "OFF"):
        monkeypatch.setenv("PLUGRT_KERNEL_CACHE", off)
        assert kernel_cache.directory() is None
        assert kernel_cache.read(KEY, ARCH) is None
        assert not kernel_cache.write(KEY, KernelBinary("e", ARCH, b"c", b""))
    try:
        kernel_cache.configure(str(tmp_path / "chosen"))
        assert kernel_cache.directory() == str(tmp_path / "chosen")
        kernel_cache.configure(None)
        assert kernel_cache.directory() is None
    finally:
        kernel_cache.configure(True)
