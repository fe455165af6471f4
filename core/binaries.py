"""Compiled kernels: where a launch's CUDA function comes from.

:func:`function` turns a kernel and its argument types into a ``CUfunction``. With a
``key`` (a string naming the kernel's code exactly, :mod:`plugrt.tuning.kernel_keys`) the
kernel's *full key* is the sha256 of that key, the argument types, the GPU architecture,
the Numba versions and the kernel's own identity, and the function comes from the first
of:

1. a function already loaded in this process (``stats()["loaded"]``);
2. a binary a loaded plan supplied (:func:`supply`; ``"from_plan"``);
3. the persistent kernel cache (:mod:`plugrt.kernel_cache`; ``"from_cache"``);
4. Numba (NVVM, then the linker: seconds per kernel; ``"compiled"``), after which the
   binary goes to the kernel cache and stays in memory, so that a plan saved by this
   process carries it (:func:`binaries_for`).

Binaries are loaded with ``cuModuleLoadData`` and ``cuModuleGetFunction``; the modules
stay loaded until :func:`clear`. A launch without a key, or a kernel Numba must set up
when its module loads, is compiled and loaded by Numba, as before. Thread-safe.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import Counter

import numpy as np

from plugrt import kernel_cache
from plugrt.errors import PlugrtError
from plugrt.kernel_cache import KernelBinary

log = logging.getLogger("plugrt.kernels")

_lock = threading.RLock()
#: (full key, device id) -> CUfunction loaded in this process.
_functions: dict[tuple[str, int], object] = {}
#: CUmodule handles to unload on clear().
_modules: list = []
#: full key -> binary compiled or read here (what a plan saved by this process stores).
_binaries: dict[str, KernelBinary] = {}
#: full key -> binary a loaded plan supplied.
_supplied: dict[str, KernelBinary] = {}
#: launch key -> the full keys it was resolved to.
_by_key: dict[str, set[str]] = {}
_stats: Counter = Counter()
STATS = ("compiled", "from_cache", "from_plan", "loaded")


def function(kernel, argtypes: tuple, key: str | None = None):
    """The ``CUfunction`` that runs ``kernel`` for ``argtypes`` on the current device."""
    if key is None:
        with _lock:
            _stats["compiled"] += 1
            return _numba_function(kernel, argtypes)
    device, arch = _device()
    full = full_key(key, argtypes, arch, kernel)
    with _lock:
        found = _functions.get((full, device))
        if found is not None:
            _stats["loaded"] += 1
            _by_key.setdefault(key, set()).add(full)
            return found
        handle = None
        for source, binary in (("from_plan", _supplied.get(full)), ("loaded", _binaries.get(full)),
                               ("from_cache", None)):
            if source == "from_cache":
                binary = kernel_cache.read(full, arch)
            if binary is not None:
                handle = _load_or_warn(binary, source)
                if handle is not None:
                    break
        if handle is None:
            source, binary = "compiled", _compile(kernel, argtypes)
            if binary is None:  # Numba must set this kernel's module up: no binary to keep
                _stats["compiled"] += 1
                return _numba_function(kernel, argtypes)
            kernel_cache.write(full, binary)
            handle = _load(binary)
        _functions[(full, device)] = handle
        _binaries[full] = binary
        _by_key.setdefault(key, set()).add(full)
        _stats[source] += 1
        return handle


def full_key(key: str, argtypes: tuple, arch: str, kernel=None) -> str:
    """The name of one compiled kernel: ``key`` at ``argtypes`` on ``arch`` (``"sm_90a"``)
    with this process's Numba, for ``kernel`` (its Python function and its options)."""
    text = "\n".join([key, str(tuple(argtypes)), arch, _numba_versions(), kernel_identity(kernel)])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def kernel_identity(kernel) -> str:
    """The kernel's Python function (module, qualified name, simple closure values) and
    its compile options: two tactics' launches that share a key but not a kernel differ."""
    if kernel is None:
        return ""
    func = getattr(kernel, "py_func", None)
    parts = [str(getattr(func, "__module__", None) or "?"),
             str(getattr(func, "__qualname__", None) or type(kernel).__name__)]
    for cell in getattr(func, "__closure__", None) or ():
        try:
            parts.append(_simple(cell.cell_contents))
        except ValueError:  # an empty cell
            parts.append("<empty>")
    options = getattr(kernel, "targetoptions", {}) or {}
    parts.append(_simple({str(k): v for k, v in options.items()}))
    return "|".join(parts)


def _simple(value) -> str:
    """A spelling of ``value`` that is the same in every process: simple values as they
    are, containers item by item, anything else by its function's or type's name (never a
    ``repr`` that shows an address)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if isinstance(value, np.generic):
        return f"{value.dtype.str}:{value.item()!r}"
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return f"array({data.dtype.str},{data.shape},{hashlib.sha256(data.tobytes()).hexdigest()})"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_simple(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_simple(value[k])}" for k in sorted(value, key=str)) + "}"
    inner = getattr(value, "py_func", value)
    name = getattr(inner, "__qualname__", None) or type(value).__qualname__
    return f"{getattr(inner, '__module__', None) or type(value).__module__}.{name}"


# ---------------------------------------------------------------------- plans


def supply(binaries: dict[str, KernelBinary], arch: str | None, label: str = "a plan") -> None:
    """Make the kernels a plan carries (full key -> binary, compiled for ``arch``) available
    to :func:`function`; warn once when this GPU's architecture is another."""
    here = current_arch()
    if binaries and here is not None and arch != here:
        log.warning("plan %s carries kernels compiled for %s, but this GPU is %s: its kernels are compiled again "
                    "from the installed plugins (or taken from the kernel cache)", label, arch, here)
        return
    with _lock:
        _supplied.update(binaries)


def binaries_for(keys) -> dict[str, KernelBinary]:
    """full key -> binary of every kernel the launches of ``keys`` were resolved to here."""
    found = {}
    with _lock:
        for key in keys:
            for full in _by_key.get(key, ()):
                binary = _binaries.get(full) or _supplied.get(full)
                if binary is not None:
                    found[full] = binary
    return found


def stats() -> dict[str, int]:
    """How :func:`function` found kernels since the start (or :func:`clear`): ``compiled``
    by Numba, ``from_cache`` (the kernel cache), ``from_plan`` (a loaded plan), ``loaded``
    (a function this process had loaded already)."""
    with _lock:
        return {name: _stats[name] for name in STATS}


def clear() -> None:
    """Forget every binary and function, unload the modules and zero the counts (only when
    no prepared launch of this process will run again)."""
    with _lock:
        if _modules:
            from cuda.bindings import driver as drv

            for module in _modules:
                drv.cuModuleUnload(module)
        _modules.clear()
        _functions.clear()
        _binaries.clear()
        _supplied.clear()
        _by_key.clear()
        _stats.clear()


# ---------------------------------------------------------------------- the device


def current_arch() -> str | None:
    """This GPU's architecture as Numba compiles for it (``"sm_90a"``); ``None`` in the
    simulator."""
    from plugrt.device import simulated

    if simulated():
        return None
    return _device()[1]


def arch_name(cc) -> str:
    """``(9, 0, "a")`` or ``(8, 6)`` -> ``"sm_90a"``, ``"sm_86"`` (Numba's choice of suffix)."""
    major, minor = int(cc[0]), int(cc[1])
    suffix = cc[2] if len(cc) > 2 else ("a" if (major, minor) >= (9, 0) else "")
    return f"sm_{major}{minor}{suffix}"


def _device() -> tuple[int, str]:
    from numba import cuda

    device = cuda.current_context().device  # makes Numba's context current on this thread
    return int(device.id), arch_name(device.compute_capability)


def _numba_versions() -> str:
    from importlib import metadata

    found = []
    for name in ("numba", "numba-cuda"):
        try:
            found.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name}=?")
    return ",".join(found)


def _compile(kernel, argtypes) -> KernelBinary | None:
    """Compile with Numba; ``None`` when the kernel's module needs Numba's setup code, or
    when this Numba does not hand out the cubin (warned once: Numba then loads it)."""
    compiled = kernel.compile(argtypes)  # a kernel's own errors propagate
    library = compiled._codelibrary
    try:
        cc = library._ensure_cc(None)
        cubin = _code_bytes(library.get_cubin(cc))
        if library._setup_functions:
            return None
        ptx = b"" if getattr(library, "_lto", False) else library.get_asm_str(cc).encode("utf-8")
        return KernelBinary(library._entry_name, arch_name(cc), cubin, ptx)
    except Exception as exc:  # noqa: BLE001 - another Numba's internals: compile as before
        if not _warned:
            _warned.append(exc)
            log.warning("compiled kernels cannot be kept (%s: %s): plans carry no kernels and the kernel cache is "
                        "not used", type(exc).__name__, exc)
        return None


_warned: list = []


def _code_bytes(code) -> bytes:
    """The bytes of a cubin as Numba's linker returns it (``cuda.core`` ``ObjectCode``,
    or bytes)."""
    code = getattr(code, "code", code)
    if isinstance(code, (str, os.PathLike)):
        with open(code, "rb") as f:
            return f.read()
    return bytes(code)


def _load(binary: KernelBinary):
    from cuda.bindings import driver as drv

    err, module = drv.cuModuleLoadData(binary.cubin)
    _check(err, "cuModuleLoadData")
    _modules.append(module)
    err, handle = drv.cuModuleGetFunction(module, binary.entry.encode("utf-8"))
    _check(err, f"cuModuleGetFunction({binary.entry!r})")
    return handle


def _load_or_warn(binary: KernelBinary, source: str):
    try:
        return _load(binary)
    except PlugrtError as exc:
        log.warning("a kernel %s does not load (%s); compiling it again", source.replace("_", " "), exc)
        return None


def _numba_function(kernel, argtypes):
    from cuda.bindings import driver as drv

    compiled = kernel.compile(argtypes)
    cufunc = compiled._codelibrary.get_cufunc()
    err, handle = drv.cuKernelGetFunction(cufunc.handle)
    _check(err, "cuKernelGetFunction")
    return handle


def _check(err, what: str) -> None:
    from cuda.bindings import driver as drv

    if err != drv.CUresult.CUDA_SUCCESS:
        raise PlugrtError(f"{what} failed: {err}")


__all__ = ["KernelBinary", "arch_name", "binaries_for", "clear", "current_arch", "full_key", "function", "stats",
           "supply"]
