"""The plan file container: magic, format version, JSON header, raw arrays, checksum.

Layout (little-endian)::

    b"PLUGRTPL"  u32 format version  u64 header length  header (UTF-8 JSON)
    padding to 64  arrays, each 64-byte aligned  sha256 of everything before (32 bytes)

No pickle anywhere: the header is JSON and arrays are raw bytes described in the header
(name, dtype, shape, offset, nbytes). Files are written atomically (temporary file in the
same folder, fsync, rename), so a crash never leaves a half-written plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Mapping

import numpy as np

from plugrt.errors import PlanError
from plugrt.files import write_atomically

MAGIC = b"PLUGRTPL"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIQ")
_ALIGN = 64
_DIGEST = 32


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def encode_plan(header: Mapping, arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialize a header and named arrays to plan bytes."""
    table, blobs, offset = [], [], 0
    for name, array in arrays.items():
        shape = list(np.shape(array))  # before ascontiguousarray, which makes 0-d arrays 1-d
        array = np.ascontiguousarray(array)
        if array.dtype.hasobject:
            raise PlanError(f"array {name!r} has dtype {array.dtype}, which a plan cannot store")
        data = array.tobytes()
        table.append({"name": name, "dtype": array.dtype.str, "shape": shape,
                      "offset": offset, "nbytes": len(data)})
        blobs.append(data + b"\0" * _pad(len(data)))
        offset += len(data) + _pad(len(data))
    body = dict(header)
    body["arrays"] = table
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(text)) + text
    head += b"\0" * _pad(len(head))
    payload = head + b"".join(blobs)
    return payload + hashlib.sha256(payload).digest()


def decode_plan(data: bytes, label: str = "<bytes>") -> tuple[dict, dict[str, np.ndarray]]:
    """Parse and verify plan bytes; :class:`PlanError` names the file on any problem."""
    if len(data) < _PREFIX.size + _DIGEST:
        raise PlanError(f"plan {label} is truncated ({len(data)} bytes); rebuild it")
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise PlanError(f"{label} is not a plugrt plan file (bad magic bytes)")
    if version > FORMAT_VERSION:
        raise PlanError(f"plan {label} has format version {version}; this plugrt reads up to {FORMAT_VERSION}: upgrade plugrt")
    payload, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(payload).digest() != digest:
        raise PlanError(f"plan {label} is corrupted or truncated (checksum mismatch); rebuild it")
    start = _PREFIX.size
    try:
        header = json.loads(payload[start:start + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"plan {label} has an unreadable header: {exc}") from None
    blob_start = start + header_len + _pad(start + header_len)
    arrays = {}
    for entry in header.pop("arrays", []):
        begin = blob_start + entry["offset"]
        end = begin + entry["nbytes"]
        if end > len(payload):
            raise PlanError(f"plan {label}: array {entry['name']!r} runs past the end of the file")
        array = np.frombuffer(payload[begin:end], dtype=np.dtype(entry["dtype"])).reshape(entry["shape"])
        arrays[entry["name"]] = array.copy()
    return header, arrays


def write_plan(path: str, header: Mapping, arrays: Mapping[str, np.ndarray]) -> None:
    """Write a plan file atomically: readers see the old file or the whole new one."""
    write_atomically(path, encode_plan(header, arrays))


def read_plan(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    if not os.path.isfile(path):
        raise PlanError(f"plan file {path!r} does not exist")
    with open(path, "rb") as f:
        return decode_plan(f.read(), repr(path))
