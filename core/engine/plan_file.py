"""The plan file container: magic, format version, JSON header, raw arrays, checksum.

Layout (little-endian)::

    b"PLUGRTPL"  u32 format version  u64 header length  header (UTF-8 JSON)
    padding to 64  arrays, each 64-byte aligned  sha256 of everything before (32 bytes)

No pickle anywhere: the header is JSON and arrays are raw bytes described in the header
(name, dtype, shape, offset, nbytes), checked on reading (:mod:`plugrt.engine.plan_schema`):
each array lies, aligned, inside the data region and apart from the others. Files are
written atomically (temporary file in the same folder, fsync, rename), so a crash never
leaves a half-written plan.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from typing import Mapping

import numpy as np

from plugrt.engine.plan_schema import check_array_table, check_depth
from plugrt.errors import PlanError
from plugrt.files import write_atomically

MAGIC = b"PLUGRTPL"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIQ")
_ALIGN = 64
_DIGEST = 32
#: Format versions above this are no newer plugrt's but damage (a flipped high bit).
_NEWEST_PLAUSIBLE = 1000


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
    """Parse and verify plan bytes; :class:`PlanError` names the file on any problem.

    The checksum is verified before any field is read, so a damaged version or length
    reads as corruption; then the array table is checked (:mod:`plugrt.engine.plan_schema`)
    before any array is copied out.
    """
    if len(data) < _PREFIX.size + _DIGEST:
        raise PlanError(f"plan {label} is truncated ({len(data)} bytes); rebuild it")
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise PlanError(f"{label} is not a plugrt plan file (bad magic bytes)")
    payload, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(payload).digest() != digest:
        raise PlanError(f"plan {label} is corrupted or truncated (checksum mismatch); rebuild it")
    if version > FORMAT_VERSION and version < _NEWEST_PLAUSIBLE:
        raise PlanError(f"plan {label} has format version {version}, written by a newer plugrt; this plugrt "
                        f"reads versions 1..{FORMAT_VERSION}: upgrade plugrt, or rebuild the plan with this one")
    if not 1 <= version <= FORMAT_VERSION:
        raise PlanError(f"plan {label} has format version {version}, which no plugrt writes (valid: "
                        f"1..{FORMAT_VERSION}); the file is damaged: rebuild it")
    start = _PREFIX.size
    if header_len > len(payload) - start:
        raise PlanError(f"plan {label}: its header length {header_len} runs past the end of the file; rebuild it")
    try:
        header = json.loads(payload[start:start + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise PlanError(f"plan {label} has an unreadable header: {exc}; rebuild it") from None
    check_depth(header, label)
    if not isinstance(header, dict):
        raise PlanError(f"plan {label}: its header must be a JSON object, got {type(header).__name__}; rebuild it")
    blob_start = start + header_len + _pad(start + header_len)
    if blob_start > len(payload):
        raise PlanError(f"plan {label}: its header padding runs past the end of the file; rebuild it")
    table = check_array_table(header.pop("arrays", None), label, len(payload) - blob_start)
    arrays = {}
    for entry in table:
        dtype, count = np.dtype(entry["dtype"]), math.prod(entry["shape"])
        if not count:
            arrays[entry["name"]] = np.zeros(entry["shape"], dtype)
            continue
        array = np.frombuffer(payload, dtype=dtype, count=count, offset=blob_start + entry["offset"])
        arrays[entry["name"]] = array.reshape(entry["shape"]).copy()
    return header, arrays


def write_plan(path: str, header: Mapping, arrays: Mapping[str, np.ndarray]) -> None:
    """Write a plan file atomically: readers see the old file or the whole new one."""
    write_atomically(path, encode_plan(header, arrays))


def read_plan(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    if not os.path.isfile(path):
        raise PlanError(f"plan file {path!r} does not exist")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise PlanError(f"plan file {path!r} cannot be read: {exc.strerror or exc}") from None
    return decode_plan(data, repr(path))
