"""A pool of execution contexts for request threads.

A context runs one request at a time; a server's request threads take one from the pool
for each request and give it back. Every context has its own stream, arena and
workspace, and all share the engine's weights, so requests on different contexts run
concurrently on the GPU.
"""

from __future__ import annotations

import queue
from contextlib import contextmanager
from typing import Iterator, Mapping

from plugrt.errors import PlugrtError


class ContextPool:
    """``size`` contexts of ``engine``, handed out one request at a time.

    ::

        with ContextPool(engine, size=4) as pool:
            outputs = pool.execute(feeds)           # from any thread
            with pool.context() as ctx:             # or hold one for several calls
                ctx.execute(feeds)
    """

    def __init__(self, engine, size: int = 2, use_cuda_graph: bool = True):
        if int(size) < 1:
            raise PlugrtError(f"a context pool needs at least one context, got size={size}")
        self.engine = engine
        self._contexts = [engine.create_execution_context(use_cuda_graph=use_cuda_graph) for _ in range(int(size))]
        self._free: queue.Queue = queue.Queue()
        for ctx in self._contexts:
            self._free.put(ctx)
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._contexts)

    @contextmanager
    def context(self, timeout: float | None = None) -> Iterator:
        """A free context for the duration of the ``with`` block (waits for one)."""
        if self._closed:
            raise PlugrtError("this context pool is closed")
        try:
            ctx = self._free.get(timeout=timeout)
        except queue.Empty:
            raise PlugrtError(f"no execution context came free within {timeout} s; make the pool larger "
                              f"(it has {self.size})") from None
        try:
            yield ctx
        finally:
            self._free.put(ctx)

    def execute(self, feeds: Mapping[str, object], timeout: float | None = None) -> dict:
        """Run ``feeds`` synchronously on a free context; the outputs as NumPy arrays."""
        with self.context(timeout) as ctx:
            return ctx.execute(feeds)

    def close(self) -> None:
        """Close every context (waiting for those in use to come back)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._contexts:
            self._free.get().close()

    def __enter__(self) -> "ContextPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["ContextPool"]
