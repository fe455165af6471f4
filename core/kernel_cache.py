"""The persistent kernel cache: compiled kernels that outlive a process, one file each.

A kernel compiled by Numba is written here under its full key (:mod:`plugrt.binaries`),
so that a second build of a model, or a plan loaded on a GPU of another architecture a
second time, compiles nothing. The directory is ``$PLUGRT_KERNEL_CACHE`` when set (``0``,
``off`` or an empty value turn the cache off), else ``$XDG_CACHE_HOME/plugrt/kernels``,
else ``~/.cache/plugrt/kernels``; :func:`configure` overrides both (``plugrt build
--kernel-cache DIR`` / ``--no-kernel-cache``). Deleting the directory clears it.

One file, ``KEY.kernel``, per kernel (little-endian; no pickle)::

    b"PLUGRTKC"  u32 format version  u32 header length  header (UTF-8 JSON)  cubin  PTX

The header names the full key, the entry point, the architecture, the two sizes, the
plugrt version and the sha256 of cubin + PTX. A file that is damaged, truncated or made
for another key or architecture is ignored with one warning (the kernel is compiled again
and the file rewritten). Files are written atomically; a cache directory that cannot be
written is reported once and the build goes on without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
from dataclasses import dataclass

from plugrt import __version__
from plugrt.files import write_atomically

log = logging.getLogger("plugrt.kernels")

MAGIC = b"PLUGRTKC"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")
#: A header longer than this is damage, not a header.
_MAX_HEADER = 1 << 16
ENVIRONMENT = "PLUGRT_KERNEL_CACHE"
_OFF = ("", "0", "off")
SUFFIX = ".kernel"


@dataclass(frozen=True)
class KernelBinary:
    """One compiled kernel: its entry point, the architecture its cubin is for, the cubin
    and the PTX it was assembled from (UTF-8; empty when Numba kept none)."""

    entry: str
    arch: str
    cubin: bytes
    ptx: bytes = b""


_lock = threading.Lock()
_override: list = []  # [path or None] once configure() was called
_unwritable: set[str] = set()
_unreadable: set[str] = set()


def configure(path: str | None | bool) -> None:
    """Use ``path`` as the cache directory; ``None`` or ``False`` turns the cache off;
    ``True`` goes back to the environment's choice."""
    with _lock:
        _override.clear()
        if path is not True:
            _override.append(os.path.abspath(os.path.expanduser(path)) if path else None)


def directory() -> str | None:
    """The cache directory in use, or ``None`` when the cache is off."""
    with _lock:
        if _override:
            return _override[0]
    value = os.environ.get(ENVIRONMENT)
    if value is not None:
        return None if value.strip().lower() in _OFF else os.path.abspath(os.path.expanduser(value))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "plugrt", "kernels")


def path_of(folder: str, key: str) -> str:
    return os.path.join(folder, key + SUFFIX)


# ---------------------------------------------------------------------- the file format


def encode(key: str, binary: KernelBinary) -> bytes:
    """The cache file of ``binary`` under ``key``."""
    payload = binary.cubin + binary.ptx
    header = {"key": key, "entry": binary.entry, "arch": binary.arch, "cubin_bytes": len(binary.cubin),
              "ptx_bytes": len(binary.ptx), "plugrt_version": __version__,
              "sha256": hashlib.sha256(payload).hexdigest()}
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(text)) + text + payload


def decode(data: bytes, key: str, arch: str) -> KernelBinary:
    """The kernel a cache file holds; :class:`ValueError` saying why when the file is not
    a whole, undamaged cache file of kernel ``key`` for ``arch``."""
    if len(data) < _PREFIX.size:
        raise ValueError(f"truncated ({len(data)} bytes)")
    magic, version, length = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a plugrt kernel cache file (bad magic bytes)")
    if version != FORMAT_VERSION:
        raise ValueError(f"format version {version}, this plugrt reads {FORMAT_VERSION}")
    if length > _MAX_HEADER or _PREFIX.size + length > len(data):
        raise ValueError("truncated or damaged header")
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + length].decode("utf-8"))
        entry, found_key, found_arch = header["entry"], header["key"], header["arch"]
        sizes = int(header["cubin_bytes"]), int(header["ptx_bytes"])
        digest = header["sha256"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable header ({type(exc).__name__})") from None
    if found_key != key:
        raise ValueError("it holds another kernel (its key differs from its name)")
    if found_arch != arch:
        raise ValueError(f"it holds a kernel for {found_arch}, not {arch}")
    if not isinstance(entry, str) or not entry or min(sizes) < 0:
        raise ValueError("damaged header")
    payload = data[_PREFIX.size + length:]
    if len(payload) != sum(sizes) or not sizes[0]:
        raise ValueError(f"truncated ({len(payload)} bytes of kernel code, the header says {sum(sizes)})")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ValueError("checksum mismatch")
    return KernelBinary(entry, arch, bytes(payload[:sizes[0]]), bytes(payload[sizes[0]:]))


# ---------------------------------------------------------------------- reading and writing


def read(key: str, arch: str, folder: str | None = None) -> KernelBinary | None:
    """The cached kernel ``key`` for ``arch``, or ``None`` (not cached, cache off, or a bad
    file, reported once: the caller compiles and :func:`write` replaces it)."""
    folder = folder if folder is not None else directory()
    if folder is None:
        return None
    path = path_of(folder, key)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        with _lock:
            first = folder not in _unreadable
            _unreadable.add(folder)
        if first:
            log.warning("kernel cache %s cannot be read (%s): kernels are compiled", folder, exc.strerror or exc)
        return None
    try:
        return decode(data, key, arch)
    except ValueError as exc:
        log.warning("kernel cache file %s is ignored: %s; compiling the kernel again and rewriting it", path, exc)
        return None


def write(key: str, binary: KernelBinary, folder: str | None = None) -> bool:
    """Store ``binary`` under ``key``; ``False`` (warned once per directory) when the cache
    is off or cannot be written."""
    folder = folder if folder is not None else directory()
    if folder is None or folder in _unwritable:
        return False
    try:
        os.makedirs(folder, exist_ok=True)
        write_atomically(path_of(folder, key), encode(key, binary))
        return True
    except OSError as exc:
        with _lock:
            first = folder not in _unwritable
            _unwritable.add(folder)
        if first:
            log.warning("kernel cache %s cannot be written (%s): kernels compiled now are not kept for the next "
                        "build; set %s to a writable folder, or turn the cache off with %s=off",
                        folder, exc.strerror or exc, ENVIRONMENT, ENVIRONMENT)
        return False


__all__ = ["KernelBinary", "configure", "decode", "directory", "encode", "read", "write"]
