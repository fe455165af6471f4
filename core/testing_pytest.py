"""The pytest plugin of the plugrt conformance kit (:mod:`plugrt.testing`).

pytest loads it in every run through the ``pytest11`` entry point ``plugrt`` (disable it
with ``-p no:plugrt``). Loading it costs nothing: the kit, Numba and ONNX are imported
only when ``--plugrt-conformance`` is given or the fixture is used.

Command line::

    pytest --plugrt-conformance=my-plugin[,other-plugin] -m plugrt_conformance

makes one test item per op x example x check (``AxpyShift[0:float32(2,8)]::guards``,
marked ``plugrt_conformance``; ``-m`` leaves out the project's other tests, ``-k guards``
narrows to one check). ``--plugrt-conformance-seed=N`` seeds the inputs (default
``$PLUGRT_TEST_SEED`` or 0), ``--plugrt-conformance-checks=tactics,guards`` and
``--plugrt-conformance-ops=Relu,Add`` choose what runs.

Fixture ``plugrt_conformance``: ``plugrt_conformance(target, **options)`` runs
:func:`plugrt.testing.check_plugin` with the session's seed and returns the report.
"""

from __future__ import annotations

import os

import pytest

MARKER = "plugrt_conformance"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("plugrt", "plugrt conformance kit")
    group.addoption("--plugrt-conformance", action="append", default=[], metavar="PLUGIN[,PLUGIN]",
                    help="check these plugrt plugins (entry point or distribution names) with the conformance "
                         "kit: one test item per op, example and check")
    group.addoption("--plugrt-conformance-seed", type=int, default=None, metavar="N",
                    help="seed of the kit's random inputs (default: $PLUGRT_TEST_SEED, else 0)")
    group.addoption("--plugrt-conformance-checks", default=None, metavar="CHECK[,CHECK]",
                    help="run only these checks (infer, tactics, guards, serialize, plan, pickle)")
    group.addoption("--plugrt-conformance-ops", default=None, metavar="OP[,OP]",
                    help="check only these ops of the plugins (op_type, or domain::op_type)")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a plugrt conformance kit check (made by --plugrt-conformance)")


def pytest_report_header(config):
    plugins = _listed(config.getoption("plugrt_conformance"))
    if plugins:
        return f"plugrt conformance: {', '.join(plugins)} (seed {_seed(config)})"
    return None


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselect, so they apply to these items too
def pytest_collection_modifyitems(session, config, items) -> None:
    plugins = _listed(config.getoption("plugrt_conformance"))
    if not plugins:
        return
    from plugrt.errors import PlugrtError
    from plugrt.testing import conformance_cases

    checks = _listed([config.getoption("plugrt_conformance_checks") or ""]) or None
    ops = _listed([config.getoption("plugrt_conformance_ops") or ""]) or None
    try:
        cases = conformance_cases(plugins, seed=_seed(config), checks=checks, ops=ops)
    except PlugrtError as exc:
        raise pytest.UsageError(f"--plugrt-conformance={','.join(plugins)}: {exc}") from None
    for plugin in dict.fromkeys(case.plugin for case in cases):
        collector = ConformanceCollector.from_parent(session, name=f"plugrt-conformance[{plugin}]",
                                                     nodeid=f"plugrt-conformance[{plugin}]",
                                                     cases=[case for case in cases if case.plugin == plugin])
        items.extend(collector.collect())


@pytest.fixture
def plugrt_conformance(request):
    """``plugrt_conformance(target, **options)``: :func:`plugrt.testing.check_plugin` with the
    session's seed (``--plugrt-conformance-seed``); returns the report, raises
    :class:`~plugrt.testing.ConformanceError` listing every failure."""
    from plugrt.testing import check_plugin

    seed = _seed(request.config)

    def run(target, **options):
        options.setdefault("seed", seed)
        return check_plugin(target, **options)

    return run


class ConformanceCollector(pytest.Collector):
    """The conformance cases of one plugin."""

    def __init__(self, *, cases, **kwargs):
        super().__init__(**kwargs)
        self.cases = cases

    def collect(self):
        return [ConformanceItem.from_parent(self, name=case.id, case=case) for case in self.cases]


class ConformanceItem(pytest.Item):
    """One check of one example of one op."""

    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.add_marker(MARKER)

    def runtest(self) -> None:
        from plugrt.testing import ConformanceError

        result = self.case.run()
        self.user_properties.append(("plugrt_conformance_seconds", round(result.seconds, 4)))
        if result.status == "skipped":
            pytest.skip(result.detail)
        if result.failures:
            raise ConformanceError(result.failures)

    def repr_failure(self, excinfo, style=None):
        failures = getattr(excinfo.value, "failures", None)
        if failures is not None:
            return "\n".join(str(failure) for failure in failures)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"plugrt conformance of {self.case.plugin}: {self.name}"


def _listed(values) -> list[str]:
    return [name.strip() for value in values or [] for name in value.split(",") if name.strip()]


def _seed(config) -> int:
    seed = config.getoption("plugrt_conformance_seed")
    if seed is not None:
        return seed
    try:
        return int(os.environ.get("PLUGRT_TEST_SEED", "0"))
    except ValueError:
        return 0
