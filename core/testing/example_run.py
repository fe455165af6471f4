"""One claimed example of one op, put through every conformance check.

:class:`ExampleRun` builds the one-node model the example describes, imports it (the
plugin's ``check`` and ``infer`` run there), draws two sets of fresh random inputs and
computes the reference outputs for both. The checks then read shared, memoized work:
each tactic runs once on guarded buffers (first run and replay), and the plan round
trip runs once per tactic, so asking for one check or all six costs the same device time.

Checks, in dependency order (``tactics``, ``guards`` and ``plan`` need ``infer`` to pass):

- ``infer``: the model imports; ``infer`` gives the dtypes and shapes the reference
  produces (and its ``value``, when it claims one); ``infer`` on symbolic input dims does
  not crash and does not contradict the concrete shapes;
- ``tactics``: at least one tactic; names unique; JSON-safe parameters; every tactic
  matches the reference on fresh inputs, and again when its launch list is replayed on
  other inputs (as an execution context does); for ops that are not ``foldable`` (random
  generators) only dtypes and shapes are compared; an ``ANCHOR`` op's tactics run with a
  probe epilogue as well (:mod:`plugrt.testing.epilogue`);
- ``guards``: no tactic writes outside its outputs and declared workspace, reads out of
  bounds, or modifies its inputs;
- ``serialize``: ``serialize(node)`` returns JSON-safe data that survives a JSON round
  trip, the same on every call;
- ``plan``: a one-node engine from the real builder, saved as a plan file and loaded
  again, runs every tactic (the plan's record finds the same tactic again) and matches
  the reference; ``serialize`` gives the same data for the loaded node;
- ``pickle``: nothing above called pickle, and neither the plan files nor the
  plugin's data hold a pickle stream.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from typing import Mapping

import numpy as np

from plugrt.errors import ModelError, PlugrtError, ShapeError, UnsupportedError
from plugrt.ir.dims import format_shape, is_static
from plugrt.ir.tensor import TensorInfo
from plugrt.tactic import Tactic, uses_tf32
from plugrt.testing.comparison import canonical_json, compare, json_problems, json_round_trip, same_bytes
from plugrt.testing.declarations import declaration_failures, declared_well
from plugrt.testing.epilogue import Variant, epilogue_variants
from plugrt.testing.guards import run_guarded
from plugrt.testing.pickle_guard import PickleGuard, find_pickles, plan_pickles
from plugrt.testing.report import FAILED, PASSED, SKIPPED, CheckResult, Failure

CHECKS = ("infer", "tactics", "guards", "serialize", "plan", "pickle")
_NEEDS_INFER = ("tactics", "guards", "plan")


class ExampleRun:
    """The checks of example ``index`` of ``op``; :meth:`result` runs one (memoized).

    With ``provider`` (a :class:`~plugrt.plugin.TacticProvider` and the ``source`` its
    tactics carry), the tactics judged are the ones ``plugin`` contributes to ``op``."""

    def __init__(self, plugin: str, op, index: int, example, registry, seed: int = 0, plan_dir: str | None = None,
                 provider: tuple | None = None):
        self.plugin = plugin
        self.op = op
        self.provider = provider
        self.index = index
        self.example = example
        self.registry = registry
        self.seed = seed
        self.plan_dir = plan_dir
        self.op_label = f"{op.domain}::{op.op_type}" if op.domain else op.op_type
        self.label = _example_label(example, index)
        self.guard = PickleGuard()
        self._results: dict[str, CheckResult] = {}
        self._memo: dict[str, object] = {}
        self._setup_failures: list[Failure] | None = None

    # ------------------------------------------------------------------ public

    def result(self, check: str) -> CheckResult:
        if check not in CHECKS:
            raise PlugrtError(f"unknown conformance check {check!r}; the checks are {', '.join(CHECKS)}")
        if check not in self._results:
            started = time.perf_counter()
            result = self._run_check(check)
            result.seconds = time.perf_counter() - started
            self._results[check] = result
        return self._results[check]

    def failure(self, check: str, message: str, hint: str = "", tactic: str = "") -> Failure:
        return Failure(self.plugin, self.op_label, self.label, check, message, hint, tactic)

    # ------------------------------------------------------------------ dispatch

    def _run_check(self, check: str) -> CheckResult:
        setup = self._setup()
        if setup and check != "infer":
            return self._result(check, SKIPPED, [], "the example could not be set up (see the infer check)")
        if check in _NEEDS_INFER and self.result("infer").status != PASSED:
            return self._result(check, SKIPPED, [], "infer failed for this example; fix it first")
        failures = setup or getattr(self, f"_check_{check}")()
        return self._result(check, FAILED if failures else PASSED, failures)

    def _result(self, check: str, status: str, failures: list, detail: str = "") -> CheckResult:
        return CheckResult(self.plugin, self.op_label, self.label, check, status, failures, detail)

    @contextlib.contextmanager
    def watch(self, phase: str):
        with self.guard, self.guard.during(phase):
            yield

    # ------------------------------------------------------------------ setup

    def _setup(self) -> list[Failure]:
        """Build, import and feed the one-node model; failures belong to the infer check."""
        if self._setup_failures is not None:
            return self._setup_failures
        self._setup_failures = []
        try:
            self._build()
        except _SetupFailed as failed:
            self._setup_failures = [self.failure("infer", failed.message, failed.hint)]
        return self._setup_failures

    def _build(self) -> None:
        from plugrt.onnx.importer import import_model
        from plugrt.testing.model import example_model

        example, op = self.example, self.op
        try:
            self.model, self.feed_specs = example_model(op, example)
        except PlugrtError as exc:
            raise _SetupFailed(f"the Example is malformed: {exc}", "fix the Example returned by examples()") from None
        try:
            with self.watch("import"):
                self.graph = import_model(self.model, registry=self.registry)
        except ShapeError as exc:
            raise _SetupFailed(f"shape inference failed on the example: {exc}",
                               "infer() must accept every example the plugin claims") from None
        except UnsupportedError as exc:
            raise _SetupFailed(f"the plugin refuses its own example: {exc}",
                               "drop the example, or accept it in check()/dtypes") from None
        except ModelError as exc:
            raise _SetupFailed(f"the example's node is not valid for the op: {exc}",
                               "match the op's declared attributes and input/output counts") from None
        except Exception as exc:  # a plugin's bug (attribute handling, check()) must not stop the kit
            raise _SetupFailed(f"importing the example's one-node model failed: {type(exc).__name__}: {exc}",
                               "check() and infer() must accept every example the plugin claims") from None
        self.node = self.graph.nodes[0]
        rng = np.random.default_rng([self.seed, zlib.crc32(self.op_label.encode()), self.index])
        self.feeds = self._draw(rng)
        self.replay_feeds = self._draw(rng)
        self.expected = self._reference(self.feeds)
        self.replay_expected = self._reference(self.replay_feeds)

    def _draw(self, rng) -> dict[str, np.ndarray]:
        from plugrt.testing.model import draw_input

        feeds = {}
        for name in self.graph.inputs:
            info, index = self.graph.info(name), self.feed_specs[name]
            try:
                feeds[name] = draw_input(rng, info.dtype, tuple(info.shape), self.example.ranges.get(index))
            except PlugrtError as exc:
                raise _SetupFailed(f"cannot draw input {index}: {exc}", "fix Example.ranges") from None
        return feeds

    def _reference(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        args = self.node_inputs(feeds)
        try:
            with self.watch("reference()"), np.errstate(all="ignore"):
                results = [np.asarray(r) for r in self.op.reference(self.node, args)]
        except Exception as exc:
            raise _SetupFailed(f"reference() raised {type(exc).__name__}: {exc}",
                               "reference() must compute every example the plugin claims") from None
        if len(results) < len(self.node.outputs):
            raise _SetupFailed(f"reference() returned {len(results)} outputs for a node with "
                               f"{len(self.node.outputs)}", "return one array per node output")
        return results[:len(self.node.outputs)]

    def node_inputs(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray | None]:
        """The node's input arrays: ``feeds`` for runtime inputs, initializers for constants."""
        env = dict(self.graph.initializers())
        env.update(feeds)
        return [env[name] if name else None for name in self.node.inputs]

    # ------------------------------------------------------------------ infer

    def _check_infer(self) -> list[Failure]:
        failures = []
        hint = "infer() must describe exactly what reference() and the tactics produce"
        for i, (name, want) in enumerate(zip(self.node.outputs, self.expected)):
            info = self.graph.info(name)
            said = f"{info.dtype}{format_shape(info.shape)}"
            made = f"{want.dtype}{format_shape(want.shape)}"
            if not is_static(info.shape):
                failures.append(self.failure("infer", f"output {i}: infer() returns {said}, symbolic for static "
                                             f"inputs; the reference produces {made}", hint))
            elif info.dtype != want.dtype or tuple(info.shape) != want.shape:
                failures.append(self.failure("infer", f"output {i}: infer() says {said} but the reference "
                                             f"produces {made}", hint))
            elif info.value is not None and self.graph.values[name].const is None and not same_bytes(info.value, want):
                failures.append(self.failure("infer", f"output {i}: infer() gives a value that differs from "
                                             "the reference's", "only set TensorInfo.value to what reference() computes"))
        return failures + self._check_symbolic()

    def _check_symbolic(self) -> list[Failure]:
        """``infer`` with every runtime input dim > 1 made a symbol (equal dims share one)."""
        from plugrt.testing.model import symbolic_inputs

        inputs, values = symbolic_inputs(self.graph, self.node)
        if not values:
            return []
        shapes = ", ".join("none" if i is None else format_shape(i.shape) for i in inputs)
        hint = ("dynamic shapes are first-class: compute dims with plugrt.ir.dims (add, mul, prod, derive, "
                "broadcast), or refuse with ShapeError/UnsupportedError")
        try:
            self.op.check(self.node, inputs)
            outputs = list(self.op.infer(self.node, inputs))
        except PlugrtError:
            return []  # a declared refusal is fine
        except Exception as exc:
            return [self.failure("infer", f"infer() crashed on symbolic input dims ({shapes}): "
                                 f"{type(exc).__name__}: {exc}", hint)]
        problems = []
        for i, name in enumerate(self.node.outputs):
            concrete = self.graph.info(name)
            if i >= len(outputs) or not isinstance(outputs[i], TensorInfo):
                problems.append(f"output {i} is missing")
                continue
            shape = tuple(outputs[i].shape)
            if len(shape) != len(concrete.shape) or outputs[i].dtype != concrete.dtype:
                problems.append(f"output {i} is {outputs[i].dtype}{format_shape(shape)}, but "
                                f"{concrete.dtype}{format_shape(concrete.shape)} for the concrete inputs")
                continue
            for axis, (dim, size) in enumerate(zip(shape, concrete.shape)):
                bound = dim if isinstance(dim, int) else values.get(dim)
                if bound is not None and bound != size:
                    problems.append(f"output {i} dim {axis} is {dim!r} (= {bound}), but {size} for the "
                                    "concrete inputs")
        if problems:
            return [self.failure("infer", f"infer() on symbolic input dims ({shapes}) contradicts the concrete "
                                 f"shapes: {'; '.join(problems)}", hint)]
        return []

    # ------------------------------------------------------------------ tactics

    def tactic_list(self) -> tuple[list, list[Failure]]:
        if "tactics" in self._memo:
            return self._memo["tactics"]
        ins = [self.graph.info(name) if name else None for name in self.node.inputs]
        outs = [self.graph.info(name) for name in self.node.outputs]
        failures: list[Failure] = []
        found: list = []
        try:
            with self.watch("tactics()"):
                found = self.offered(self.node, ins, outs)
        except Exception as exc:
            failures.append(self.failure("tactics", f"tactics() raised {type(exc).__name__}: {exc}",
                                         "tactics() must return a list (empty to refuse) for claimed examples"))
        bad = [t for t in found if not isinstance(t, Tactic)]
        if bad:
            failures.append(self.failure("tactics", f"tactics() returned {type(bad[0]).__name__}, not a "
                                         "plugrt.tactic.Tactic", "return Tactic objects"))
            found = [t for t in found if isinstance(t, Tactic)]
        if not found and not failures:
            failures.append(self.failure("tactics", "the plugin claims this example but offers no CUDA tactic "
                                         "for it", "return a Tactic from tactics() for these inputs, or drop the example"))
        runnable = [t for t in found if self.declared_well(t, failures)]
        failures += declaration_failures(self, runnable)
        self._memo["tactics"] = (runnable, failures)
        return runnable, failures

    def offered(self, node, inputs, outputs, epilogue=None) -> list:
        """The tactics this run judges for ``node``: the op's own, or only those the provider
        contributes, stamped with their source as the builder stamps them."""
        extra = {} if epilogue is None else {"epilogue": epilogue}
        if self.provider is None:
            return list(self.op.tactics(node, inputs, outputs, **extra))
        provider, source = self.provider
        found = list(provider.tactics(node, inputs, outputs, **extra))
        return [t.from_source(source) if isinstance(t, Tactic) else t for t in found]

    def declared_well(self, tactic, failures: list) -> bool:
        """Whether the kit can run ``tactic`` at all (a name, a params mapping, a workspace size)."""
        return declared_well(self, tactic, failures)

    def variants(self) -> tuple[list[Variant], list[Failure]]:
        """What the tactics and guards checks run: every tactic on the example, and for an
        ``ANCHOR`` op every tactic it offers with an epilogue (:mod:`plugrt.testing.epilogue`)."""
        if "variants" not in self._memo:
            tactics, failures = self.tactic_list()
            runtime = [bool(name) and name in self.feeds for name in self.node.inputs]
            plain = [Variant(t.name, t, self.node_inputs(self.feeds), self.node_inputs(self.replay_feeds), runtime,
                             self.expected, self.replay_expected) for t in tactics]
            extra, problems = epilogue_variants(self, runtime)
            self._memo["variants"] = (plain + extra, failures + problems)
        return self._memo["variants"]

    def _guarded(self, variant: Variant):
        key = f"run/{variant.label}/{id(variant.tactic)}"
        if key not in self._memo:
            outs = [self.graph.info(name) for name in self.node.outputs]
            with self.watch(f"tactic {variant.label!r}"):
                self._memo[key] = run_guarded(variant.tactic, variant.inputs, variant.replay_inputs, variant.runtime,
                                              outs, self.seed)
        return self._memo[key]

    def tolerance(self, tactic) -> tuple[float, float]:
        if uses_tf32(tactic):
            rtol, atol = self.example.tf32_tolerance
            return max(rtol, self.example.rtol), max(atol, self.example.atol)
        return self.example.rtol, self.example.atol

    def _check_tactics(self) -> list[Failure]:
        variants, failures = self.variants()
        failures = list(failures)
        for variant in variants:
            failures += self._accuracy(variant)
        return failures

    def _accuracy(self, variant: Variant) -> list[Failure]:
        """The variant's outputs against the reference, first run and replay."""
        run, label = self._guarded(variant), variant.label
        if run.error is not None:
            phase, exc = run.error
            return [self.failure("tactics", f"{phase} raised {type(exc).__name__}: {exc}",
                                 "the tactic must run every example the plugin claims", label)]
        rtol, atol = self.tolerance(variant.tactic)
        for outputs, expected, when in ((run.outputs, variant.expected, ""),
                                        (run.replay_outputs, variant.replay_expected, "replay")):
            if outputs is None:
                return []  # stopped by an out-of-bounds access: the guards check reports it
            failures = []
            for i, (got, want) in enumerate(zip(outputs, expected)):
                problem = compare(got, want, rtol, atol, values=self.op.foldable)
                if problem and not when:
                    failures.append(self.failure("tactics", f"output {i} differs from the reference: {problem}",
                                                 "fix the kernel, or loosen Example.rtol/atol if the difference "
                                                 "is rounding", label))
                elif problem:
                    failures.append(self.failure("tactics", f"output {i} is wrong when the launch list is replayed "
                                                 f"on new inputs: {problem}",
                                                 "launches() must depend on shapes and known values only, and "
                                                 "kernels must not assume zeroed outputs or workspace", label))
            if failures:
                return failures
        return []

    def _check_guards(self) -> list[Failure]:
        variants, _ = self.variants()
        failures = []
        for variant in variants:
            tactic, run = variant.tactic, self._guarded(variant)
            for violation in run.violations:
                if violation.kind == "modified":
                    hint = "write only outputs and the workspace"
                elif violation.buffer == "workspace":
                    hint = (f"the tactic declares workspace_bytes={tactic.workspace_bytes}; declare what its "
                            "kernels use and bound every workspace index by it")
                else:
                    hint = "bound every index by the buffer's size (in grid-stride loops too)"
                failures.append(self.failure("guards", violation.message, hint, variant.label))
        return failures

    # ------------------------------------------------------------------ serialize

    def serialized(self, node) -> tuple[object, str]:
        """``(data, error)`` of ``op.serialize(node)``."""
        try:
            with self.watch("serialize()"):
                return self.op.serialize(node), ""
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def _check_serialize(self) -> list[Failure]:
        hint = "return a dict of str, int, float, bool, None, lists and dicts; put bulk data in NumPy arrays"
        data, error = self.serialized(self.node)
        self._memo["serialize"] = data
        if error:
            return [self.failure("serialize", f"serialize() raised {error}", hint)]
        if not isinstance(data, Mapping):
            return [self.failure("serialize", f"serialize() returned {type(data).__name__}, not a mapping", hint)]
        problems = json_problems(dict(data), "serialize()")
        if problems:
            return [self.failure("serialize", f"not JSON-safe: {'; '.join(problems)}", hint)]
        failures = []
        if json_round_trip(dict(data)) != dict(data):
            failures.append(self.failure("serialize", f"serialize() data change through JSON (to "
                                         f"{json_round_trip(dict(data))!r})", "use lists, not tuples"))
        again, error = self.serialized(self.node)
        if error or not isinstance(again, Mapping) or canonical_json(again) != canonical_json(data):
            failures.append(self.failure("serialize", "serialize() returns different data on a second call",
                                         "serialize() must depend on the node only"))
        return failures

    # ------------------------------------------------------------------ plan

    def _check_plan(self) -> list[Failure]:
        from plugrt.testing.plan_trip import plan_round_trips

        failures, plans = plan_round_trips(self)
        self._memo["plans"] = plans
        return failures

    # ------------------------------------------------------------------ pickle

    def _check_pickle(self) -> list[Failure]:
        for check in CHECKS[:-1]:
            self.result(check)  # every phase runs under the guard first
        hint = "never pickle: plan data is JSON plus raw NumPy arrays"
        counts: dict = {}
        for use in self.guard.uses:
            counts[str(use)] = counts.get(str(use), 0) + 1
        failures = [self.failure("pickle", text + (f" ({n} times)" if n > 1 else ""), hint)
                    for text, n in counts.items()]
        data = self._memo.get("serialize")
        for where in find_pickles(dict(data) if isinstance(data, Mapping) else data, "serialize()"):
            failures.append(self.failure("pickle", f"{where} holds a pickle stream", hint))
        tactics, _ = self._memo.get("tactics", ([], []))
        for tactic in tactics:
            for where in find_pickles(dict(tactic.params), "params"):
                failures.append(self.failure("pickle", f"{where} holds a pickle stream", hint, tactic.name))
        for label, blob in self._memo.get("plans", []):
            failures += [self.failure("pickle", f"plan file of {label}: {problem}", hint)
                         for problem in plan_pickles(blob)]
        return failures


class _SetupFailed(Exception):
    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.message, self.hint = message, hint


# ---------------------------------------------------------------------- helpers


def _example_label(example, index: int) -> str:
    return example.name or f"{index}:{example.label()}"


__all__ = ["CHECKS", "ExampleRun"]
