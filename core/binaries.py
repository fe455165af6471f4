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

import functools
import hashlib
import logging
import os
import threading
import types
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
#: (launch key, argument types, id(kernel), device id) -> (kernel, CUfunction): a launch
#: resolved before, without hashing its full key again (a new shape's specialization
#: prepares hundreds of launches of kernels already loaded).
_resolved: dict[tuple, tuple] = {}
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
    memo = (key, argtypes, id(kernel), device)
    with _lock:
        known = _resolved.get(memo)
        if known is not None and known[0] is kernel:
            _stats["loaded"] += 1
            return known[1]
    full = full_key(key, argtypes, arch, kernel)
    with _lock:
        found = _functions.get((full, device))
        if found is not None:
            _stats["loaded"] += 1
            _by_key.setdefault(key, set()).add(full)
            _resolved[memo] = (kernel, found)
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
        _resolved[memo] = (kernel, handle)
        _stats[source] += 1
        return handle


def full_key(key: str, argtypes: tuple, arch: str, kernel=None) -> str:
    """The name of one compiled kernel: ``key`` at ``argtypes`` on ``arch`` (``"sm_90a"``)
    with this process's Numba, for ``kernel`` (its Python function and its options)."""
    text = "\n".join([key, str(tuple(argtypes)), arch, _numba_versions(), kernel_identity(kernel)])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def kernel_identity(kernel) -> str:
    """The kernel's code, spelled the same in every process: its Python function (module,
    qualified name, bytecode and constants, closure values and the globals it reads,
    device functions and generated code followed inside) and its compile options. Two
    launches whose kernels share this spelling run the same code whatever their shapes
    (what lets one compiled kernel serve every shape of a profile); any value a kernel
    factory baked in (a tile size, a flag, a shape) makes it differ."""
    if kernel is None:
        return ""
    with _lock:
        found = _identities.get(id(kernel))
        if found is not None and found[0] is kernel:
            return found[1]
    func = getattr(kernel, "py_func", None)
    options = getattr(kernel, "targetoptions", {}) or {}
    text = "|".join([_spell(func if func is not None else kernel, 0, set()),
                     _spell({str(k): v for k, v in options.items()}, 0, set())])
    with _lock:
        _identities[id(kernel)] = (kernel, text)
    return text


#: id(kernel) -> (kernel, identity): kernels live as long as the process's launches.
_identities: dict[int, tuple] = {}
#: How deep :func:`_spell` follows objects inside objects.
SPELL_DEPTH = 8


def _spell(value, depth: int, seen: set) -> str:
    """A spelling of ``value`` that is the same in every process and differs where the
    code a kernel compiles to could: simple values as they are, containers and objects
    item by item, functions by code, closure and the globals they read (never a ``repr``
    that shows an address)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if isinstance(value, np.generic):
        return f"{value.dtype.str}:{value.item()!r}"
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return f"array({data.dtype.str},{data.shape},{hashlib.sha256(data.tobytes()).hexdigest()})"
    if isinstance(value, (types.ModuleType, type)):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value.__name__)}"
    if isinstance(value, np.dtype):
        return f"dtype({value.str})"
    if depth > SPELL_DEPTH or id(value) in seen:
        return f"<{type(value).__qualname__}>"
    seen = seen | {id(value)}
    deeper = depth + 1
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [_spell(v, deeper, seen) for v in value]
        return "(" + ",".join(sorted(items) if isinstance(value, (set, frozenset)) else items) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_spell(value[k], deeper, seen)}" for k in sorted(value, key=str)) + "}"
    inner = getattr(value, "py_func", value)  # a Numba kernel or device function: its Python function
    if isinstance(inner, types.FunctionType):
        return _spell_function(inner, deeper, seen)
    if isinstance(value, types.CodeType):
        return _spell_code(value, deeper, seen)
    if type(value).__module__.startswith("numba"):  # Numba types and the like: their own stable names
        return f"{type(value).__qualname__}:{value}"
    fields = getattr(value, "__dict__", None)
    slots = getattr(type(value), "__slots__", ())
    if fields is None and slots:
        fields = {name: getattr(value, name, None) for name in ([slots] if isinstance(slots, str) else slots)}
    name = f"{type(value).__module__}.{type(value).__qualname__}"
    return name if not fields else f"{name}{_spell(dict(fields), deeper, seen)}"


def _spell_function(func, depth: int, seen: set) -> str:
    parts = [f"{func.__module__}.{func.__qualname__}", _spell_code(func.__code__, depth, seen)]
    for cell in func.__closure__ or ():
        try:
            parts.append(_spell(cell.cell_contents, depth, seen))
        except ValueError:  # an empty cell
            parts.append("<empty>")
    names = _global_names(func.__code__)
    parts += [f"{n}={_spell(func.__globals__[n], depth, seen)}" for n in sorted(names) if n in func.__globals__]
    return "fn(" + "|".join(parts) + ")"


def _spell_code(code, depth: int, seen: set) -> str:
    consts = ",".join(_spell(c, depth, seen) for c in code.co_consts)
    digest = hashlib.sha256(code.co_code + consts.encode("utf-8") + " ".join(code.co_names).encode()).hexdigest()
    return f"code({code.co_name},{digest[:32]})"


def _global_names(code) -> set[str]:
    """The global names ``code`` and the functions nested in it read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


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
        _resolved.clear()
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


@functools.cache
def _numba_versions() -> str:
    """(Read once: ``importlib.metadata`` scans the installed distributions each call.)"""
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
