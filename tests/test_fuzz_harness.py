"""The fuzz harness itself: every way a case can fail is reported, and the run goes on."""

from fuzz_harness import run_cases


def test_every_failure_kind_is_caught_and_the_run_goes_on():
    cases = [b"ok", b"raise", b"plugrt", b"crash", b"ok", b"hang", b"memory", b"problem", b"ok"]
    failures = run_cases("fuzz_selftest_targets:misbehave", cases, timeout=5, memory=3 << 30)
    assert [(f.case, f.kind) for f in failures] == [(1, "exception"), (3, "crash"), (5, "hang"), (6, "memory"),
                                                     (7, "problem")]
    assert "ValueError: boom" in failures[0].detail
