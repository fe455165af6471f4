"""Running ONNX's own backend node test cases through ``plugrt.onnx.backend``.

The onnx wheel ships the case generators (``onnx.backend.test.case.node``) but not their
data; :func:`node_cases` generates them in memory. A case counts for plugrt when every
node of its model is an op plugrt claims. Outcomes: ``passed``, ``declared-unsupported``
(a plugin refused the case at import with an :class:`UnsupportedError`), ``failed``.
"""

from __future__ import annotations

import functools
import json
import warnings

import numpy as np
from onnx import TensorProto, numpy_helper

from plugrt.errors import UnsupportedError

PASSED = "passed"
UNSUPPORTED = "declared-unsupported"
FAILED = "failed"
SKIPPED = "too-big-for-simulator"

#: In the CUDA simulator, cases whose tensors hold more elements than this are skipped.
SIMULATOR_ELEMENT_LIMIT = 1500


@functools.lru_cache(maxsize=1)
def all_node_cases() -> tuple:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        return tuple(collect_testcases(None))


def case_op_types(case) -> set[str]:
    return {(n.domain if n.domain != "ai.onnx" else "", n.op_type) for n in case.model.graph.node}


def node_cases(registry) -> list:
    """The cases whose every node is an op this registry claims, sorted by name."""
    claimed = {op.key for op in registry.ops()}
    return sorted((c for c in all_node_cases() if case_op_types(c) <= claimed), key=lambda c: c.name)


def expanded_cases(registry) -> list:
    """The cases whose ops no plugin claims are all ones ONNX defines as functions (the
    importer expands them: :mod:`plugrt.onnx.functions`), sorted by name."""
    import onnx.defs

    claimed = {op.key for op in registry.ops()}

    def function(key, case) -> bool:
        opset = {e.domain: e.version for e in case.model.opset_import}.get(key[0], 1)
        try:
            schema = onnx.defs.get_schema(key[1], opset, key[0])
        except onnx.defs.SchemaError:
            return False
        return schema.has_function or schema.has_context_dependent_function

    found = [c for c in all_node_cases() if not case_op_types(c) <= claimed
             and all(k in claimed or function(k, c) for k in case_op_types(c))]
    return sorted(found, key=lambda c: c.name)


def one_per_op(cases: list, registry) -> list:
    """Of ``cases`` (expanded ones), the smallest for each set of unclaimed op types."""
    claimed = {op.key for op in registry.ops()}
    chosen: dict = {}
    for case in cases:
        key = frozenset(case_op_types(case) - claimed)
        if key not in chosen or _case_size(case) < _case_size(chosen[key]):
            chosen[key] = case
    return sorted(chosen.values(), key=lambda c: c.name)


def smallest(cases: list, count: int) -> list:
    """The ``count`` smallest of ``cases`` (by their data), in name order."""
    return sorted(sorted(cases, key=lambda c: (_case_size(c), c.name))[:count], key=lambda c: c.name)


def _case_size(case) -> int:
    return sum(_size(x) for inputs, expected in case.data_sets for x in list(inputs) + list(expected))


def simulator_too_big(case) -> str:
    """Why a case is too big to run through the CUDA simulator, or ``""``."""
    from plugrt.device import simulated

    if not simulated():
        return ""
    sizes = [_size(x) for inputs, expected in case.data_sets for x in list(inputs) + list(expected)]
    total = sum(sizes)
    if total > SIMULATOR_ELEMENT_LIMIT:
        return f"{total} elements; the simulator runs cases up to {SIMULATOR_ELEMENT_LIMIT} (a GPU runs all)"
    return ""


def _size(x) -> int:
    """Elements in a case's value (a sequence's: its tensors')."""
    if isinstance(x, (list, tuple)):
        return sum(_size(item) for item in x)
    return int(_array(x).size)


def _array(x):
    return numpy_helper.to_array(x) if isinstance(x, TensorProto) else np.asarray(x)


def run_case(case, device: str = "CPU", registry=None) -> tuple[str, str]:
    """Run one case; returns ``(outcome, detail)``; never raises for a failing case."""
    from plugrt.onnx import backend

    try:
        # The ONNX cases' tolerances are fp32's: engines build with TF32 off.
        options = {"tf32": False} if device == "CUDA" else {}
        rep = backend.prepare(case.model, device, registry=registry, **options)
    except UnsupportedError as exc:
        return UNSUPPORTED, str(exc)
    except Exception as exc:
        return FAILED, f"prepare: {type(exc).__name__}: {exc}"
    for inputs, expected in case.data_sets:
        try:
            with np.errstate(all="ignore"):
                got = rep.run([_array(x) for x in inputs])
            compare_outputs([_array(x) for x in expected], list(got), case.rtol, case.atol)
        except UnsupportedError as exc:
            if device != "CPU":  # every op the references accept needs a GPU tactic too
                return FAILED, f"UnsupportedError: {exc}"
            return UNSUPPORTED, str(exc)
        except Exception as exc:
            return FAILED, f"{type(exc).__name__}: {exc}"
    return PASSED, ""


def compare_outputs(expected: list, got: list, rtol: float, atol: float) -> None:
    """The comparison of ONNX's own backend runner: shapes, dtypes, then allclose."""
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs, expected {len(expected)}")
    for i, (ref, out) in enumerate(zip(expected, got)):
        out = np.asarray(out)
        if out.shape != ref.shape:
            raise AssertionError(f"output {i}: shape {out.shape}, expected {ref.shape}")
        if ref.dtype == object:
            np.testing.assert_array_equal(out, ref)
            continue
        if out.dtype != ref.dtype:
            raise AssertionError(f"output {i}: dtype {out.dtype}, expected {ref.dtype}")
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"output {i}")


def summarize(outcomes: dict[str, tuple[str, str]], claimed: list[str]) -> dict:
    counts = {PASSED: 0, UNSUPPORTED: 0, FAILED: 0, SKIPPED: 0}
    for outcome, _ in outcomes.values():
        counts[outcome] += 1
    return {"claimed_ops": sorted(claimed), "counts": counts,
            "declared_unsupported": {k: v for k, (o, v) in outcomes.items() if o == UNSUPPORTED},
            "failed": {k: v for k, (o, v) in outcomes.items() if o == FAILED},
            "skipped": {k: v for k, (o, v) in outcomes.items() if o == SKIPPED}}


def write_report(path, report: dict) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
