"""Setup for every test path (tests/ and each contrib plugin's tests): plugrt imported first,
so that it picks the GPU or Numba's CUDA simulator before numba.cuda is imported; in the
simulator, a block's threads come from a pool and meet at ``syncthreads`` at a barrier.

Numba's simulator runs each CUDA thread of a block as a new Python thread, and its block
manager finds out which of them wait in ``syncthreads`` (or have ended) by polling them all
in a loop that never sleeps: under the GIL the poll takes most of the time the threads
should get (tiny BERT's forward pass: 13.7 s; with the barrier and the pool, 4 s). The
replacement keeps the simulator's rules: each CUDA thread is a Python thread of its own
(``threading.current_thread()`` answers its indices), every thread of the block runs to its
end, ``syncthreads`` releases the waiting threads once every live thread waits, and the
first thread to raise aborts the others and its exception is the launch's.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import plugrt  # noqa: F401  (chooses GPU or simulator before numba.cuda is imported)
from plugrt.device import guard_simulator, simulated


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


class _CudaThread(threading.Thread):
    """A Python thread that runs one CUDA thread of a block at a time, then waits for the
    next: what the simulator's kernel API asks ``threading.current_thread()`` for."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._wake = threading.Event()
        self.syncthreads_event = threading.Event()
        self.syncthreads_blocked = False
        self.start()

    def assign(self, manager, barrier, function, args, block_idx, thread_idx) -> None:
        """Run CUDA thread ``thread_idx`` (a Dim3) of block ``block_idx`` (a Dim3) next."""
        self._manager, self.barrier, self._function, self._args = manager, barrier, function, args
        self.blockIdx, self.threadIdx = block_idx, thread_idx
        block = manager._block_dim
        self.thread_id = thread_idx.x + block[0] * (thread_idx.y + block[1] * thread_idx.z)
        self.exception, self.abort, self.syncthreads_blocked = None, False, False
        self.syncthreads_event.clear()
        self._wake.set()

    def run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            barrier = self.barrier
            try:
                if self._manager._debug:
                    with np.errstate(divide="raise"):
                        self._function(*self._args)
                else:
                    self._function(*self._args)
            except Exception as e:  # noqa: BLE001 - the launch raises it (as the simulator's BlockThread)
                where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
                self.exception = (type(e)(f"{where}: {e}" if str(e) else where), sys.exc_info()[2])
            self._function = self._args = self._manager = self.barrier = None
            barrier.leave(self)

    def syncthreads(self) -> None:
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        self.barrier.arrive(self)
        self.syncthreads_event.wait()
        self.syncthreads_event.clear()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def syncthreads_count(self, value):
        return self._vote(value, np.count_nonzero)

    def syncthreads_and(self, value):
        return 1 if self._vote(value, np.all) else 0

    def syncthreads_or(self, value):
        return 1 if self._vote(value, np.any) else 0

    def _vote(self, value, combine):
        """Every thread's ``value`` in the block's state, then ``combine`` of them all."""
        state = self._manager.block_state
        state[self.threadIdx.x, self.threadIdx.y, self.threadIdx.z] = value
        self.syncthreads()
        result = combine(state)
        self.syncthreads()
        return result


def _use_a_pool_and_a_barrier_in_the_simulator() -> None:
    from numba.cuda.simulator import kernel
    from numba.cuda.simulator.kernelapi import Dim3

    try:
        manager = kernel.BlockManager(None, (1, 1, 1), (1, 1, 1), False)
        known = all(hasattr(manager, name) for name in ("_f", "_block_dim", "_debug", "block_state"))
    except Exception:  # noqa: BLE001 - a simulator other than the one this speeds up: left as it is
        known = False
    if not known:
        return
    idle: list = []
    idle_lock = threading.Lock()

    def run(self, grid_point, *args) -> None:
        points = list(np.ndindex(*self._block_dim))
        with idle_lock:
            taken = idle[len(idle) - len(points):] if len(points) <= len(idle) else idle[:]
            del idle[len(idle) - len(taken):]
        threads = taken + [_CudaThread() for _ in range(len(points) - len(taken))]
        barrier = _BlockBarrier(threads)
        block_idx = Dim3(*grid_point)
        for thread, point in zip(threads, points):
            thread.assign(self, barrier, self._f, args, block_idx, Dim3(*point))
        barrier.wait_for_the_block()
        failed = barrier.failed or next((t for t in threads if t.exception), None)
        if failed is not None:  # (the block's threads are not reused: some may still run)
            raise failed.exception[0].with_traceback(failed.exception[1])
        with idle_lock:
            idle.extend(threads)

    kernel.BlockManager.run = run


if simulated():
    guard_simulator()
    _use_a_pool_and_a_barrier_in_the_simulator()
