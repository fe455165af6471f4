"""The calibration cache: per-tensor INT8 ranges in TensorRT's text layout, keyed by model.

The file (UTF-8 text, ``\\n`` line ends)::

    cache   = header LF *(entry LF)
    header  = "plugrt-1-" algo [" percentile=" number] " model=" digest [" data=" digest]
    algo    = "EntropyCalibration2" / "MinMaxCalibration" / "PercentileCalibration"
              / "MseCalibration"
    number  = a Python float literal (``99.99``); present exactly when algo is Percentile
    digest  = 8 to 64 lowercase hex digits (the caller's hash of the model's bytes, or of
              the calibration batches: :func:`plugrt.quantization.data.dataset_hash`)
    entry   = name ": " 8HEXDIG

``1`` is the format's version, not plugrt's. A name is any non-empty text without a line
break, ": " included (TensorRT's ``(Unnamed Layer* 4) [Fully Connected]_output``); a line
splits at its last ": ". The 8 hex digits are the big-endian IEEE-754 float32 *scale*,
amax / 127, exactly TensorRT's encoding (``3c92aa10`` is 0.0179033577, amax 2.2737).
Blank lines are skipped.

A cache is refused, never silently reused, when its algorithm, percentile or model differs
from the build's (and its data, when both the cache and the build name their batches).
TensorRT's own caches (``TRT-<version>-<Algo>`` first line, e.g. ``TRT-8510-EntropyCalibration2``)
name no model: they are read only when the caller allows it, and say so
(:attr:`CalibrationCache.from_tensorrt`) so the caller can warn.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from dataclasses import dataclass

from plugrt.errors import PlugrtError
from plugrt.files import write_atomically
from plugrt.quantization.calibrators import ALGORITHMS, CACHE_NAMES, DEFAULT_PERCENTILE, INT8_MAX

FORMAT_VERSION = "1"
_PLUGRT_HEADER = re.compile(r"plugrt-(\d+)-([A-Za-z0-9]+)((?: [a-z]+=\S+)*)")
_TENSORRT_HEADER = re.compile(r"TRT-(\w+)-([A-Za-z0-9]+)")
_DIGEST = re.compile(r"[0-9a-f]{8,64}")
_SCALE = re.compile(r"[0-9a-fA-F]{8}")
_ENTRY_HELP = "each line after the first is 'tensor name: <8 hex digits>'"
_FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class CacheHeader:
    """A cache's first line. ``format`` is ``"plugrt"`` or ``"tensorrt"``; ``algorithm``
    the header's name for it (``EntropyCalibration2``); a TensorRT header has no hashes."""

    format: str
    version: str
    algorithm: str
    percentile: float | None = None
    model_hash: str | None = None
    data_hash: str | None = None

    def line(self) -> str:
        if self.format == "tensorrt":
            return f"TRT-{self.version}-{self.algorithm}"
        text = f"plugrt-{self.version}-{self.algorithm}"
        if self.percentile is not None:
            text += f" percentile={self.percentile!r}"
        text += f" model={self.model_hash}"
        if self.data_hash is not None:
            text += f" data={self.data_hash}"
        return text


@dataclass(frozen=True)
class CalibrationCache:
    """What :func:`read_cache` found: the header and ``{tensor: amax}`` in file order."""

    header: CacheHeader
    ranges: dict[str, float]

    @property
    def from_tensorrt(self) -> bool:
        """True for a TensorRT cache: nothing ties it to this model, so warn."""
        return self.header.format == "tensorrt"


def model_digest(model_bytes: bytes) -> str:
    """The model hash a cache header carries: the first 16 hex digits of sha256."""
    return hashlib.sha256(model_bytes).hexdigest()[:16]


def encode_scale(amax: float) -> str:
    """The 8 hex digits of a range: big-endian float32 bits of ``amax / 127``."""
    return struct.pack(">f", float(amax) / INT8_MAX).hex()


def decode_scale(digits: str) -> float:
    """The range (amax) of 8 hex digits: their big-endian float32 scale times 127."""
    return float(struct.unpack(">f", bytes.fromhex(digits))[0]) * INT8_MAX


def write_cache(path: str, algorithm: str, model_hash: str, ranges: dict[str, float], *,
                percentile: float = DEFAULT_PERCENTILE, data_hash: str | None = None) -> None:
    """Write ``{tensor: amax}`` calibrated by ``algorithm`` (one of ``ALGORITHMS``) for the
    model hashing to ``model_hash``, atomically. ``percentile`` is recorded only for the
    percentile algorithm; ``data_hash`` (optional) records the batches calibrated on."""
    header = CacheHeader("plugrt", FORMAT_VERSION, _cache_name(algorithm),
                         float(percentile) if algorithm == "percentile" else None,
                         _digest(model_hash, "model_hash"), None if data_hash is None else _digest(data_hash, "data_hash"))
    lines = [header.line()]
    for name, amax in ranges.items():
        if not isinstance(name, str) or not name or "\n" in name or "\r" in name:
            raise PlugrtError(f"calibration cache {path!r}: tensor name {name!r} cannot be written (it must be "
                              "non-empty text on one line); rename the tensor in the model")
        if not (math.isfinite(amax) and 0.0 <= amax / INT8_MAX <= _FLOAT32_MAX):
            raise PlugrtError(f"calibration cache {path!r}: tensor {name!r} has range {amax}, which is no INT8 range "
                              "(it must be finite and >= 0); check the calibration data for NaN or Inf")
        lines.append(f"{name}: {encode_scale(amax)}")
    write_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))


def read_cache(path: str, algorithm: str, model_hash: str, *, percentile: float = DEFAULT_PERCENTILE,
               data_hash: str | None = None, allow_tensorrt: bool = False) -> CalibrationCache:
    """The ranges of a cache written for this model and ``algorithm``; refuses (PlugrtError)
    one for another model, algorithm or percentile, for other batches (when ``data_hash`` is
    given and the cache names its batches), a TensorRT cache unless ``allow_tensorrt``, and
    malformed lines (naming the line)."""
    wanted = _cache_name(algorithm)
    lines = _read_lines(path)
    if not lines:
        raise PlugrtError(f"calibration cache {path!r} is empty; delete it and rebuild with calibration data")
    header = parse_header(path, lines[0])
    fix = "delete it (or name another cache file) and rebuild with calibration data"
    if header.algorithm != wanted:
        raise PlugrtError(f"calibration cache {path!r} holds {header.algorithm} ranges, but this build calibrates "
                          f"with {wanted} ({algorithm}); {fix}, or build with the cache's algorithm")
    if header.format == "tensorrt" and not allow_tensorrt:
        raise PlugrtError(f"calibration cache {path!r} is TensorRT's ({lines[0]}): it names no model, so nothing "
                          f"says its ranges belong to this one; allow TensorRT caches to use it anyway, or {fix}")
    if header.format == "plugrt":
        if header.model_hash != _digest(model_hash, "model_hash"):
            raise PlugrtError(f"calibration cache {path!r} was made for another model (model={header.model_hash}; "
                              f"this model is {model_hash.lower()}); {fix}")
        if wanted == CACHE_NAMES["percentile"] and header.percentile != float(percentile):
            raise PlugrtError(f"calibration cache {path!r} was calibrated at percentile {header.percentile}, this "
                              f"build asks for {float(percentile)!r}; {fix}, or build at percentile "
                              f"{header.percentile}")
        if data_hash is not None and header.data_hash is not None and header.data_hash != data_hash.lower():
            raise PlugrtError(f"calibration cache {path!r} was calibrated on other batches (data={header.data_hash}; "
                              f"these hash to {data_hash.lower()}); delete it to calibrate on these, or build "
                              "without calibration data to reuse it")
    return CalibrationCache(header, _parse_entries(path, lines))


def parse_header(path: str, line: str) -> CacheHeader:
    """The first line of a plugrt or TensorRT cache (see the module doc)."""
    trt = _TENSORRT_HEADER.fullmatch(line)
    if trt:
        return CacheHeader("tensorrt", trt.group(1), trt.group(2))
    match = _PLUGRT_HEADER.fullmatch(line)
    if not match:
        raise PlugrtError(f"calibration cache {path!r}, line 1: {line[:80]!r} is not a calibration cache header "
                          "('plugrt-1-<Algorithm> model=<hex>' or TensorRT's 'TRT-<version>-<Algorithm>'); "
                          "name the right file, or delete it and rebuild with calibration data")
    version, name, rest = match.groups()
    if version != FORMAT_VERSION:
        raise PlugrtError(f"calibration cache {path!r} has format version {version}; this plugrt reads version "
                          f"{FORMAT_VERSION}: delete it and rebuild with calibration data, or use the plugrt that "
                          "wrote it")
    if name not in CACHE_NAMES.values():
        raise PlugrtError(f"calibration cache {path!r}, line 1: unknown algorithm {name!r} (plugrt writes "
                          f"{', '.join(CACHE_NAMES.values())}); delete it and rebuild with calibration data")
    items = [item.split("=", 1) for item in rest.split()]
    fields = dict(items)
    problem = _header_problem(fields, name) if len(fields) == len(items) else "a field given twice"
    if problem:
        raise PlugrtError(f"calibration cache {path!r}, line 1: {problem} in {line!r}; delete the file and "
                          "rebuild with calibration data")
    percentile = float(fields["percentile"]) if "percentile" in fields else None
    return CacheHeader("plugrt", version, name, percentile, fields["model"], fields.get("data"))


def _header_problem(fields: dict[str, str], name: str) -> str | None:
    unknown = sorted(set(fields) - {"percentile", "model", "data"})
    if unknown:
        return f"unknown field {unknown[0]!r}"
    if "model" not in fields:
        return "no model= field"
    for key in ("model", "data"):
        if key in fields and not _DIGEST.fullmatch(fields[key]):
            return f"{key}= is not 8 to 64 lowercase hex digits"
    if (name == CACHE_NAMES["percentile"]) != ("percentile" in fields):
        return "percentile= goes with PercentileCalibration and only with it"
    if "percentile" in fields:
        try:
            value = float(fields["percentile"])
        except ValueError:
            return "percentile= is not a number"
        if not 0.0 < value <= 100.0:
            return "percentile= is outside (0, 100]"
    return None


def _parse_entries(path: str, lines: list[str]) -> dict[str, float]:
    ranges: dict[str, float] = {}
    first_line: dict[str, int] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        name, separator, digits = line.rpartition(": ")
        if not separator or not name:
            raise PlugrtError(f"calibration cache {path!r}, line {number}: {line[:80]!r} has no tensor name before "
                              f"': '; {_ENTRY_HELP}. Fix or delete the file")
        if not _SCALE.fullmatch(digits):
            raise PlugrtError(f"calibration cache {path!r}, line {number}: {digits[:40]!r} is not 8 hex digits; "
                              f"{_ENTRY_HELP}. Fix or delete the file")
        amax = decode_scale(digits)
        if not (math.isfinite(amax) and amax >= 0.0):
            raise PlugrtError(f"calibration cache {path!r}, line {number}: {digits} is the scale {amax / INT8_MAX}, "
                              "not a finite scale >= 0; fix or delete the file")
        if name in ranges:
            raise PlugrtError(f"calibration cache {path!r}, line {number}: tensor {name!r} again (first on line "
                              f"{first_line[name]}); keep one line per tensor, or delete the file")
        ranges[name] = amax
        first_line[name] = number
    return ranges


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise PlugrtError(f"calibration cache {path!r} does not exist; calibrate with data to write it") from None
    except OSError as exc:
        raise PlugrtError(f"calibration cache {path!r} cannot be read ({exc.strerror or exc}); check the path "
                          "and its permissions") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlugrtError(f"calibration cache {path!r} is not UTF-8 text (byte {exc.start}); name the right file, "
                          "or delete it and rebuild with calibration data") from None
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _cache_name(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise PlugrtError(f"unknown calibration algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    return CACHE_NAMES[algorithm]


def _digest(value: str, what: str) -> str:
    text = str(value).lower()
    if not _DIGEST.fullmatch(text):
        raise PlugrtError(f"calibration cache {what} {value!r} is not 8 to 64 hex digits; pass a hex digest "
                          "(model_digest(model_bytes) gives one)")
    return text
