"""The files a command names, checked before the work starts.

An input must exist, be a readable file and be of the kind the option takes; an output's
folder must exist and be writable, and the output must not be a folder, one of the
command's inputs, or (without ``--force``) an existing file of another kind: a build never
replaces the model it read, a run never writes its outputs over a plan or a model. What a
file is comes from its first bytes (:func:`file_kind`), never from its name.

Every problem is a :class:`PlugrtError` naming the option, the path and the fix.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
import zipfile
from typing import Mapping

from plugrt.errors import PlugrtError

#: The kinds plugrt reads and writes (the values :func:`file_kind` returns for them).
PLAN = "plugrt plan file"
NPZ = ".npz archive"
TIMING_CACHE = "plugrt timing cache"
ONNX = "ONNX model"

#: The first bytes of a plan file (``plugrt.engine.plan_file.MAGIC``; a test keeps them equal).
PLAN_MAGIC = b"PLUGRTPL"
#: The ``format`` of a timing cache file (``plugrt.tuning.timing_cache.CACHE_FORMAT``).
TIMING_CACHE_FORMAT = "plugrt-timing-cache"
#: How much of a JSON file :func:`file_kind` parses to find a timing cache.
_JSON_LIMIT = 256 << 20

_ARTICLE = {PLAN: "a", NPZ: "an", TIMING_CACHE: "a", ONNX: "an"}


def file_kind(path: str) -> str:
    """What the file at ``path`` holds, in words: one of :data:`PLAN`, :data:`NPZ`,
    :data:`TIMING_CACHE`, :data:`ONNX`, or a description ("an .npy array", "a zip archive",
    "a JSON file", "an empty file", "binary data", ...). Unreadable files raise ``OSError``."""
    with open(path, "rb") as f:
        head = f.read(4096)
        if not head:
            return "an empty file"
        if head.startswith(PLAN_MAGIC):
            return PLAN
        if head.startswith(b"\x93NUMPY"):
            return "an .npy array"
        if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
            return _zip_kind(path)
        if head.lstrip()[:1] in (b"{", b"["):
            f.seek(0)
            return _json_kind(f.read(_JSON_LIMIT))
    if _looks_like_onnx(head):
        return ONNX
    try:
        if b"\0" not in head:
            codecs.getincrementaldecoder("utf-8")().decode(head)  # a character cut at 4096 is no error
            return "a text file"
    except UnicodeDecodeError:
        pass
    return "binary data"


def looks_like_timing_cache(path: str) -> bool:
    """Whether ``path`` is, or once was, a timing cache: one that parses, or a damaged one
    (truncated: JSON that does not parse but holds a cache's keys)."""
    try:
        kind = file_kind(path)
        if kind == TIMING_CACHE:
            return True
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    text = head.lstrip()
    if not text.startswith(b"{"):
        return False
    return TIMING_CACHE_FORMAT.encode() in head or text[1:].lstrip().startswith(b'"entries"')


def _zip_kind(path: str) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return "a damaged zip archive"
    return NPZ if all(name.endswith(".npy") for name in names) else "a zip archive"


def _json_kind(data: bytes) -> str:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "a text file"
    if isinstance(value, dict) and value.get("format") == TIMING_CACHE_FORMAT:
        return TIMING_CACHE
    return "a JSON file"


def _looks_like_onnx(head: bytes) -> bool:
    """An ONNX ModelProto starts with its field 1, ``ir_version``, a small varint."""
    return len(head) > 2 and head[0] == 0x08 and 1 <= head[1] <= 0x30


def with_article(kind: str) -> str:
    """``PLAN`` -> "a plugrt plan file"; descriptions already carry theirs."""
    return f"{_ARTICLE[kind]} {kind}" if kind in _ARTICLE else kind


# ---------------------------------------------------------------------------- inputs


def check_input(path: str, option: str, kind: str | None = None, hint: str = "") -> str:
    """Check that ``path`` (given as ``option``) is an existing, readable file, and of
    ``kind`` when one is named (``hint`` then says how to make one); returns its kind."""
    _check_spelling(path, option)
    if not os.path.lexists(path):
        raise PlugrtError(f"{option} {path!r} does not exist; name an existing file")
    if not os.path.exists(path):
        raise PlugrtError(f"{option} {path!r} is a broken symbolic link; name an existing file")
    if os.path.isdir(path):
        raise PlugrtError(f"{option} {path!r} is a folder; name a file")
    if not os.path.isfile(path):
        raise PlugrtError(f"{option} {path!r} is not a regular file; name a file")
    try:
        found = file_kind(path)
    except OSError as exc:
        raise PlugrtError(f"{option} {path!r} cannot be read ({exc.strerror or exc}); check its permissions") from None
    if kind is not None and found != kind:
        fix = hint or f"name {with_article(kind)}"
        raise PlugrtError(f"{option} {path!r} is {with_article(found)}, not {with_article(kind)}; {fix}")
    return found


def check_model_input(path: str, option: str) -> None:
    """An existing, readable file that may be a model (the importer judges the ONNX in it)."""
    found = check_input(path, option)
    if found in (ONNX, "binary data", "a text file"):
        return
    fix = " (plugrt run and plugrt inspect read plans)" if found == PLAN else ""
    raise PlugrtError(f"{option} {path!r} is {with_article(found)}, not an ONNX model{fix}; name the .onnx file")


def check_plan_input(path: str, option: str) -> None:
    """An existing, readable plan file (a model given instead says how to build one)."""
    found = check_input(path, option)
    if found == PLAN:
        return
    if found == ONNX:
        fix = f"build one first: plugrt build {path} -o MODEL.plan"
    else:
        fix = "name the plan file plugrt build wrote (plugrt build MODEL.onnx -o MODEL.plan)"
    raise PlugrtError(f"{option} {path!r} is {with_article(found)}, not a plugrt plan file; {fix}")


# ---------------------------------------------------------------------------- outputs


def check_output(path: str, option: str, kind: str, inputs: Mapping[str, str | None] | None = None,
                 force: bool = False) -> None:
    """Check, before any work, that ``path`` (given as ``option``) can be written as a file
    of ``kind``: its folder exists and is writable, it is not a folder, not one of
    ``inputs`` (option -> path; not even with ``force``), and, unless ``force``, not an
    existing file of another kind (an empty file is overwritten)."""
    _check_spelling(path, option)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise PlugrtError(f"{option} {path!r} is a folder; name a file inside it, e.g. "
                          f"{os.path.join(path, 'out' + _SUFFIX.get(kind, ''))!r}")
    if not os.path.isdir(folder):
        raise PlugrtError(f"{option} {path!r}: its folder {folder!r} does not exist; create it first "
                          f"(mkdir -p {folder}) or name a file in an existing folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PlugrtError(f"{option} {path!r}: the folder {folder!r} is not writable; name a file in a folder "
                          "you can write")
    name_max = _name_max(folder)
    if len(os.fsencode(os.path.basename(path))) > name_max:
        raise PlugrtError(f"{option} {path!r}: the file name is longer than {name_max} bytes; name a shorter one")
    if not os.path.lexists(path):
        return
    for other_option, other in (inputs or {}).items():
        if other and _same_file(path, other):
            raise PlugrtError(f"{option} {path!r} is the file {other_option} {other!r} this command reads; "
                              f"writing it would destroy that input, even with --force: name another file")
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode) and not os.path.exists(path):
        return  # a dangling link: the rename replaces the link, nothing is lost
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise PlugrtError(f"{option} {path!r} is not a regular file; name a file")
    if force:
        return
    try:
        found = file_kind(path)
    except OSError as exc:
        raise PlugrtError(f"{option} {path!r} exists and cannot be read ({exc.strerror or exc}) to see what it "
                          "is; name another file, or pass --force to replace it") from None
    if found not in (kind, "an empty file"):
        raise PlugrtError(f"{option} {path!r} exists and is {with_article(found)}, not {with_article(kind)}; "
                          "name another file, or pass --force to replace it")


def check_distinct(paths: Mapping[str, str | None]) -> None:
    """Refuse two outputs of one command (option -> path) that name the same file."""
    given = [(option, path) for option, path in paths.items() if path]
    for i, (option, path) in enumerate(given):
        for other_option, other in given[i + 1:]:
            if os.path.abspath(path) == os.path.abspath(other) or _same_file(path, other):
                raise PlugrtError(f"{option} and {other_option} both name {path!r}; name two different files")


def check_new_folder(path: str, option: str) -> None:
    """Check that a new folder can be created at ``path``: a new or empty folder, whose
    parent exists and is writable."""
    _check_spelling(path, option)
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise PlugrtError(f"{option} {path!r} is a file; name a new folder")
    if not os.path.isdir(parent):
        raise PlugrtError(f"{option} {path!r}: its parent folder {parent!r} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PlugrtError(f"{option} {path!r}: the folder {parent!r} is not writable; name a folder in one "
                          "you can write")


_SUFFIX = {PLAN: ".plan", NPZ: ".npz", TIMING_CACHE: ".json"}


def _check_spelling(path: str, option: str) -> None:
    if not path:
        raise PlugrtError(f"{option} is empty; name a file")
    if "\0" in path:
        raise PlugrtError(f"{option} {path!r} contains a NUL character; name a file")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _name_max(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255
