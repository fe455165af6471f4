"""The conformance kit (plugrt.testing.check_plugin and its pytest plugin) catches planted bugs.

The throwaway plugin of ``conformance_kit_plugins`` computes ``y = x * alpha + b`` with two
tactics; each parametrized case plants one bug and asserts the kit names the op, the check
and the tactic at fault, and nothing else. Inputs are tiny: the whole file runs in seconds
in the CUDA simulator.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from conformance_kit_plugins import AxpyShift, plugin_module
from plugin_fixtures import SysPath, install_distribution
from plugrt.errors import PlugrtError
from plugrt.kernels import cuda, jit
from plugrt.plugin import Example, TensorInfo
from plugrt.registry import Registry
from plugrt.testing import (
    CHECKS,
    ConformanceError,
    PickleForbidden,
    PickleGuard,
    check_plugin,
    conformance_cases,
    find_pickles,
)
from plugrt.testing.guards import GuardedBuffer
from plugrt.testing.model import draw_input

pytest_plugins = ["pytester"]

OP = "com.example.kit::AxpyShift"


def failures_of(target, **options) -> ConformanceError:
    with pytest.raises(ConformanceError) as info:
        check_plugin(target, **options)
    return info.value


def test_a_correct_op_passes_every_check():
    report = check_plugin(AxpyShift())
    assert report.ok and not report.failures
    results = {(r.example, r.check): r.status for r in report.results}
    assert results[("", "claims")] == "passed"
    for example in ("0:float32(2,8)+float32(2,8)", "constant-shift"):
        assert {check: results[(example, check)] for check in CHECKS} == dict.fromkeys(CHECKS, "passed")
    summary = json.loads(json.dumps(report.as_json()))
    assert summary["ok"] and summary["counts"] == {"passed": 13, "failed": 0, "skipped": 0}
    assert summary["ops"] == [OP]


#: bug -> (check that must fail, tactic named, words in the message, checks allowed to fail).
#: Some bugs also fail ``plan`` in the simulator, which bounds-checks where a GPU corrupts.
PLANTED = {
    "wrong_kernel": ("tactics", "direct", "differs from the reference", {"tactics", "plan"}),
    "workspace_overflow": ("guards", "staged", "workspace", {"guards", "plan"}),
    "output_overflow": ("guards", "direct", "output 0", {"guards", "plan"}),
    "input_write": ("guards", "direct", "input 0", {"guards"}),
    "infer_lie": ("infer", "", "infer() says float32[2,9] but the reference produces float32[2,8]", {"infer"}),
    "static_only_infer": ("infer", "", "crashed on symbolic input dims", {"infer"}),
    "serialize_pickle": ("pickle", "", "pickle.dumps called during serialize()", {"serialize", "pickle"}),
    "serialize_bytes": ("serialize", "", "serialize()['layout'] is a builtins.bytes", {"serialize"}),
    "smuggled_pickle": ("pickle", "", "serialize()['state'] holds a pickle stream", {"pickle"}),
    "host_table": ("tactics", "table", "replayed on new inputs", {"tactics", "plan"}),
    "tuple_params": ("tactics", "direct", "change through JSON", {"tactics", "plan"}),
    "no_examples": ("claims", "", "claims nothing", {"claims"}),
    "epilogue_skipped": ("tactics", "direct+epilogue", "differs from the reference", {"tactics"}),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_caught_and_named(bug):
    check, tactic, words, allowed = PLANTED[bug]
    error = failures_of(AxpyShift(bug))
    assert isinstance(error, AssertionError)
    hits = [f for f in error.failures if f.check == check and f.tactic == tactic and words in f.message]
    assert hits, str(error)
    assert {f.check for f in error.failures} <= allowed, str(error)
    assert all(f.op == OP and f.hint for f in error.failures)
    line = str(hits[0])
    assert line.startswith(OP) and f" {check}" in line and "fix:" in line
    assert str(error).count("\n- ") == len(error.failures)  # every failure listed


def test_the_workspace_overflow_says_how_much_was_declared():
    error = failures_of(AxpyShift("workspace_overflow"), checks=["guards"])
    (first, second) = error.failures
    assert "workspace (uint8[56], 56 bytes)" in first.message and "workspace_bytes=56" in first.hint
    assert first.example == "0:float32(2,8)+float32(2,8)" and second.example == "constant-shift"


def test_a_shape_inference_lie_skips_the_checks_that_need_shapes():
    report = failures_of(AxpyShift("infer_lie")).report
    statuses = {(r.example, r.check): r.status for r in report.results if r.example == "constant-shift"}
    assert statuses[("constant-shift", "infer")] == "failed"
    assert {statuses[("constant-shift", c)] for c in ("tactics", "guards", "plan")} == {"skipped"}


def test_serialize_that_pickles_names_the_call_site():
    error = failures_of(AxpyShift("serialize_pickle"), checks=["serialize", "pickle"])
    raised = [f for f in error.failures if f.check == "serialize"]
    assert raised and "PickleForbidden" in raised[0].message
    called = [f for f in error.failures if f.check == "pickle"]
    assert called and "conformance_kit_plugins.py" in called[0].message
    assert pickle.loads(pickle.dumps({"still": "works"})) == {"still": "works"}  # restored afterwards


# ---------------------------------------------------------------------- targets and options


def test_targets_a_name_a_module_or_an_instance():
    registry = Registry()
    registry.register(plugin_module("none"), name="kit-good")
    by_name = check_plugin("kit-good", registry=registry, checks=["infer"])
    assert by_name.plugins == ["kit-good"]
    by_module = check_plugin(plugin_module("none", name="kit_module"), checks=["infer"])
    assert by_module.plugins == ["kit_module"]
    wrong = Registry()
    wrong.register(plugin_module("wrong_kernel"), name="kit-wrong")
    error = failures_of(["kit-wrong"], registry=wrong, checks=["tactics"])
    assert {f.plugin for f in error.failures} == {"kit-wrong"}


def test_bad_targets_and_options_are_plugrt_errors():
    with pytest.raises(PlugrtError, match="no plugin named 'no-such-plugin'"):
        check_plugin("no-such-plugin", registry=Registry())
    with pytest.raises(PlugrtError, match="pass an OpPlugin instance"):
        check_plugin(42)
    with pytest.raises(PlugrtError, match="unknown conformance check"):
        check_plugin(AxpyShift(), checks=["speed"])
    with pytest.raises(PlugrtError, match="provides no op 'Relu'"):
        check_plugin(AxpyShift(), ops=["Relu"])


def test_cases_are_one_per_op_example_and_check_and_share_their_work():
    cases = conformance_cases(AxpyShift(), checks=["tactics", "guards"])
    assert [c.id for c in cases] == [
        f"{OP}::claims",
        f"{OP}[0:float32(2,8)+float32(2,8)]::tactics", f"{OP}[0:float32(2,8)+float32(2,8)]::guards",
        f"{OP}[constant-shift]::tactics", f"{OP}[constant-shift]::guards",
    ]
    assert cases[1].example_run is cases[2].example_run
    assert cases[2].run().status == "passed"


def test_a_malformed_example_fails_infer_with_a_fix():
    class OneInput(AxpyShift):
        def examples(self):
            return [Example((TensorInfo(np.float32, (4,)),), name="one input")]

    (failure,) = failures_of(OneInput()).failures
    assert failure.check == "infer" and "the Example is malformed: 1 inputs" in failure.message


def test_plan_files_are_kept_where_asked(tmp_path):
    from plugrt.engine.plan_file import read_plan

    check_plugin(AxpyShift(), checks=["plan"], plan_dir=str(tmp_path))
    plans = sorted(tmp_path.glob("*.plan"))
    assert len(plans) == 4  # two examples x two tactics
    header, _ = read_plan(str(plans[0]))
    assert header["layers"][0]["tactic"]["name"] == "direct"


def test_builtin_ops_that_claim_examples_pass(registry):
    report = check_plugin(["builtin-activation", "builtin-elementwise", "builtin-reduction"], registry=registry,
                          ops=["Relu", "Add", "Softmax"])
    assert report.ops() == ["Add", "Relu", "Softmax"]


# ---------------------------------------------------------------------- the pieces


def test_pads_catch_a_write_past_the_end_as_on_a_gpu():
    """On a GPU stray writes land in the pads (the simulator raises instead): check the pads
    by writing into the allocation around the view."""

    @jit
    def flip(raw, start, count):
        i = cuda.grid(1)
        if i < count:
            raw[start + i] = 255 - raw[start + i]

    buffer = GuardedBuffer("workspace", np.uint8, (40,), np.random.default_rng(1))
    flip[1, 8](buffer.raw, np.int64(buffer.pad + 36), np.int64(6))
    assert buffer.damage(buffer.read()[0]) == "2 byte(s) past its end were written (the farthest 2 bytes past)"
    flip[1, 8](buffer.raw, np.int64(buffer.pad - 3), np.int64(1))
    assert "1 byte(s) before its start were written (the farthest 3 bytes before)" in buffer.damage(buffer.read()[0])


def test_pickle_guard_raises_records_and_restores():
    original = pickle.dumps
    with PickleGuard() as guard, guard.during("serialize()"):
        with pytest.raises(PickleForbidden, match="pickle.dumps is forbidden"):
            pickle.dumps(1)
        with pytest.raises(PickleForbidden):
            pickle.Unpickler(None)
    assert pickle.dumps is original
    assert [(u.function, u.phase) for u in guard.uses] == [("pickle.dumps", "serialize()"),
                                                           ("pickle.Unpickler", "serialize()")]


def test_find_pickles_sees_through_text_encodings_and_arrays():
    import base64

    blob = pickle.dumps({"w": [1, 2]})
    data = {"latin": blob.decode("latin-1"), "b64": base64.b64encode(blob).decode(), "hex": blob.hex(),
            "ints": list(blob), "array": np.frombuffer(blob, np.uint8), "fine": ["text", 1.5, [1, 2, 3]]}
    assert find_pickles(data) == ["['latin']", "['b64']", "['hex']", "['ints']", "['array']"]


def test_ranges_bound_the_drawn_inputs():
    rng = np.random.default_rng(0)
    assert draw_input(rng, np.float32, (50,), (0.5, 2.0)).min() >= 0.5
    ints = draw_input(rng, np.int64, (50,), (0, 3))
    assert set(np.unique(ints)) <= {0, 1, 2}
    assert draw_input(rng, np.int32, (4,), lambda rng, dtype, shape: np.arange(4, dtype=dtype)).tolist() == [0, 1, 2, 3]
    with pytest.raises(PlugrtError, match="expected int32"):
        draw_input(rng, np.int32, (4,), lambda rng, dtype, shape: np.arange(4))


# ---------------------------------------------------------------------- the pytest plugin


SHIM = """
from conformance_kit_plugins import plugin_module
plugrt_ops = plugin_module("{bug}").plugrt_ops
"""


def test_pytest_plugin_makes_one_item_per_check_and_a_fixture(pytester, tmp_path):
    site = tmp_path / "site"
    install_distribution(site, "kit-good", "kit_good", SHIM.format(bug="none"))
    install_distribution(site / "wrong", "kit-wrong", "kit_wrong", SHIM.format(bug="wrong_kernel"))
    pytester.makepyfile(test_mine="""
        def test_fixture(plugrt_conformance):
            assert plugrt_conformance("kit-good", checks=["infer"]).ok
    """)
    with SysPath(site, ["kit_good"]), SysPath(site / "wrong", ["kit_wrong"]):
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--plugrt-conformance=kit-good,kit-wrong",
                                              "--plugrt-conformance-seed=3", "-rf")
    result.assert_outcomes(passed=13 + 9 + 1, failed=4)
    result.stdout.fnmatch_lines([
        "plugrt conformance: kit-good, kit-wrong (seed 3)",
        "FAILED plugrt-conformance?kit-wrong?::com.example.kit::AxpyShift?0:float32(2,8)+float32(2,8)?::tactics*",
    ])
    assert "tactic 'direct': output 0 differs from the reference" in result.stdout.str()


def test_pytest_plugin_reports_an_unknown_plugin_as_a_usage_error(pytester):
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--plugrt-conformance=no-such-plugin")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no plugin named 'no-such-plugin'" in result.stderr.str()
