"""Requests batched along the batch axis: what a server's dynamic batcher hands the engine.

A model is *batchable* when every input's dim 0 is one symbol (``"batch"``) that every
output's dim 0 is too, the profile lets it vary, and no layer's output size is data
(padding rows would change it). Then requests whose other dims and dtypes agree are
concatenated along dim 0, run together in chunks of at most the profile's max batch, and
the outputs split back by rows; a request that fails in a batch is run again alone, so
that one bad request gets its own error and the others their results. Other models run
each request alone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from plugrt.errors import PlugrtError


@dataclass
class Stats:
    """Requests served (``inference_count``) and engine runs (``execution_count``), as
    Triton's statistics name them: batching shows as fewer runs than requests."""

    inference_count: int = 0
    execution_count: int = 0

    def as_json(self) -> dict:
        return {"inference_count": self.inference_count, "execution_count": self.execution_count}


def batch_symbol(engine, profile: int = 0) -> str | None:
    """The symbol every input and output has as dim 0, where the model is batchable."""
    graph = engine.graph
    firsts = {graph.info(n).shape[0] if graph.info(n).shape else None for n in list(graph.inputs) + list(graph.outputs)}
    if len(firsts) != 1 or not isinstance(next(iter(firsts)), str):
        return None
    low, _, high = next(iter(engine.profiles[profile].shapes.values()))
    return next(iter(firsts)) if low and low[0] < high[0] else None


def max_batch(engine, profile: int = 0) -> int:
    """The largest batch the profile takes (1 for a model that is not batchable)."""
    if batch_symbol(engine, profile) is None:
        return 1
    return min(entry[2][0] for entry in engine.profiles[profile].shapes.values())


def preferred_batch(engine, profile: int = 0) -> int:
    if batch_symbol(engine, profile) is None:
        return 1
    return min(entry[1][0] for entry in engine.profiles[profile].shapes.values())


class Batcher:
    """Runs lists of requests (feed dicts) on one execution context, batched where the
    model is batchable; thread-safe (one run at a time)."""

    def __init__(self, context):
        self.context = context
        engine = context.engine
        self.inputs = list(engine.graph.inputs)
        self.batchable = batch_symbol(engine, context.optimization_profile) is not None \
            and not context.current.graph.data_dependent
        self.max_batch = max_batch(engine, context.optimization_profile) if self.batchable else 1
        self.stats = Stats()
        self._lock = threading.Lock()

    def run(self, requests: list[dict]) -> list:
        """Each request's outputs (a dict of arrays), or the exception it raised."""
        with self._lock:
            self.stats.inference_count += len(requests)
            results: list = [None] * len(requests)
            groups: dict = {}
            for index, feeds in enumerate(requests):
                groups.setdefault(self._signature(feeds), []).append(index)
            for signature, members in groups.items():
                for chunk in self._chunks(members, requests) if signature is not None else [[i] for i in members]:
                    self._run(chunk, requests, results)
            return results

    def _signature(self, feeds: dict):
        if not self.batchable or set(feeds) != set(self.inputs):
            return None
        arrays = [np.asarray(feeds[n]) for n in self.inputs]
        if any(a.ndim == 0 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
            return None
        return tuple((a.dtype.str, a.shape[1:]) for a in arrays)

    def _chunks(self, members: list[int], requests: list[dict]):
        chunk, rows = [], 0
        for index in members:
            batch = int(np.shape(requests[index][self.inputs[0]])[0])
            if chunk and rows + batch > self.max_batch:
                yield chunk
                chunk, rows = [], 0
            chunk.append(index)
            rows += batch
        if chunk:
            yield chunk

    def _run(self, chunk: list[int], requests: list[dict], results: list) -> None:
        if len(chunk) == 1:
            results[chunk[0]] = self._execute(requests[chunk[0]])
            return
        sizes = [int(np.shape(requests[i][self.inputs[0]])[0]) for i in chunk]
        feeds = {n: np.concatenate([np.asarray(requests[i][n]) for i in chunk]) for n in self.inputs}
        outputs = self._execute(feeds)
        if isinstance(outputs, Exception):  # one request's fault, maybe: each alone, each its own answer
            for i in chunk:
                results[i] = self._execute(requests[i])
            return
        starts = np.cumsum([0] + sizes)
        for i, start, end in zip(chunk, starts[:-1], starts[1:]):
            results[i] = {name: value[start:end] for name, value in outputs.items()}

    def _execute(self, feeds: dict):
        try:
            self.stats.execution_count += 1
            return self.context.execute(feeds)
        except PlugrtError as exc:
            return exc


__all__ = ["Batcher", "Stats", "batch_symbol", "max_batch", "preferred_batch"]
