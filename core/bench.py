"""Measuring an engine the way trtexec does (``plugrt bench``; :func:`run_benchmark` from Python).

Each of ``streams`` execution contexts (one thread each, its own CUDA stream) runs one
untimed query (it specializes the context for the shapes and captures its CUDA graph),
``warmup`` more untimed, then timed queries until it has run ``iterations`` and ``duration``
seconds have passed since all began: both minimums, trtexec's rule. A query is: copy the
inputs in (H2D, from pinned host buffers), enqueue the compute, copy the outputs out (D2H,
into pinned host buffers), wait for the stream. CUDA events split it into H2D, GPU compute
and D2H; ``time.perf_counter`` around ``enqueue`` is the host enqueue time. Without data
transfers the inputs are copied in once, from device arrays, and a query is the compute
alone, its outputs left on the device.

In Numba's CUDA simulator there are no CUDA events: every time is taken with host clocks
(the kernels run on the host during ``enqueue``), which :attr:`BenchResult.timing` says.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from plugrt.bindings import random_input
from plugrt.device import check_devices, current_device_id, identify, make_current, simulated
from plugrt.errors import PlugrtError

#: (warmup queries, minimum timed queries, minimum seconds): trtexec's counts on a GPU;
#: a few queries in the simulator, where one costs ~0.1 ms per simulated thread.
GPU_DEFAULTS = (10, 10, 3.0)
SIMULATOR_DEFAULTS = (1, 3, 0.0)
#: Most contexts one benchmark runs at once.
MAX_STREAMS = 64
#: The statistics reported for every per-query time.
STATISTICS = ("min", "mean", "median", "p90", "p99", "max")
EVENT_TIMING = "CUDA events (GPU times), time.perf_counter (host times)"
HOST_TIMING = "host clocks only: Numba's CUDA simulator has no CUDA events (numbers meaningless)"


def default_settings() -> tuple[int, int, float]:
    """(warmup, iterations, duration) for the backend in use."""
    return SIMULATOR_DEFAULTS if simulated() else GPU_DEFAULTS


def resolve_shapes(engine, shapes: Mapping[str, tuple] | None = None, option: str = "shapes",
                   profile: int = 0) -> dict[str, tuple]:
    """Every input's shape: the given one, checked against optimization profile
    ``profile``, else its opt shape. Messages name ``option`` (the CLI's ``--shapes``)."""
    shapes = dict(shapes or {})
    index, profile = profile, _profile(engine, profile)
    unknown = [name for name in shapes if name not in engine.input_names]
    if unknown:
        raise PlugrtError(f"{option}: {', '.join(map(repr, unknown))} is not an input of the engine; the inputs "
                          f"are {', '.join(map(repr, engine.input_names))}")
    resolved = {}
    for name in engine.input_names:
        low, opt, high = profile.shapes[name]
        shape = tuple(int(d) for d in shapes.get(name, opt))
        if len(shape) != len(low) or not all(a <= d <= c for a, d, c in zip(low, shape, high)):
            label = "x".join(map(str, shape))
            where = f"profile {index}" if len(engine.profiles) > 1 else "profile"
            raise PlugrtError(f"{option} {name}:{label}: outside the engine's {where} for input {name!r} (min "
                              f"{list(low)}, max {list(high)}); give a shape within it, select another profile "
                              "(--profile), or build with a wider profile (--min-shapes/--max-shapes)")
        resolved[name] = shape
    return resolved


def random_feeds(engine, shapes: Mapping[str, tuple] | None = None, seed: int = 0,
                 profile: int = 0) -> dict[str, np.ndarray]:
    """Random inputs (never zeros) at ``shapes`` (default: optimization profile
    ``profile``'s opt shapes); a shape-tensor input gets the values the engine was built for."""
    return graph_feeds(engine.graph, _profile(engine, profile), shapes, seed)


def _profile(engine, index: int):
    # (the context's own check is plugrt.engine.profile.profile_index; bench sits below the
    # engine in the layer order, and names the flag)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(engine.profiles):
        raise PlugrtError(f"--profile {index}: the engine has {len(engine.profiles)} optimization profile(s), "
                          f"0 to {len(engine.profiles) - 1}")
    return engine.profiles[index]


def graph_feeds(graph, profile, shapes: Mapping[str, tuple] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """:func:`random_feeds` for a graph and its optimization profile (before an engine exists)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        info = graph.info(name)
        shape = (shapes or {}).get(name, profile.shapes[name][1])
        if name in profile.shape_values:
            feeds[name] = np.asarray(profile.shape_values[name], info.dtype).reshape(shape)
        else:
            feeds[name] = random_input(rng, info.dtype, shape)
    return feeds


def statistics(values_ms: list[float]) -> dict[str, float] | None:
    """min, mean, median, p90, p99 and max of ``values_ms``; ``None`` for no values."""
    if not values_ms:
        return None
    values = np.asarray(values_ms, dtype=np.float64)
    return {"min": float(values.min()), "mean": float(values.mean()), "median": float(np.median(values)),
            "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99)),
            "max": float(values.max())}


@dataclass
class BenchResult:
    """What :func:`run_benchmark` measured; times of each timed query in milliseconds."""

    shapes: dict[str, tuple]
    batch: int
    streams: int
    warmup: int
    iterations: int
    duration_s: float
    use_cuda_graph: bool
    data_transfers: bool
    timing: str
    walltime_s: float
    #: Timed queries run by each stream, and how many distinct threads ran them.
    queries_per_stream: list[int]
    threads: int
    #: A mix of input shapes (``mix`` of :func:`run_benchmark`): each set, and its batch;
    #: the queries cycle through them. Empty for one set of shapes (``shapes``).
    mix: list = field(default_factory=list)
    mix_batches: list = field(default_factory=list)
    #: Each device the contexts ran on (:func:`plugrt.device.identify`), with its timed
    #: queries and inferences/s: ``streams`` contexts each (``run_benchmark(devices=)``).
    devices: list = field(default_factory=list)
    #: Kernels compiled while the benchmark ran (a plan carries its kernels: 0 expected on a
    #: GPU of the architecture it was built on, whichever of them runs it).
    kernels_compiled: int = 0
    latency_ms: list[float] = field(default_factory=list)
    compute_ms: list[float] = field(default_factory=list)
    enqueue_ms: list[float] = field(default_factory=list)
    h2d_ms: list[float] = field(default_factory=list)
    d2h_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)

    @property
    def queries(self) -> int:
        return sum(self.queries_per_stream)

    @property
    def queries_per_s(self) -> float:
        return self.queries / self.walltime_s if self.walltime_s > 0 else 0.0

    @property
    def inferences_per_s(self) -> float:
        """``batch`` (a mix's mean batch) x queries / wall seconds of the timed phase."""
        batch = sum(self.mix_batches) / len(self.mix_batches) if self.mix_batches else self.batch
        return batch * self.queries_per_s

    def as_json(self) -> dict:
        return {
            "settings": {"shapes": {name: list(shape) for name, shape in self.shapes.items()},
                         "mix": [{name: list(shape) for name, shape in s.items()} for s in self.mix],
                         "batch": self.batch, "streams": self.streams, "warmup": self.warmup,
                         "iterations": self.iterations, "duration_s": self.duration_s,
                         "use_cuda_graph": self.use_cuda_graph, "data_transfers": self.data_transfers},
            "timing": self.timing, "simulator": self.timing == HOST_TIMING,
            "queries": self.queries, "queries_per_stream": list(self.queries_per_stream), "threads": self.threads,
            "walltime_s": self.walltime_s, "devices": list(self.devices), "kernels_compiled": self.kernels_compiled,
            "throughput": {"queries_per_s": self.queries_per_s, "inferences_per_s": self.inferences_per_s,
                           "batch": self.batch},
            "latency_ms": statistics(self.latency_ms), "gpu_compute_ms": statistics(self.compute_ms),
            "host_enqueue_ms": statistics(self.enqueue_ms), "h2d_ms": statistics(self.h2d_ms),
            "d2h_ms": statistics(self.d2h_ms), "host_walltime_ms": statistics(self.host_ms),
        }


def run_benchmark(engine, shapes: Mapping[str, tuple] | None = None, *, warmup: int | None = None,
                  iterations: int | None = None, duration: float | None = None, streams: int = 1,
                  use_cuda_graph: bool = True, data_transfers: bool = True, seed: int = 0,
                  progress: Callable[[str], None] | None = None, profile: int = 0,
                  mix: list | None = None, devices: list[int] | None = None) -> BenchResult:
    """Measure ``engine`` at ``shapes`` (default: the opt shapes) as the module doc says;
    ``None`` settings take :func:`default_settings`. ``progress`` is called now and then
    with one line of text, from the calling thread. ``mix``: several sets of shapes
    instead, each stream's queries cycling through them (each set's first query
    specializes the context and captures its graph, untimed). ``devices``: GPUs to run
    on at once (data parallel), ``streams`` contexts on each, the engine's weights
    uploaded to each; default: the current device."""
    from plugrt import binaries

    defaults = default_settings()
    warmup = defaults[0] if warmup is None else warmup
    iterations = defaults[1] if iterations is None else iterations
    duration = defaults[2] if duration is None else duration
    _check_settings(warmup, iterations, duration, streams)
    home = current_device_id()
    devices = check_devices(list(devices)) if devices is not None else [home]
    if streams * len(devices) > MAX_STREAMS:
        raise PlugrtError(f"bench: at most {MAX_STREAMS} contexts run at once; {streams} streams on each of "
                          f"{len(devices)} devices make {streams * len(devices)}")
    sets = [resolve_shapes(engine, s, profile=profile) for s in (mix or [shapes])]
    feeds = [random_feeds(engine, s, seed + k, profile) for k, s in enumerate(sets)]
    batches = [int(s[engine.input_names[0]][0]) if engine.input_names and s[engine.input_names[0]] else 1
               for s in sets]
    shapes, batch = sets[0], batches[0]
    compiled = binaries.stats()["compiled"]
    with ExitStack() as stack:
        runners = []
        try:
            for device in devices:
                make_current(device)  # the contexts' arenas, streams and weights on this device
                for _ in range(streams):
                    context = stack.enter_context(engine.create_execution_context(use_cuda_graph=use_cuda_graph,
                                                                                  profile=profile))
                    runners.append(_StreamRunner(context, feeds, data_transfers))
        finally:
            make_current(home)
        walltime = _run_threads(runners, warmup + len(sets) - 1, iterations, duration,
                                progress or (lambda text: None))
    result = BenchResult(shapes, batch, streams, warmup, iterations, float(duration), use_cuda_graph, data_transfers,
                         HOST_TIMING if simulated() else EVENT_TIMING, walltime,
                         [len(r.samples) for r in runners], len({r.thread for r in runners if r.samples}),
                         sets if len(sets) > 1 else [], batches if len(sets) > 1 else [])
    result.kernels_compiled = binaries.stats()["compiled"] - compiled
    mean_batch = sum(batches) / len(batches)
    for device in devices:
        queries = sum(len(r.samples) for r in runners if r.context.device_id == device)
        result.devices.append({**identify(device), "contexts": streams, "queries": queries,
                               "inferences_per_s": mean_batch * queries / walltime if walltime > 0 else 0.0})
    for runner in runners:
        for latency, h2d, compute, d2h, enqueue, host in runner.samples:
            result.latency_ms.append(latency)
            result.compute_ms.append(compute)
            result.enqueue_ms.append(enqueue)
            result.host_ms.append(host)
            if data_transfers:
                result.h2d_ms.append(h2d)
                result.d2h_ms.append(d2h)
    return result


def _check_settings(warmup, iterations, duration, streams) -> None:
    for name, value, low in (("warmup", warmup, 0), ("iterations", iterations, 1), ("streams", streams, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise PlugrtError(f"bench {name} must be a whole number >= {low}, got {value!r}")
    if streams > MAX_STREAMS:
        raise PlugrtError(f"bench streams: at most {MAX_STREAMS} contexts run at once, got {streams}")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < float("inf"):
        raise PlugrtError(f"bench duration must be a finite number of seconds >= 0, got {duration!r}")


class _StreamRunner:
    """One context on its own stream, and the queries it ran: (latency, H2D, compute, D2H,
    enqueue, host) in ms each."""

    def __init__(self, context, feeds: list, data_transfers: bool):
        from numba import cuda

        self.context = context
        self.stream = context.stream
        self.data_transfers = data_transfers
        self.events = [cuda.event() for _ in range(4)]
        self.outputs: dict[str, np.ndarray] = {}
        self.samples: list[tuple] = []
        self.thread: int | None = None
        self.turn = 0
        if data_transfers:
            self.sets = [{name: _pinned(array) for name, array in one.items()} for one in feeds]
        else:
            self.sets = [{name: cuda.to_device(array) for name, array in one.items()} for one in feeds]
            context.copy_inputs(self.sets[0], self.stream)  # once: the inputs stay in place
            self.stream.synchronize()

    def query(self) -> tuple:
        context, stream, events = self.context, self.stream, self.events
        feeds = self.sets[self.turn % len(self.sets)]
        self.turn += 1
        started = time.perf_counter()
        events[0].record(stream)
        if self.data_transfers:
            context.copy_inputs(feeds, stream)
        elif len(self.sets) > 1:  # device inputs: bound in place, not copied
            context.copy_inputs(feeds, stream)
        events[1].record(stream)
        copied = time.perf_counter()
        context.enqueue(stream)
        enqueued = time.perf_counter()
        events[2].record(stream)
        if self.data_transfers:
            for name, value in context.output_arrays().items():
                if not isinstance(value, np.ndarray) and value.size:
                    value.copy_to_host(self._host_buffer(name, value), stream=stream)
        events[3].record(stream)
        events[3].synchronize()
        done = time.perf_counter()
        if simulated():
            h2d, compute, d2h = (copied - started) * 1e3, (enqueued - copied) * 1e3, (done - enqueued) * 1e3
            latency = (done - started) * 1e3
        else:
            h2d, compute, d2h = (events[i].elapsed_time(events[i + 1]) for i in range(3))
            latency = events[0].elapsed_time(events[3])
        return latency, h2d, compute, d2h, (enqueued - copied) * 1e3, (done - started) * 1e3

    def _host_buffer(self, name: str, value) -> np.ndarray:
        from numba import cuda

        buffer = self.outputs.get(name)
        if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
            buffer = self.outputs[name] = cuda.pinned_array(value.shape, value.dtype)
        return buffer


def _pinned(array: np.ndarray):
    from numba import cuda

    pinned = cuda.pinned_array(array.shape, array.dtype)
    pinned[...] = array
    return pinned


def _run_threads(runners: list[_StreamRunner], warmup: int, iterations: int, duration: float,
                 progress: Callable[[str], None]) -> float:
    """Run every runner in its own thread; the timed phase's wall seconds."""
    clock = {"start": 0.0}
    ends: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def begin() -> None:  # run by one thread when all have warmed up, before any is released
        clock["start"] = time.perf_counter()

    barrier = threading.Barrier(len(runners), action=begin)

    def work(runner: _StreamRunner) -> None:
        runner.thread = threading.get_ident()
        try:
            make_current(runner.context.device_id)  # the context's device, current in this thread
            for _ in range(1 + warmup):
                runner.query()
            barrier.wait()
            while not stop.is_set() and (len(runner.samples) < iterations
                                         or time.perf_counter() - clock["start"] < duration):
                runner.samples.append(runner.query())
            ends.append(time.perf_counter())
        except threading.BrokenBarrierError:
            pass  # another stream failed before the timed phase
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(exc)
            stop.set()
            barrier.abort()

    threads = [threading.Thread(target=work, args=(runner,), name=f"plugrt-bench-{i}", daemon=True)
               for i, runner in enumerate(runners)]
    for thread in threads:
        thread.start()
    try:
        alive = threads
        while alive:
            alive[0].join(0.2)
            alive = [thread for thread in threads if thread.is_alive()]
            done = sum(len(r.samples) for r in runners)
            if clock["start"]:
                progress(f"bench: {done} queries, {time.perf_counter() - clock['start']:.1f} s")
            else:
                progress("bench: warming up")
    except KeyboardInterrupt:
        stop.set()
        barrier.abort()
        raise
    if errors:
        raise errors[0]
    return max(ends) - clock["start"]
