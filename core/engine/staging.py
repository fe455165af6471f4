"""Pinned host staging for a context's copies between host arrays and the device.

Copies from pageable memory are synchronous for the host; from page-locked memory they
are true asynchronous DMA. A context stages each host input through a pinned buffer
before its host-to-device copy, and each output through one after its device-to-host
copy. Inputs have two buffers each, used in turn, with an event recorded after each copy:
the host fills one while the device may still read the other, and waits (on that event
alone, never the device) only if both are still in flight.
"""

from __future__ import annotations

import numpy as np

#: Pinned buffers per input: the host writes one while the device copies from the other.
DEPTH = 2


class HostStaging:
    """Pinned buffers per binding name, grown on demand."""

    def __init__(self):
        self._inputs: dict[str, list] = {}  # name -> [[buffer, event], ...]
        self._turn: dict[str, int] = {}
        self._outputs: dict[str, object] = {}

    def upload(self, name: str, source: np.ndarray, target, stream) -> None:
        """Enqueue ``source`` (host) into ``target`` (device) on ``stream``, through pinned memory."""
        from numba import cuda

        nbytes = int(source.nbytes)
        slots = self._inputs.setdefault(name, [])
        turn = self._turn.get(name, 0)
        self._turn[name] = (turn + 1) % DEPTH
        if len(slots) < DEPTH:
            slots.append([None, cuda.event()])
        buffer, event = slots[turn]
        if buffer is not None:
            event.synchronize()  # the copy that last read this buffer is done
        if buffer is None or buffer.size < nbytes:
            buffer = slots[turn][0] = cuda.pinned_array(max(nbytes, 1), np.uint8)
        staged = buffer[:nbytes].view(source.dtype).reshape(source.shape)
        np.copyto(staged, source, casting="no")
        target.copy_to_device(staged, stream=stream)
        event.record(stream)

    def download(self, name: str, source, stream) -> np.ndarray:
        """Enqueue ``source`` (device) into a pinned buffer on ``stream``; the buffer's
        view is valid once the stream is done, and until the next download of ``name``."""
        from numba import cuda

        nbytes = int(source.size) * source.dtype.itemsize
        buffer = self._outputs.get(name)
        if buffer is None or buffer.size < nbytes:
            buffer = self._outputs[name] = cuda.pinned_array(max(nbytes, 1), np.uint8)
        staged = buffer[:nbytes].view(source.dtype).reshape(source.shape)
        if nbytes:
            source.copy_to_host(staged, stream=stream)
        return staged

    def close(self) -> None:
        for slots in self._inputs.values():
            for slot in slots:
                if slot[0] is not None:
                    slot[1].synchronize()
        self._inputs.clear()
        self._outputs.clear()
