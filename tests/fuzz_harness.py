"""Run fuzz cases in a child process with a timeout and a memory limit.

The fuzz suites hand each case (bytes) to a target function, ``module:function``, that
runs in a worker process: this file, run as a script, imports the target once and then
reads cases from stdin, one at a time. A case passes when the target returns, or raises
:class:`plugrt.PlugrtError` (the answer plugrt owes bad input); any other exception, a
signal (a crash), running out of the memory limit, or no answer within the timeout (a
hang) fails it. After a crash or a hang the worker is started again and the next case
goes on, so one run reports every failing case::

    failures = run_cases("fuzz_targets:load_plan", [b"...", ...])
    assert not failures, failures[:5]

The memory limit is the worker's resident size, watched from outside (on a GPU an
address-space limit would stop the CUDA driver, which maps far more than it uses); in the
simulator the worker also limits its address space, so a runaway allocation fails fast.

The target may also return a string: a problem that is not an exception (a plan that
loaded though its header is inconsistent, a context that gave a wrong answer after a bad
feed); that fails the case too.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

#: Seconds one case may take before it counts as a hang.
CASE_TIMEOUT = 30.0
#: The worker's memory limit (resident bytes): a case that needs more fails as "memory".
MEMORY_LIMIT = 6 << 30

_LENGTH = struct.Struct("<Q")


@dataclass
class Failure:
    case: int
    kind: str  # "exception", "problem", "crash", "hang", "memory"
    detail: str

    def __str__(self) -> str:
        return f"case {self.case}: {self.kind}: {self.detail}"


class _Worker:
    def __init__(self, target: str, memory: int):
        self.memory = memory
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        here = os.path.dirname(os.path.abspath(__file__))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), target, str(memory)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        ready = self._line(120.0)
        if ready != {"ready": True}:
            self.close()
            raise RuntimeError(f"fuzz worker for {target} did not start: {ready}")

    def _line(self, timeout: float):
        deadline = time.monotonic() + timeout
        buffer = b""
        while not buffer.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                return "hang"
            readable, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.2))
            if not readable:
                if self._resident() > self.memory:
                    return "memory"
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return "died"
            buffer += chunk
        return json.loads(buffer.decode())

    def _resident(self) -> int:
        """The worker's resident set size in bytes (0 when it cannot be read)."""
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def run(self, payload: bytes, timeout: float):
        try:
            self.proc.stdin.write(_LENGTH.pack(len(payload)) + payload)
            self.proc.stdin.flush()
        except BrokenPipeError:
            return "died"
        return self._line(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_cases(target: str, cases, timeout: float = CASE_TIMEOUT, memory: int = MEMORY_LIMIT) -> list[Failure]:
    """Run every case through ``target`` in a worker; return the failures (empty: all passed)."""
    failures: list[Failure] = []
    worker = _Worker(target, memory)
    try:
        for index, payload in enumerate(cases):
            answer = worker.run(payload, timeout)
            if isinstance(answer, dict) and answer.get("ok"):
                continue
            if isinstance(answer, dict):
                failures.append(Failure(index, answer.get("kind", "exception"), answer.get("detail", "")))
                continue
            code = worker.proc.poll()
            worker.close()
            kind = answer if answer in ("hang", "memory") else "crash"
            failures.append(Failure(index, kind, f"worker {answer} (exit {code})"))
            worker = _Worker(target, memory)
    finally:
        worker.close()
    return failures


def _serve(target: str, memory: int) -> None:
    import importlib
    import resource
    import traceback

    from plugrt.device import simulated

    if simulated():  # on a GPU the driver's address-space reservations rule this out
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    from plugrt import PlugrtError

    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    stdin = sys.stdin.buffer
    while True:
        head = stdin.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        (length,) = _LENGTH.unpack(head)
        payload = stdin.read(length)
        try:
            problem = function(payload)
            answer = {"ok": True} if not problem else {"ok": False, "kind": "problem", "detail": str(problem)[:2000]}
        except PlugrtError:
            answer = {"ok": True}
        except MemoryError:
            answer = {"ok": False, "kind": "memory", "detail": "MemoryError"}
        except BaseException as exc:  # noqa: BLE001 - the point is to report anything else
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            answer = {"ok": False, "kind": "exception",
                      "detail": f"{type(exc).__name__}: {exc}"[:500] + "\n" + "".join(tb[-3:])[:1500]}
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
