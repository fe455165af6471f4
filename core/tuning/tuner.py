"""The auto-tuner: choose each device layer's tactic, by timing where it can.

For one layer at the profile's opt shapes the candidates are the plugin's tactics in its
preference order, then those other plugins contribute (``plugrt_tactics``), less those on
TF32 tensor cores when ``BuilderConfig.tf32`` is off (:func:`plugrt.tactic.allowed`).
``BuilderConfig.optimization_level`` (TensorRT's 0..5, default 3) says how many are timed:

- 0: heuristics only: the plugin's first tactic, nothing timed;
- 1 to 4: the plausible ones: the first :data:`TACTICS_BY_LEVEL` ``[level]`` in preference
  order (2, 3, 3, 6; the default level's :data:`PLAUSIBLE_TACTICS` is 3): a plugin lists its
  tactics best first, so the rest rarely win and every one timed costs a kernel compile.
  The count holds for the op's plugin and for each contributing plugin alike: a tactic
  someone installed to be faster is always timed;
- 5: all of them.

In the CUDA simulator nothing is timed (its times mean nothing): the first tactic wins,
unless a measure function is given, which tests use to run the whole timing path,
verification included, in the simulator. A layer with one candidate is not timed either.

Timing (:mod:`plugrt.tuning.timing`): the reference tactic (the first candidate that
does not use TF32) runs once on random inputs; every candidate not yet in the timing
cache then runs once and its outputs are compared with the reference's. A candidate that
raises or gives different results is dropped with a warning and recorded as failed, so
it is never chosen for this layer key; the others are timed (median of CUDA-event
timings) and the fastest wins, ties going to the plugin's preference. Times land in the
:class:`~plugrt.tuning.timing_cache.TimingCache`; when it knows every candidate already,
nothing runs on the GPU and the choice is the same as the build that filled it.
"""

from __future__ import annotations

import logging
import shutil
import sys
from dataclasses import dataclass
from typing import Callable

from plugrt.device import describe as describe_device
from plugrt.device import simulated
from plugrt.errors import PlugrtError
from plugrt.tactic import allowed, uses_tf32
from plugrt.tuning.timing import LayerBench, TacticRun, cuda_event_median, verify
from plugrt.tuning.timing_cache import FAILED, TimingCache, layer_key, tactic_key

log = logging.getLogger("plugrt.tuning")

#: Tactics timed at optimization levels 0..4, the first in the plugin's order. On the H200
#: the winners of ResNet-18's layers at batch 32 were all among the first three (of four
#: timed); each tactic timed is a kernel compile (about 1-2 s), and a cold build must stay
#: under a minute.
TACTICS_BY_LEVEL = (0, 2, 3, 3, 6)
#: The default level's count.
PLAUSIBLE_TACTICS = TACTICS_BY_LEVEL[3]
HEURISTIC_LEVEL = 0
EXHAUSTIVE_LEVEL = 5

#: ``measure(run) -> milliseconds``: times one verified tactic (see :class:`TacticRun`).
Measure = Callable[[TacticRun], float]


@dataclass(frozen=True)
class Choice:
    """The tactic chosen for a layer; its median time and the runner-up's when timed."""

    tactic: object
    time_ms: float | None = None
    #: ``{"name", "params", "time_ms"}`` of the second fastest verified tactic.
    runner_up: dict | None = None


class Tuner:
    """Chooses tactics for one build (see the module doc).

    :param config: the :class:`~plugrt.engine.profile.BuilderConfig` (optimization level,
        tf32, progress).
    :param cache: timings known before the build; new ones are recorded in it.
    :param measure: replaces :func:`~plugrt.tuning.timing.cuda_event_median`; given one,
        tactics are timed (and verified) even in the CUDA simulator.
    :param device: the device the key names (default: :func:`plugrt.device.describe`).
    :param stream: where progress goes (default: stderr; only to a terminal).
    :param registry: names timed tactics' kernels for the kernel cache (without one they
        are compiled every build).
    """

    def __init__(self, config, cache: TimingCache | None = None, measure: Measure | None = None,
                 device: dict | None = None, stream=None, registry=None):
        level = config.optimization_level
        if isinstance(level, bool) or not isinstance(level, int) or not HEURISTIC_LEVEL <= level <= EXHAUSTIVE_LEVEL:
            raise PlugrtError(f"optimization level {level!r} is not one of 0..5 (0: the plugins' first tactics, "
                              f"1-4: time the first {', '.join(map(str, TACTICS_BY_LEVEL[1:]))} of each layer, 5: time all)")
        self.level = level
        self.tf32 = bool(config.tf32)
        self.cache = cache if cache is not None else TimingCache()
        self.timing = measure is not None or not simulated()
        self.measure = measure or cuda_event_median
        self.device = device if device is not None else describe_device()
        self.progress = Progress(stream if stream is not None else sys.stderr, config.progress)
        #: Tactics measured, and timings (failures included) recorded in the cache, so far.
        self.measured = 0
        self.recorded = 0
        self.registry = registry

    @property
    def times(self) -> bool:
        """Whether this tuner times tactics at all (a GPU or a given measure; level >= 1)."""
        return self.timing and self.level != HEURISTIC_LEVEL

    def allowed(self, tactics) -> list:
        """The candidates: ``tactics`` in order, less TF32 ones when TF32 is off."""
        return allowed(tactics, self.tf32)

    def to_time(self, candidates) -> list:
        """The candidates this level times, none when there is no choice to make: the first
        few of the op's own plugin and as many of each plugin that contributes tactics."""
        if not self.timing or self.level == HEURISTIC_LEVEL:
            return []
        if self.level == EXHAUSTIVE_LEVEL:
            chosen = list(candidates)
        else:
            taken: dict = {}
            chosen = []
            for tactic in candidates:
                provider = getattr(tactic, "provider", None)
                taken[provider] = taken.get(provider, 0) + 1
                if taken[provider] <= TACTICS_BY_LEVEL[self.level]:
                    chosen.append(tactic)
        return chosen if len(chosen) > 1 else []

    def choose(self, node, graph, op, owner, tactics, position: tuple[int, int] = (1, 1),
               always_time: bool = False) -> Choice:
        """Choose among ``tactics`` (the plugin's, at ``graph``'s concrete shapes) for
        ``node``; ``position`` is (layer number, layer count) for the progress line.
        ``always_time``: time the choice even when there is only one candidate (when this
        tuner times at all), as comparing precisions needs."""
        candidates = self.allowed(tactics)
        if not candidates:
            raise PlugrtError(f"{node.describe()}: every tactic of plugin {owner.name!r} uses TF32, which the "
                              "builder config forbids (tf32=False); allow TF32 (drop --no-tf32)")
        timed = self.to_time(candidates)
        if not timed and always_time and self.times:
            timed = candidates[:1]
        if not timed or all(not name or 0 in graph.info(name).shape for name in node.outputs) \
                or node.name in graph.data_dependent:  # (its outputs' sizes are data: it is not timed)
            return Choice(candidates[0])
        key = layer_key(node, graph, op, owner, self.device)
        pending = [t for t in timed if self.cache.lookup(key, tactic_key(t)) is None]
        if pending:
            number, total = position
            self.progress.show(f"timing layer {number}/{total} {node.name} ({len(pending)} tactics)")
            self._time(node, graph, key, candidates, pending)
        return self._pick(node, key, candidates, timed)

    def finish(self) -> None:
        """Clear the progress line."""
        self.progress.finish()

    # ------------------------------------------------------------------ timing

    def _time(self, node, graph, key: str, candidates: list, pending: list) -> None:
        """Verify and time ``pending`` against the reference; record the results."""
        workspace = max(int(t.workspace_bytes) for t in candidates)
        bench = LayerBench(node, graph, workspace, registry=self.registry)
        plain = [t for t in candidates if not uses_tf32(t)]
        reference = reference_run = reference_outputs = None
        for tactic in plain + [t for t in candidates if not _holds(plain, t)]:
            try:
                reference_run, reference_outputs = bench.trial(tactic)
            except Exception as exc:
                self._reject(node, key, tactic, pending, f"raised {type(exc).__name__}: {exc}")
                continue
            reference = tactic
            break
        if reference is None:
            return
        for tactic in pending:
            if tactic is reference:
                run = reference_run
            else:
                bench.poison(reference_outputs)
                try:
                    run, outputs = bench.trial(tactic)
                except Exception as exc:
                    self._reject(node, key, tactic, pending, f"raised {type(exc).__name__}: {exc}")
                    continue
                problem = verify(outputs, reference_outputs, uses_tf32(tactic) or uses_tf32(reference))
                if problem:
                    why = f"gives results unlike tactic {reference.name!r}: {problem}"
                    self._reject(node, key, tactic, pending, why)
                    continue
            try:
                ms = float(self.measure(run))
            except Exception as exc:
                self._reject(node, key, tactic, pending, f"raised {type(exc).__name__} while timed: {exc}")
                continue
            self.measured += 1
            self._record(key, tactic, ms)

    def _reject(self, node, key: str, tactic, pending: list, why: str) -> None:
        log.warning("%s: tactic %r %s; it is not used", node.describe(), tactic.name, why)
        if _holds(pending, tactic):
            self._record(key, tactic, FAILED)

    def _record(self, key: str, tactic, ms: float) -> None:
        self.cache.record(key, tactic_key(tactic), ms)
        self.recorded += 1

    def _pick(self, node, key: str, candidates: list, timed: list) -> Choice:
        scored = []
        for preference, tactic in enumerate(timed):
            ms = self.cache.lookup(key, tactic_key(tactic))
            if ms is not None and ms != FAILED:
                scored.append((ms, preference, tactic))
        if not scored:
            log.warning("%s: no timed tactic ran correctly; using the plugin's first, %r, untimed",
                        node.describe(), candidates[0].name)
            return Choice(candidates[0])
        scored.sort(key=lambda entry: entry[:2])
        ms, _, best = scored[0]
        runner_up = None
        if len(scored) > 1:
            second_ms, _, second = scored[1]
            runner_up = {**second.identity(), "time_ms": second_ms}
        log.info("%s: tactic %r %.4f ms (%d of %d timed ran correctly)", node.describe(), best.name, ms,
                 len(scored), len(timed))
        return Choice(best, ms, runner_up)


def _holds(tactics: list, tactic) -> bool:
    return any(t is tactic for t in tactics)


class Progress:
    """One updating status line on a terminal; silent when off or not a terminal."""

    def __init__(self, stream, enabled: bool = True):
        isatty = getattr(stream, "isatty", None)
        self.stream = stream
        self.enabled = bool(enabled) and callable(isatty) and bool(isatty())
        self._width = 0

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        text = text[:max(20, shutil.get_terminal_size().columns - 1)]
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def finish(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        self._width = 0
