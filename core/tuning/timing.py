"""Running one layer's tactics on the device: inputs, verification and CUDA-event timing.

A :class:`LayerBench` holds everything one layer needs to run outside an engine, at the
concrete (opt) shapes of a graph: device inputs (constants and weights with their real
values; every other input random, in :data:`ROTATING_SETS` sets so that repeated runs do
not find their inputs in the L2 cache), output buffers per set, and a workspace.

:meth:`LayerBench.trial` prepares a tactic's launches for every set
(:class:`~plugrt.launcher.PreparedLaunch`) and runs it once on set 0; its outputs
are then compared with the reference tactic's (:func:`verify`). A :class:`TacticRun`
is what a measure function gets: ``enqueue(i)`` replays the tactic on set ``i % sets``.
The default measure, :func:`cuda_event_median`, is the median of CUDA-event timings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Input (and output) buffer sets a timed tactic rotates through.
ROTATING_SETS = 3
#: Fewer sets when one set would take more than this many bytes.
LARGE_SET_BYTES = 1 << 29
#: Untimed runs before timing, and timed runs whose median is the tactic's time.
WARMUP_RUNS = 2
TIMED_RUNS = 10
#: Verification tolerances (rtol, atol) by output dtype; exact for integers and booleans.
TOLERANCES = {np.dtype(np.float16): (1e-2, 1e-2), np.dtype(np.float32): (1e-3, 1e-3),
              np.dtype(np.float64): (1e-6, 1e-6)}
#: A TF32 tactic (or a TF32 reference) may differ by this much relative to max |reference|.
TF32_TOLERANCE = 5e-3


@dataclass
class TacticRun:
    """One tactic of one layer, prepared for every buffer set, on ``stream``."""

    tactic: object
    node: object
    launches: list  # one list of PreparedLaunch per buffer set
    stream: object
    #: The shape of each of the node's inputs and outputs, by name, as timed.
    shapes: dict = field(default_factory=dict)

    def enqueue(self, iteration: int) -> None:
        """Enqueue the tactic's launches on buffer set ``iteration % sets``."""
        for launch in self.launches[iteration % len(self.launches)]:
            launch(self.stream)


def cuda_event_median(run: TacticRun, warmup: int = WARMUP_RUNS, repeats: int = TIMED_RUNS) -> float:
    """Median milliseconds of ``repeats`` runs, timed with CUDA events after ``warmup``.

    The runs are enqueued back to back, an event between each two, and the stream is
    synchronized once, so the host's launch time overlaps the GPU's work.
    """
    from numba import cuda

    for i in range(warmup):
        run.enqueue(i)
    events = [cuda.event() for _ in range(repeats + 1)]
    events[0].record(run.stream)
    for i in range(repeats):
        run.enqueue(warmup + i)
        events[i + 1].record(run.stream)
    events[-1].synchronize()
    times = [events[i].elapsed_time(events[i + 1]) for i in range(repeats)]
    return float(np.median(times))


class LayerBench:
    """One layer's inputs, outputs and workspace on the device (see the module doc)."""

    def __init__(self, node, graph, workspace_bytes: int, seed: int = 0, registry=None):
        from numba import cuda

        self.node = node
        self.graph = graph
        #: Names the tactics' kernels for the kernel cache (:mod:`plugrt.tuning.kernel_keys`).
        self.registry = registry
        self.stream = cuda.stream()
        rng = np.random.default_rng(seed)
        one_set = sum(_nbytes(graph.info(n)) for n in list(node.inputs) + list(node.outputs)
                      if n and graph.info(n).value is None)
        sets = ROTATING_SETS if one_set <= LARGE_SET_BYTES else 2
        known = {name: cuda.to_device(np.ascontiguousarray(graph.info(name).value))
                 for name in dict.fromkeys(node.inputs) if name and graph.info(name).value is not None}
        # The same values in every set (rotation is about addresses, not values): drawing
        # them once saves seconds per large layer.
        values = {name: bench_input(rng, graph.info(name)) for name in dict.fromkeys(node.inputs)
                  if name and name not in known}
        self.inputs = []
        for _ in range(sets):
            arrays = dict(known)  # an input named twice is one array
            arrays.update({name: cuda.to_device(value) for name, value in values.items()})
            self.inputs.append([arrays[name] if name else None for name in node.inputs])
        self.outputs = [[cuda.device_array(_shape(graph.info(name)), graph.info(name).dtype) if name else None
                         for name in node.outputs] for _ in range(sets)]
        self.workspace = cuda.device_array(workspace_bytes, np.uint8) if workspace_bytes else None

    def trial(self, tactic) -> tuple[TacticRun, list]:
        """Prepare ``tactic`` for every set, run it once on set 0; its run and outputs.

        Exceptions from the tactic (preparing or running) propagate to the caller.
        """
        from plugrt.launcher import PreparedLaunch
        from plugrt.tuning.kernel_keys import launch_keys, layer_key

        workspace = self.workspace[:tactic.workspace_bytes] if tactic.workspace_bytes else None
        key = layer_key(self.registry, self.node, self.graph, tactic) if self.registry is not None else None
        launches = []
        for ins, outs in zip(self.inputs, self.outputs):
            made = tactic.launches(ins, outs, workspace)
            launches.append([PreparedLaunch(launch, k) for launch, k in zip(made, launch_keys(key, made))])
        shapes = {name: _shape(self.graph.info(name)) for name in list(self.node.inputs) + list(self.node.outputs)
                  if name}
        run = TacticRun(tactic, self.node, launches, self.stream, shapes)
        run.enqueue(0)
        self.stream.synchronize()
        return run, [None if out is None else out.copy_to_host() for out in self.outputs[0]]

    def poison(self, reference: list) -> None:
        """Fill set 0's outputs with values unlike ``reference``'s, so that a tactic that
        leaves an output unwritten cannot pass verification on the reference's results."""
        for out, ref in zip(self.outputs[0], reference):
            if out is not None and ref is not None and ref.size:
                out.copy_to_device(np.ascontiguousarray(_unlike(ref)), stream=self.stream)
        self.stream.synchronize()


def bench_input(rng: np.random.Generator, info) -> np.ndarray:
    """A random input for timing: normal floats, booleans, integers 1 or 2 (never zero, so
    divisions stay defined and index-like inputs stay small and valid)."""
    shape = _shape(info)
    if info.dtype in (np.float32, np.float64):
        return rng.standard_normal(shape, dtype=info.dtype)
    if info.dtype.kind == "f":
        return rng.standard_normal(shape, dtype=np.float32).astype(info.dtype)
    if info.dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(1, 3, shape).astype(info.dtype)


def verify(got: list, want: list, tf32: bool) -> str | None:
    """``None`` when every output matches the reference's; else what differs.

    Floats: ``|got - want| <= atol + rtol * |want|`` by dtype (:data:`TOLERANCES`), or,
    when ``tf32``, ``max |got - want| <= TF32_TOLERANCE * max |want|``; NaNs must match.
    Integers and booleans: exactly.
    """
    for index, (g, w) in enumerate(zip(got, want)):
        if g is None or w is None:
            continue
        if w.dtype.kind != "f":
            if not np.array_equal(g, w):
                return f"output {index} differs in {int(np.sum(g != w))} of {w.size} elements"
            continue
        g64, w64 = np.atleast_1d(g).astype(np.float64), np.atleast_1d(w).astype(np.float64)  # 0-d too
        if not np.array_equal(np.isnan(g64), np.isnan(w64)):
            return f"output {index} has NaNs where the reference has none, or the other way round"
        finite = ~np.isnan(w64)
        error = np.abs(np.where(finite, g64 - w64, 0.0))
        error[np.isinf(w64) & (g64 == w64)] = 0.0
        if tf32:
            scale = float(np.max(np.abs(w64[np.isfinite(w64)]), initial=0.0))
            worst = float(np.max(error, initial=0.0))
            if not worst <= TF32_TOLERANCE * scale + 1e-6:
                return f"output {index}: max error {worst:.3g} exceeds {TF32_TOLERANCE:g} * max |reference| {scale:.3g}"
            continue
        rtol, atol = TOLERANCES.get(w.dtype, TOLERANCES[np.dtype(np.float32)])
        bad = ~(error <= atol + rtol * np.abs(np.where(finite, w64, 0.0)))
        if np.any(bad):
            return (f"output {index} differs in {int(np.sum(bad))} of {w.size} elements "
                    f"(max error {float(np.max(np.where(np.isfinite(error), error, np.inf))):.3g}; "
                    f"rtol {rtol:g}, atol {atol:g})")
    return None


def _unlike(reference: np.ndarray) -> np.ndarray:
    if reference.dtype.kind == "f":
        return np.where(np.isnan(reference), 0, np.nan).astype(reference.dtype)
    if reference.dtype.kind == "b":
        return ~reference
    return reference ^ np.ones((), reference.dtype)


def _shape(info) -> tuple[int, ...]:
    return tuple(int(d) for d in info.shape)


def _nbytes(info) -> int:
    return int(np.prod(_shape(info), dtype=np.int64)) * info.dtype.itemsize
