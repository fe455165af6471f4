"""CLI fuzz cases: generated ``plugrt`` argument lists naming files of every kind, each run
in a fuzz_harness worker (see tests/cli_fuzz_targets.py for what fails a case)."""

from cli_fuzz_targets import cases
from fuzz_harness import run_cases

#: Enough to meet every command with every kind of file in most option slots, in well under a minute.
CASES = 600


def test_cli_file_cases_never_crash_or_lose_a_file():
    failures = run_cases("cli_fuzz_targets:run_cli", cases(CASES), timeout=60)
    assert not failures, "\n".join(str(f) for f in failures[:10])
