"""Runtime feeds of every wrong kind: ``execute``, ``execute_async`` and device outputs answer
a PlugrtError (or, for feeds that are valid, the right answer), never another exception,
and the same context still gives the right answer afterwards. Each case runs in the fuzz
worker (a child process with a timeout and a memory limit)."""

from fuzz_harness import run_cases
from fuzz_runtime_targets import cases


def test_every_wrong_feed_is_a_binding_error_and_the_context_survives():
    names = list(cases())
    failures = run_cases("fuzz_runtime_targets:run_case", [name.encode() for name in names], timeout=120)
    assert not failures, "\n".join(f"{names[f.case]}: {f}" for f in failures)
    print(f"runtime feed cases: {len(names)}, 0 failures")


def test_a_stream_that_is_none_is_refused():
    assert not run_cases("fuzz_runtime_targets:bad_stream", [b"not a stream"], timeout=120)
