"""Testing op plugins: node-level helpers and the conformance kit.

Node-level helpers (:mod:`plugrt.testing.nodes`), for an op's own tests::

    from plugrt.testing import check_node
    check_node("Relu", {"x": x})                          # every tactic vs the reference

The conformance kit checks a whole plugin against the plugin contract, over the cases
each op claims through :meth:`~plugrt.plugin.OpPlugin.examples`::

    from plugrt.plugin import Example, TensorInfo

    class ScaleShift(OpPlugin):
        ...
        def examples(self):
            return [Example((TensorInfo("float32", (2, 8)),), {"scale": 2.0}),
                    Example((TensorInfo("float16", (3, 5)),), rtol=1e-3, atol=1e-3)]

    # tests/test_conformance.py of the plugin package
    from plugrt.testing import check_plugin

    def test_conformance():
        check_plugin("plugrt-scaleshift")     # entry point name; or the module, or an op instance

For every op and every example, six checks run (:data:`CHECKS`):

- ``infer``: ``infer`` gives the dtypes and shapes the reference produces, and does not
  crash on or contradict symbolic input dims;
- ``tactics``: every tactic matches ``reference`` on fresh random inputs (the example's
  ``rtol``/``atol``; ``Example.ranges`` bounds the values), also when its launch list is
  replayed on other inputs; tactic names are unique and parameters JSON-stable; an
  ``ANCHOR`` op's tactics also run with a probe epilogue, which they must apply once per
  element (failures name such a run ``<tactic>+epilogue``);
- ``guards``: every input, output and the workspace sits between pads of sentinel bytes;
  no tactic writes a pad (the simulator's bounds checks report the same buffer), reads out
  of bounds or modifies an input;
- ``serialize``: ``serialize(node)`` is JSON-safe, survives JSON and is deterministic;
- ``plan``: a one-node engine from the real builder, saved as a plan file and loaded, runs
  each tactic (found again by its recorded name and parameters) and matches the reference;
- ``pickle``: nothing calls pickle (it is patched to raise), and no plan or plugin data
  holds a pickle stream.

A tactic plugin (``plugrt_tactics``, :class:`~plugrt.plugin.TacticProvider`) is checked the
same way on its own examples (or, when it claims none, the owner's) with the ``tactics``,
``guards``, ``plan`` and ``pickle`` checks: its tactics against the owner's reference,
the plan recording and requiring the contributor. ``check_plugin("dist")`` works for a
distribution that provides only tactics.

An op with no examples fails the ``claims`` check. :func:`check_plugin` returns a
:class:`ConformanceReport` (``as_json()``) or raises one :class:`ConformanceError` (an
``AssertionError``) listing every failure with op, example, check, tactic and a fix.

The kit is also a pytest plugin (installed with plugrt, module :mod:`plugrt.testing_pytest`)::

    pytest --plugrt-conformance=plugrt-scaleshift -m plugrt_conformance

makes one test item per op x example x check (``ScaleShift[0:float32(2,8)]::guards``);
``--plugrt-conformance-seed``, ``--plugrt-conformance-checks`` and
``--plugrt-conformance-ops`` narrow it. The ``plugrt_conformance`` fixture runs
:func:`check_plugin` with the session's seed. Keep examples small: in Numba's CUDA
simulator each thread costs about 125 us.
"""

from plugrt.errors import PlugrtError
from plugrt.testing.conformance import CLAIMS, ConformanceCase, check_plugin, conformance_cases, resolve_target
from plugrt.testing.example_run import CHECKS
from plugrt.testing.nodes import check_node, check_pass, node_tactics, random_feeds, run_tactic, single_node_model
from plugrt.testing.pickle_guard import PickleForbidden, PickleGuard, find_pickles
from plugrt.testing.report import CheckResult, ConformanceError, ConformanceReport, Failure

__all__ = [
    "CHECKS",
    "CLAIMS",
    "CheckResult",
    "ConformanceCase",
    "ConformanceError",
    "ConformanceReport",
    "Failure",
    "PickleForbidden",
    "PickleGuard",
    "PlugrtError",
    "check_node",
    "check_pass",
    "check_plugin",
    "conformance_cases",
    "find_pickles",
    "node_tactics",
    "random_feeds",
    "resolve_target",
    "run_tactic",
    "single_node_model",
]
