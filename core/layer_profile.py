"""Per-layer GPU times: ``plugrt bench --dump-profile`` (trtexec's ``--dumpProfile`` with
``--separateProfileRun``), :func:`profile_layers` from Python.

A profiling run is separate from the timed queries: one context, direct launches (no CUDA
graph), a CUDA event recorded before each layer's launches and one after the last, the
inputs copied in once. Each layer's time is the median over ``runs`` runs of the time
between its event and the next, so a layer's time includes the gaps between its kernels
but no other layer's work. The table also gives each layer's kernels and the blocks and
threads they launch (a layer that launches fewer blocks than the GPU has SMs leaves the
GPU partly idle at this shape; several streams can fill it).

In Numba's CUDA simulator there are no CUDA events: the times are host times around each
layer's launches (the kernels run on the host), meaningless as speed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from plugrt.device import simulated

#: Profiling runs by default (after one untimed run).
DEFAULT_RUNS = 20


@dataclass
class LayerTime:
    """One layer of a profiling run."""

    name: str
    op: str
    tactic: str
    plugin: str
    kernels: int
    #: Blocks and threads launched by all of the layer's kernels together.
    blocks: int
    threads: int
    times_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.times_ms)) if self.times_ms else 0.0

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.times_ms)) if self.times_ms else 0.0

    def as_json(self, total_ms: float) -> dict:
        return {"name": self.name, "op": self.op, "tactic": self.tactic, "plugin": self.plugin,
                "kernels": self.kernels, "blocks": self.blocks, "threads": self.threads,
                "median_ms": self.median_ms, "mean_ms": self.mean_ms,
                "percent": 100.0 * self.median_ms / total_ms if total_ms > 0 else 0.0}


def profile_layers(engine, feeds: Mapping[str, np.ndarray], runs: int = DEFAULT_RUNS,
                   profile: int = 0) -> list[LayerTime]:
    """Each device layer's time running ``engine`` on ``feeds`` (in optimization profile
    ``profile``), in execution order."""
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < 1:
        from plugrt.errors import PlugrtError

        raise PlugrtError(f"profile runs must be a whole number >= 1, got {runs!r}")
    by_name = {engine.graph.nodes[layer.node_index].name: layer for layer in engine.layers}
    with engine.create_execution_context(use_cuda_graph=False, profile=profile) as context:
        stream = context.stream
        context.copy_inputs(feeds, stream)
        context.enqueue(stream)  # untimed: first-touch costs stay out; past data-dependent layers, their sizes
        stream.synchronize()
        steps = [(spec, name, start, end) for spec in context.last_run for name, start, end in spec.layer_launches]
        rows = []
        for spec, name, start, end in steps:
            layer = by_name.get(name)
            node = spec.graph.nodes[layer.node_index] if layer is not None else None
            launches = spec.launches[start:end]
            rows.append(LayerTime(
                name, node.qualified_op if node is not None else "?",
                str(layer.tactic.get("name", "?")) if layer is not None else "?",
                layer.plugin if layer is not None else "?", len(launches),
                sum(_volume(launch.grid) for launch in launches),
                sum(_volume(launch.grid) * _volume(launch.block) for launch in launches)))
        events = None if simulated() else _events(len(rows) + 1)
        for _ in range(int(runs)):
            for row, ms in zip(rows, _run_layers(steps, stream, events)):
                row.times_ms.append(ms)
    return rows


def _run_layers(steps: list, stream, events) -> list[float]:
    """Launch every layer once on ``stream`` (``steps``: each layer's specialization and
    launch range, through every specialization of a run: a data-dependent layer reports
    the same sizes again); each layer's milliseconds."""
    if events is None:  # the simulator: host clocks
        times = []
        for spec, _, start, end in steps:
            began = time.perf_counter()
            for launch in spec.launches[start:end]:
                launch(stream)
            times.append((time.perf_counter() - began) * 1e3)
        return times
    for event, (spec, _, start, end) in zip(events, steps):
        event.record(stream)
        for launch in spec.launches[start:end]:
            launch(stream)
    events[-1].record(stream)
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(len(events) - 1)]


def _events(count: int) -> list:
    from numba import cuda

    return [cuda.event() for _ in range(count)]


def _volume(dims) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def profile_json(rows: list[LayerTime]) -> dict:
    """The ``profile`` section of a bench report."""
    total = sum(row.median_ms for row in rows)
    return {"layers": [row.as_json(total) for row in rows], "total_median_ms": total,
            "runs": len(rows[0].times_ms) if rows else 0,
            "timing": "host clocks (simulator)" if simulated() else "CUDA events between layers"}


def print_profile(profile: dict, limit: int | None = None) -> None:
    """The per-layer table, slowest first when ``limit`` cuts it."""
    layers = profile["layers"]
    print(f"per-layer profile ({profile['runs']} runs, {profile['timing']}; direct launches): "
          f"{len(layers)} layers, {profile['total_median_ms']:.4f} ms in all")
    shown = layers if limit is None or limit >= len(layers) else \
        sorted(layers, key=lambda row: -row["median_ms"])[:limit]
    width = max([len(row["name"]) for row in shown] + [5])
    print(f"{'layer':{width}s}  {'median ms':>9s}  {'%':>5s}  {'kernels':>7s}  {'blocks':>7s}  op / tactic")
    for row in shown:
        print(f"{row['name']:{width}s}  {row['median_ms']:9.4f}  {row['percent']:5.1f}  {row['kernels']:7d}  "
              f"{row['blocks']:7d}  {row['op']} / {row['tactic']}")
    if len(shown) < len(layers):
        print(f"({len(layers) - len(shown)} faster layers not shown; --json has them all)")
