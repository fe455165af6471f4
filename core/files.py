"""Files plugrt writes: whole or not at all (plan files, timing caches, outputs, scaffolds)."""

from __future__ import annotations

import os
import tempfile
import threading

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc``);
    elsewhere set and restored under a lock (``os.umask`` has no read-only form)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename,
    so nothing half-written is ever left at ``path`` (plan files, timing caches, outputs).
    The file gets the mode ``open`` would give it (0o666 less the umask), not mkstemp's 0o600."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".plugrt-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
