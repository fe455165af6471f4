"""Test setup: CUDA simulator when there is no GPU, shared fixtures, the conformance report."""

from __future__ import annotations

import os

import pytest

import conformance
from plugrt.registry import default_registry

import onnx.helper  # noqa: E402

_make_model = onnx.helper.make_model


def _make_model_onnxruntime_reads(*args, **kwargs):
    """Test models carry IR version 10, which every onnxruntime the tests meet reads (the
    GPU machine's onnxruntime 1.30 refuses the IR 14 that onnx 1.23 writes by default)."""
    kwargs.setdefault("ir_version", 10)
    return _make_model(*args, **kwargs)


onnx.helper.make_model = _make_model_onnxruntime_reads

CONFORMANCE_OUTCOMES: dict[str, tuple[str, str]] = {}
CONFORMANCE_CUDA_OUTCOMES: dict[str, tuple[str, str]] = {}


@pytest.fixture(scope="session")
def registry():
    return default_registry()


@pytest.fixture
def rng(request):
    """A fresh, seeded-per-test random generator (the seed is printed on failure)."""
    import zlib

    import numpy as np

    seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("PLUGRT_TEST_SEED", "0"))
    return np.random.default_rng(seed)


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands its conformance outcomes to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["conformance"] = {"cpu": CONFORMANCE_OUTCOMES, "cuda": CONFORMANCE_CUDA_OUTCOMES}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller merges each xdist worker's conformance outcomes."""
    received = getattr(node, "workeroutput", {}).get("conformance", {})
    for key, outcomes in (("cpu", CONFORMANCE_OUTCOMES), ("cuda", CONFORMANCE_CUDA_OUTCOMES)):
        outcomes.update({name: tuple(value) for name, value in received.get(key, {}).items()})


def pytest_terminal_summary(terminalreporter):
    if not CONFORMANCE_OUTCOMES and not CONFORMANCE_CUDA_OUTCOMES:
        return
    from plugrt.fusion.op import FUSED_DOMAIN

    keys = {op.key for op in default_registry().ops() if op.domain != FUSED_DOMAIN}  # the core's fused layers
    claimed = sorted({f"{d}::{t}" if d else t for d, t in keys})
    terminalreporter.write_sep("-", "ONNX node conformance")
    for device, outcomes, filename in (("CPU", CONFORMANCE_OUTCOMES, "conformance-report.json"),
                                       ("CUDA", CONFORMANCE_CUDA_OUTCOMES, "conformance-report-cuda.json")):
        if not outcomes:
            continue
        report = conformance.summarize(outcomes, claimed)
        path = os.path.join(str(terminalreporter.config.rootpath), filename)
        conformance.write_report(path, report)
        c = report["counts"]
        terminalreporter.write_line(
            f"{device}: claimed ops: {len(claimed)}; cases: {sum(c.values())}; passed {c['passed']}, "
            f"declared-unsupported {c['declared-unsupported']}, failed {c['failed']}, "
            f"too big for the simulator {c[conformance.SKIPPED]} (details: {path})"
        )


def skip_unless_ops(model) -> None:
    """Skip the calling test when the model uses ops no installed plugin claims yet."""
    registry = default_registry()
    opsets = {o.domain: o.version for o in model.opset_import}
    missing = sorted({n.op_type for n in model.graph.node
                      if registry.find_op(n.domain, n.op_type, opsets.get(n.domain, 1)) is None})
    if missing:
        pytest.skip(f"ops not implemented yet: {', '.join(missing)}")
