"""Setup for every test path (tests/ and each contrib plugin's tests): plugrt imported first,
so that it picks the GPU or Numba's CUDA simulator before numba.cuda is imported; in the
simulator, a block's threads meet at ``syncthreads`` through a barrier instead of a poll.

Numba's simulator runs each CUDA thread of a block as a Python thread, and its block manager
finds out which of them wait in ``syncthreads`` (or have ended) by polling them all in a
loop that never sleeps: under the GIL the poll takes most of the time the threads should
get (tiny BERT's forward pass: 13.7 s, 5.0 s with the barrier). The barrier keeps the
simulator's rules: every thread of the block runs to its end; ``syncthreads`` releases
the waiting threads once every live thread waits; the first thread to raise aborts the
others and its exception is the launch's.
"""

from __future__ import annotations

import threading

import numpy as np

import plugrt  # noqa: F401  (chooses GPU or simulator before numba.cuda is imported)
from plugrt.device import simulated


class _BlockBarrier:
    """The ``syncthreads`` barrier of one simulated block, and its end."""

    def __init__(self, threads: list) -> None:
        self.threads = threads
        self.condition = threading.Condition()
        self.live = len(threads)
        self.waiting: list = []
        self.failed = None

    def arrive(self, thread) -> None:
        with self.condition:
            thread.syncthreads_blocked = True
            self.waiting.append(thread)
            self._release_if_all_wait()

    def leave(self, thread) -> None:
        with self.condition:
            self.live -= 1
            if thread.exception and self.failed is None:
                self.failed = thread
                for other in self.threads:  # as the simulator does: abort the rest
                    other.abort = True
                    other.syncthreads_blocked = False
                    other.syncthreads_event.set()
            else:
                self._release_if_all_wait()
            if self.live == 0 or self.failed is not None:
                self.condition.notify_all()

    def wait_for_the_block(self) -> None:
        with self.condition:
            while self.live and self.failed is None:
                self.condition.wait()

    def _release_if_all_wait(self) -> None:
        if self.waiting and len(self.waiting) == self.live:
            for thread in self.waiting:
                thread.syncthreads_blocked = False
                thread.syncthreads_event.set()
            self.waiting = []


def _use_a_barrier_in_the_simulator() -> None:
    from numba.cuda.simulator import kernel

    if not hasattr(kernel, "BlockManager") or not hasattr(kernel, "BlockThread"):
        return  # another simulator than the one this replaces the poll of

    class BarrierThread(kernel.BlockThread):
        barrier: _BlockBarrier

        def run(self) -> None:
            try:
                super().run()  # (BlockThread.run keeps the thread's exception)
            finally:
                self.barrier.leave(self)

        def syncthreads(self) -> None:
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            self.barrier.arrive(self)
            self.syncthreads_event.wait()
            self.syncthreads_event.clear()
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads clear")

    def run(self, grid_point, *args) -> None:
        def target():
            self._f(*args)

        threads = [BarrierThread(target, self, grid_point, block_point, self._debug)
                   for block_point in np.ndindex(*self._block_dim)]
        barrier = _BlockBarrier(threads)
        for thread in threads:
            thread.barrier = barrier
        for thread in threads:
            thread.start()
        barrier.wait_for_the_block()
        failed = barrier.failed or next((t for t in threads if t.exception), None)
        if failed is not None:
            raise failed.exception[0].with_traceback(failed.exception[1])
        for thread in threads:  # (every thread has left: no reference cycle outlives the launch)
            del thread.barrier

    kernel.BlockManager.run = run


if simulated():
    _use_a_barrier_in_the_simulator()
