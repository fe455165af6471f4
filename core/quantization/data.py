"""Calibration batches: feed dicts ``{input name: array}`` from an ``.npz`` file, a folder
of them, or any Python iterable of dicts; their hash; a progress line over them.

An ``.npz`` file is one batch keyed by input name (``numpy.savez(path, input=array)``); a
folder's ``.npz`` files are its batches in file-name order. Files are read one at a time,
never unpickled (``allow_pickle=False``), and every batch is checked: each model input
present, nothing else, numeric arrays. A folder's key sets are checked when it is loaded
(cheap: the arrays stay unread), so a bad file is named before calibration starts.
"""

from __future__ import annotations

import hashlib
import os
import sys
import zipfile
import zlib
from typing import Iterable, Iterator

import numpy as np

from plugrt.errors import PlugrtError

#: Array kinds a batch may hold: bool, signed and unsigned integers, floats.
NUMERIC_KINDS = "biuf"
_SAVE_HINT = "save each batch with numpy.savez(path, **{input name: array})"


class CalibrationData:
    """Checked calibration batches over one source; ``total`` is their count where known
    (files, or a Python source with a length). A Python iterator is read once."""

    def __init__(self, source, input_names: Iterable[str]):
        self.input_names = list(input_names)
        self.files: list[str] | None = None
        self._source = source
        if isinstance(source, (str, os.PathLike)):
            self.files = _batch_files(os.fspath(source))
            for path in self.files:
                check_keys(_npz_keys(path), self.input_names, repr(path))
        elif isinstance(source, dict) or not hasattr(source, "__iter__"):
            raise PlugrtError(f"calibration data must be an .npz file, a folder of them or an iterable of feed dicts, "
                              f"not {type(source).__name__}; wrap one batch in a list: [{{input name: array}}]")
        self.total: int | None = len(self.files) if self.files is not None else _length(source)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.files is not None:
            for path in self.files:
                yield check_batch(_load_npz(path), self.input_names, repr(path))
            return
        for number, batch in enumerate(self._source, start=1):
            if not isinstance(batch, dict):
                raise PlugrtError(f"calibration batch {number} is a {type(batch).__name__}, not a dict "
                                  "{input name: array}; yield one feed dict per batch")
            yield check_batch(batch, self.input_names, f"{number}")


def load_calibration_data(source, input_names: Iterable[str]) -> CalibrationData:
    """The calibration batches of ``source`` (a path to an ``.npz`` file or a folder of
    them, or an iterable of feed dicts) for a model whose inputs are ``input_names``."""
    return CalibrationData(source, input_names)


def check_keys(keys: Iterable[str], input_names: list[str], where: str) -> None:
    """Every model input present in a batch's ``keys``, and no other key."""
    keys = list(keys)
    missing = [name for name in input_names if name not in keys]
    if missing:
        raise PlugrtError(f"calibration batch {where} has no input {missing[0]!r} (it has "
                          f"{', '.join(map(repr, keys)) or 'nothing'}); every batch needs every model input: "
                          f"{_SAVE_HINT}")
    unknown = [key for key in keys if key not in input_names]
    if unknown:
        raise PlugrtError(f"calibration batch {where} has {unknown[0]!r}, which is no input of the model (its "
                          f"inputs: {', '.join(map(repr, input_names))}); drop it, or rename it to the input it feeds")


def check_batch(batch: dict, input_names: list[str], where: str) -> dict[str, np.ndarray]:
    """``batch`` checked (see :func:`check_keys`, numeric arrays) as ``{name: ndarray}``."""
    check_keys(batch.keys(), input_names, where)
    feed = {}
    for name in input_names:
        value = np.asarray(batch[name])
        if value.dtype.kind not in NUMERIC_KINDS:
            raise PlugrtError(f"calibration batch {where}: input {name!r} is a {value.dtype} array, not numbers; "
                              "feed bool, integer or floating-point arrays")
        feed[name] = value
    return feed


def _batch_files(path: str) -> list[str]:
    if os.path.isdir(path):
        entries = sorted(os.listdir(path))
        files = [os.path.join(path, name) for name in entries
                 if name.endswith(".npz") and os.path.isfile(os.path.join(path, name))]
        if not files:
            has = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "") if entries else "nothing"
            raise PlugrtError(f"calibration data folder {path!r} holds no .npz files (it has {has}); {_SAVE_HINT}, "
                              "one file per batch")
        return files
    if not os.path.exists(path):
        raise PlugrtError(f"calibration data {path!r} does not exist; name an .npz file or a folder of them")
    if not path.endswith(".npz"):
        raise PlugrtError(f"calibration data {path!r} is not an .npz file; name an .npz file or a folder of them "
                          f"({_SAVE_HINT})")
    return [path]


def _npz_keys(path: str) -> list[str]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return list(data.files)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, AttributeError) as exc:
        raise PlugrtError(f"calibration batch {path!r} is not a readable .npz file ({exc}); {_SAVE_HINT}") from None


def _load_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {}
            for key in data.files:
                try:
                    arrays[key] = data[key]
                except ValueError as exc:
                    if "allow_pickle" not in str(exc):
                        raise
                    raise PlugrtError(f"calibration batch {path!r}: {key!r} is a pickled object array, which plugrt "
                                      f"never loads; {_SAVE_HINT} with numeric arrays") from None
            return arrays
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise PlugrtError(f"calibration batch {path!r} is not a readable .npz file ({exc}); {_SAVE_HINT}") from None


def _length(source) -> int | None:
    try:
        return len(source)
    except TypeError:
        return None


# ------------------------------------------------------------------------ provenance


class DatasetHash:
    """sha256 over batches in order: each input's name, dtype, shape and bytes."""

    def __init__(self):
        self._sha = hashlib.sha256()

    def update(self, feed: dict[str, np.ndarray]) -> None:
        self._sha.update(b"batch")
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            for part in (name.encode("utf-8"), array.dtype.str.encode(), repr(array.shape).encode(),
                         array.tobytes()):
                self._sha.update(len(part).to_bytes(8, "little"))
                self._sha.update(part)

    def hexdigest(self) -> str:
        """The first 16 hex digits (a calibration cache's ``data=``)."""
        return self._sha.hexdigest()[:16]


def dataset_hash(batches: Iterable[dict[str, np.ndarray]]) -> str:
    """The hash of all ``batches`` (reads them; a Python iterator is then spent)."""
    digest = DatasetHash()
    for feed in batches:
        digest.update(feed)
    return digest.hexdigest()


# -------------------------------------------------------------------------- progress


def calibrate_progress(batches: Iterable, total: int | None = None, enabled: bool = True, stream=None) -> Iterator:
    """``batches`` as they come, with the builder's progress line on ``stream`` (stderr)
    ("calibrating batch 3/40"), shown only when ``enabled`` and on a terminal, like
    ``--no-progress`` and the tuner's timing line; cleared at the end."""
    from plugrt.tuning.tuner import Progress

    progress = Progress(stream if stream is not None else sys.stderr, enabled)
    try:
        for number, batch in enumerate(batches, start=1):
            progress.show(f"calibrating batch {number}/{total}" if total else f"calibrating batch {number}")
            yield batch
    finally:
        progress.finish()
