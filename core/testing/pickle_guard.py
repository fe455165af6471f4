"""Catching pickle: while a :class:`PickleGuard` is active, pickle's entry points raise
and are recorded; :func:`find_pickles` looks for pickle streams smuggled into data.

Plans hold JSON and raw arrays, never pickles (a pickle runs code when loaded). The guard
patches ``pickle.dump/dumps/load/loads/Pickler/Unpickler``, the same names of ``_pickle``,
and ``cloudpickle``/``dill`` when they are imported. Calls made on behalf of Numba's or
llvmlite's own machinery (its compiler may pickle internally) pass through untouched.
Outside an active guard the stand-ins behave as the originals (a module imported while
the guard was on keeps working). Code that bound a pickle function before the guard started (``from pickle import dumps``
at import) escapes the patch; :func:`find_pickles` still catches what it produced when it
reaches a plan or ``serialize`` data.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import importlib
import sys
import threading
from dataclasses import dataclass

import numpy as np

from plugrt.errors import PlugrtError

_FUNCTIONS = ("dump", "dumps", "load", "loads")
_CLASSES = ("Pickler", "Unpickler")
_MODULES = ("pickle", "_pickle", "cloudpickle", "dill")
#: Callers inside these packages are the JIT compiler's business, not the plugin's.
_EXEMPT_PACKAGES = ("numba", "llvmlite")


class PickleForbidden(PlugrtError):
    """Raised by a pickle entry point while the conformance kit watches."""


@dataclass(frozen=True)
class PickleUse:
    """One call of a pickle entry point: which, during what, and from where."""

    function: str
    phase: str
    location: str

    def __str__(self) -> str:
        return f"{self.function} called during {self.phase} from {self.location}"


_lock = threading.RLock()
_active: list["PickleGuard"] = []
_saved: dict[tuple[str, str], object] = {}


class PickleGuard:
    """Context manager forbidding pickle; ``uses`` lists every attempt, ``phase`` labels them."""

    def __init__(self):
        self.uses: list[PickleUse] = []
        self.phase = "setup"

    def __enter__(self) -> "PickleGuard":
        with _lock:
            if not _active:
                _patch()
            _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            _active.remove(self)
            if not _active:
                _restore()

    @contextlib.contextmanager
    def during(self, phase: str):
        """Label the uses recorded inside the block (``"serialize()"``, ``"plan save"``)."""
        previous, self.phase = self.phase, phase
        try:
            yield self
        finally:
            self.phase = previous


def _record(qualified: str, frame) -> None:
    location = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
    with _lock:
        guard = _active[-1] if _active else None
    phase = guard.phase if guard is not None else "?"
    if guard is not None:
        guard.uses.append(PickleUse(qualified, phase, location))
    raise PickleForbidden(f"{qualified} is forbidden in plugrt plugins ({phase}, called from {location}): plan "
                          "files hold JSON and raw arrays only; return JSON-safe data from serialize() and "
                          "NumPy arrays for bulk data")


def _exempt(frame) -> bool:
    while frame is not None:
        name = frame.f_globals.get("__name__", "") or ""
        if name.split(".", 1)[0] in _EXEMPT_PACKAGES:
            return True
        frame = frame.f_back
    return False


def _forbidden_function(qualified: str, original):
    def forbidden(*args, **kwargs):
        frame = sys._getframe(1)
        if not _active or _exempt(frame):
            return original(*args, **kwargs)
        _record(qualified, frame)

    forbidden.__name__ = getattr(original, "__name__", qualified)
    forbidden.__doc__ = f"{qualified}, forbidden by the plugrt conformance kit."
    return forbidden


def _forbidden_class(qualified: str, original):
    # A subclass, not a stand-in: a class that subclasses it while the guard is on (a module
    # imported lazily) stays a working pickler once the guard is off.
    class Forbidden(original):
        def __init__(self, *args, **kwargs):
            frame = sys._getframe(1)
            if _active and not _exempt(frame):
                _record(qualified, frame)
            super().__init__(*args, **kwargs)

    Forbidden.__name__ = Forbidden.__qualname__ = getattr(original, "__name__", qualified)
    Forbidden.__module__ = getattr(original, "__module__", qualified)
    return Forbidden


def _patch() -> None:
    for module_name in _MODULES:
        module = sys.modules.get(module_name)
        if module is None and module_name in ("pickle", "_pickle"):
            module = importlib.import_module(module_name)
        if module is None:
            continue
        for attr in _FUNCTIONS + _CLASSES:
            original = getattr(module, attr, None)
            if original is None:
                continue
            _saved[(module_name, attr)] = original
            qualified = f"{module_name}.{attr}"
            make = _forbidden_class if attr in _CLASSES else _forbidden_function
            setattr(module, attr, make(qualified, original))


def _restore() -> None:
    for (module_name, attr), original in _saved.items():
        setattr(sys.modules[module_name], attr, original)
    _saved.clear()


# ---------------------------------------------------------------------- finding pickle streams


def is_pickle_stream(data: bytes) -> bool:
    """True for bytes that look like a pickle of protocol 2 or later: the PROTO opcode
    (0x80, then the protocol 2..5) first and the STOP opcode (``.``) last."""
    data = bytes(data).rstrip(b"\0")
    return len(data) >= 3 and data[0] == 0x80 and 2 <= data[1] <= 5 and data[-1:] == b"."


def _string_payloads(text: str):
    """The bytes a string might carry: latin-1 text, base64, hex."""
    try:
        yield text.encode("latin-1")
    except UnicodeEncodeError:
        pass
    stripped = text.strip()
    if len(stripped) >= 8:
        try:
            yield base64.b64decode(stripped, validate=True)
        except (binascii.Error, ValueError):
            pass
        try:
            yield bytes.fromhex(stripped)
        except ValueError:
            pass


def find_pickles(value, path: str = "") -> list[str]:
    """Where ``value`` (JSON-like data, bytes or arrays, nested) holds a pickle stream."""
    found: list[str] = []
    if isinstance(value, (bytes, bytearray, memoryview)):
        if is_pickle_stream(bytes(value)):
            found.append(path or "<value>")
    elif isinstance(value, str):
        if any(is_pickle_stream(payload) for payload in _string_payloads(value)):
            found.append(path or "<value>")
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in "uiSV" and value.dtype.itemsize == 1 or value.dtype.kind in "SV":
            if is_pickle_stream(np.ascontiguousarray(value).tobytes()):
                found.append(path or "<array>")
    elif isinstance(value, dict):
        for key, item in value.items():
            found += find_pickles(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        if value and len(value) >= 3 and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 256
                                             for v in value):
            if is_pickle_stream(bytes(value)):
                found.append(path or "<list>")
                return found
        for index, item in enumerate(value):
            found += find_pickles(item, f"{path}[{index}]")
    return found


def plan_pickles(blob: bytes) -> list[str]:
    """Pickle streams in plan bytes: a pickle instead of a plan, or in its header or arrays."""
    from plugrt.engine.plan_file import decode_plan

    if is_pickle_stream(blob):
        return ["the file is a pickle"]
    try:
        header, arrays = decode_plan(blob)
    except PlugrtError as exc:
        return [f"unreadable ({exc})"]
    return [f"header {where}" for where in find_pickles(header)] + \
           [f"array {where}" for where in find_pickles(arrays)]
