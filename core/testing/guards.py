"""Guard regions: run a tactic on buffers padded with sentinel bytes, the way the engine runs it.

Every input, output and the workspace lives inside a larger allocation: a pad before and
after it holds a random byte pattern, and the tactic gets a view of the interior, exactly
as the engine hands out views of its arena. Output and workspace interiors start as
0xFF bytes (NaN for floats), as reused arena memory holds garbage; a tactic that leaves an
element unwritten, or assumes a zeroed workspace, then fails the comparison.

:func:`run_guarded` prepares the launch list once (through the engine's
:class:`~plugrt.launcher.PreparedLaunch`), runs it, then copies a second set of
inputs in and replays the same launches, as ``ExecutionContext.execute`` does. Afterwards
every pad must be intact and every input unchanged.

On a GPU a stray write lands in a pad. Numba's CUDA simulator bounds-checks every access
instead (an ``IndexError``); :func:`run_guarded` then finds the buffer from the failing
access (the simulator's array object in the traceback), so both report the same buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from plugrt.device import simulated
from plugrt.launcher import PreparedLaunch
from plugrt.ir.dims import format_shape
from plugrt.tactic import Launch

PAD_MIN = 256
PAD_MAX = 1 << 20
#: Interior bytes of outputs and the workspace before a run: NaN for floats, -1 for ints.
GARBAGE = 0xFF


def pad_bytes(nbytes: int) -> int:
    """Pad on each side: the buffer's own size rounded up to 256 bytes, within 256 B..1 MiB
    (a kernel that overruns by a row or a tile lands in it)."""
    return min(max(PAD_MIN, -(-nbytes // 256) * 256), PAD_MAX)


class GuardedBuffer:
    """A device array (``array``) inside an allocation whose pads hold a random pattern."""

    def __init__(self, label: str, dtype, shape, rng: np.random.Generator, contents: np.ndarray | None = None):
        from numba import cuda

        self.label = label
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.pad = pad_bytes(self.nbytes)
        self.pattern = rng.integers(0, 256, 2 * self.pad, dtype=np.uint8)
        host = np.empty(2 * self.pad + self.nbytes, np.uint8)
        host[:self.pad] = self.pattern[:self.pad]
        host[self.pad + self.nbytes:] = self.pattern[self.pad:]
        if contents is None:
            host[self.pad:self.pad + self.nbytes] = GARBAGE
        else:
            host[self.pad:self.pad + self.nbytes] = _bytes_of(contents, self.dtype, self.shape)
        self.raw = cuda.to_device(host)
        if self.nbytes:
            self.array = self.raw[self.pad:self.pad + self.nbytes].view(self.dtype).reshape(self.shape)
        else:
            self.array = cuda.device_array(self.shape, self.dtype)

    def describe(self) -> str:
        return f"{self.label} ({self.dtype}{format_shape(self.shape)}, {self.nbytes} bytes)"

    def upload(self, contents: np.ndarray) -> None:
        if self.nbytes:
            self.array.copy_to_device(np.ascontiguousarray(contents, dtype=self.dtype).reshape(self.shape))

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """``(whole allocation bytes, interior as an array)``."""
        host = self.raw.copy_to_host()
        interior = host[self.pad:self.pad + self.nbytes].view(self.dtype).reshape(self.shape).copy()
        return host, interior

    def damage(self, host: np.ndarray) -> str:
        """What changed in the pads, or ``""``."""
        before = np.nonzero(host[:self.pad] != self.pattern[:self.pad])[0]
        after = np.nonzero(host[self.pad + self.nbytes:] != self.pattern[self.pad:])[0]
        parts = []
        if before.size:
            parts.append(f"{before.size} byte(s) before its start were written "
                         f"(the farthest {self.pad - int(before.min())} bytes before)")
        if after.size:
            parts.append(f"{after.size} byte(s) past its end were written "
                         f"(the farthest {int(after.max()) + 1} bytes past)")
        return "; ".join(parts)

    def contains(self, address: int) -> bool:
        """Whether a host address (the simulator's NumPy memory) lies in this allocation."""
        ary = getattr(self.raw, "_ary", None)
        if not isinstance(ary, np.ndarray):
            return False
        start = ary.__array_interface__["data"][0]
        return start <= address < start + ary.nbytes


def _bytes_of(contents: np.ndarray, dtype: np.dtype, shape: tuple) -> np.ndarray:
    array = np.ascontiguousarray(contents, dtype=dtype).reshape(shape)
    return array.reshape(-1).view(np.uint8) if array.size else np.zeros(0, np.uint8)


@dataclass(frozen=True)
class Violation:
    """A tactic touched memory it must not: which buffer, how, and the details."""

    #: The buffer's label (``"output 0"``, ``"workspace"``), ``""`` for an array the tactic made.
    buffer: str
    #: ``"pad"`` (a guard region written), ``"out-of-bounds"`` (the simulator's bounds
    #: check), or ``"modified"`` (an input written).
    kind: str
    message: str


@dataclass
class GuardedRun:
    """What one tactic did on guarded buffers."""

    #: Outputs after the first run, and after the replay on the second inputs.
    outputs: list[np.ndarray] | None = None
    replay_outputs: list[np.ndarray] | None = None
    #: ``(phase, exception)`` when ``launches()``, a launch or the replay raised.
    error: tuple[str, BaseException] | None = None
    violations: list[Violation] = field(default_factory=list)


def run_guarded(tactic, inputs: Sequence[np.ndarray | None], replay_inputs: Sequence[np.ndarray | None],
                runtime: Sequence[bool], outputs: Sequence, seed: int) -> GuardedRun:
    """Run ``tactic`` on guarded copies of ``inputs``, then replay it on ``replay_inputs``.

    :param runtime: per input, whether it is a runtime input (replaced for the replay) or
        a constant (weights: the same both times).
    :param outputs: the outputs' :class:`~plugrt.plugin.TensorInfo` (concrete shapes).
    """
    from numba import cuda

    rng = np.random.default_rng([seed, 0x6A7D])
    result = GuardedRun()
    ins = [None if a is None else GuardedBuffer(f"input {i}" + ("" if runtime[i] else " (a constant)"),
                                                a.dtype, a.shape, rng, a)
           for i, a in enumerate(inputs)]
    outs = [GuardedBuffer(f"output {i}", info.dtype, tuple(int(d) for d in info.shape), rng)
            for i, info in enumerate(outputs)]
    workspace = GuardedBuffer("workspace", np.uint8, (int(tactic.workspace_bytes),), rng) \
        if tactic.workspace_bytes else None
    buffers = [b for b in ins + outs + [workspace] if b is not None]
    phase = "launches()"
    try:
        launches = list(tactic.launches([b.array if b is not None else None for b in ins], [o.array for o in outs],
                                        workspace.array if workspace is not None else None))
        bad = [launch for launch in launches if not isinstance(launch, Launch)]
        if bad:
            raise TypeError(f"launches() returned {type(bad[0]).__name__}, not plugrt.tactic.Launch")
        prepared = [PreparedLaunch(launch) for launch in launches]
        phase = "the first run"
        for launch in prepared:
            launch(0)
        cuda.synchronize()
        result.outputs = [o.read()[1] for o in outs]
        _check_inputs(ins, inputs, result, "the first run")
        phase = "the replay"
        for buffer, array, fresh in zip(ins, replay_inputs, runtime):
            if buffer is not None and fresh:
                buffer.upload(array)
        for launch in prepared:
            launch(0)
        cuda.synchronize()
        result.replay_outputs = [o.read()[1] for o in outs]
        _check_inputs(ins, replay_inputs, result, "the replay")
    except Exception as exc:  # reported by the caller: a plugin's bug, not the kit's
        access = _simulator_access(exc, buffers)
        if access is not None:
            buffer, text = access
            result.violations.append(Violation(buffer.label if buffer is not None else "", "out-of-bounds", text))
        else:
            result.error = (phase, exc)
    for buffer in buffers:
        damage = buffer.damage(buffer.read()[0])
        if damage:
            result.violations.append(Violation(buffer.label, "pad", f"{buffer.describe()}: {damage}"))
    return result


def _check_inputs(ins: list, arrays: Sequence, result: GuardedRun, when: str) -> None:
    for buffer, array in zip(ins, arrays):
        if buffer is None:
            continue
        interior = buffer.read()[1]
        same = np.array_equal(interior.reshape(-1).view(np.uint8), _bytes_of(array, buffer.dtype, buffer.shape))
        if not same:
            result.violations.append(Violation(buffer.label, "modified", f"{buffer.describe()} was modified "
                                               f"during {when}; tactics must treat inputs as read-only (weights "
                                               "are shared by every execution context)"))


def _simulator_access(exc: BaseException, buffers: list[GuardedBuffer]) -> tuple[GuardedBuffer | None, str] | None:
    """In the simulator, the buffer an out-of-bounds ``IndexError`` came from, and a message."""
    if not isinstance(exc, IndexError) or not simulated():
        return None
    culprit = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in ("__getitem__", "__setitem__"):
            ary = getattr(frame.f_locals.get("self"), "_ary", None)
            if isinstance(ary, np.ndarray):
                culprit = (ary, frame.f_code.co_name == "__setitem__")
        tb = tb.tb_next
    detail = str(exc)
    if culprit is None:
        return None, f"a kernel accessed memory out of bounds ({detail})"
    ary, write = culprit
    verb = "wrote" if write else "read"
    address = ary.__array_interface__["data"][0]
    for buffer in buffers:
        if buffer.contains(address):
            return buffer, (f"{buffer.describe()}: a kernel {verb} out of bounds (the simulator checks every "
                            f"access; on a GPU this {'corrupts' if write else 'reads'} memory outside the buffer): "
                            f"{detail}")
    return None, (f"a kernel {verb} out of bounds of an array the tactic made itself (an index table or "
                  f"scratch array, not an input, output or the workspace): {detail}")
