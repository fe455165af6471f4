"""What the conformance kit found: failures, per-check results, the report and the error.

A :class:`Failure` names the plugin, op, example, check and (where it applies) tactic,
says what went wrong and how to fix it. A :class:`CheckResult` is one op x example x check
(the unit the pytest plugin turns into a test item). :class:`ConformanceReport` gathers
them, JSON-able; :class:`ConformanceError` (an ``AssertionError``, so plain pytest shows it
as a test failure) lists every failure at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"


@dataclass(frozen=True)
class Failure:
    """One thing a plugin got wrong."""

    plugin: str
    op: str
    example: str
    check: str
    message: str
    hint: str = ""
    tactic: str = ""

    def __str__(self) -> str:
        where = f"{self.op} [{self.example}]" if self.example else self.op
        tactic = f" tactic {self.tactic!r}" if self.tactic else ""
        text = f"{where} {self.check}{tactic}: {self.message}"
        if self.hint:
            text += f"\n    fix: {self.hint}"
        return text

    def as_json(self) -> dict:
        return asdict(self)


@dataclass
class CheckResult:
    """The outcome of one check of one example of one op."""

    plugin: str
    op: str
    example: str
    check: str
    status: str
    failures: list[Failure] = field(default_factory=list)
    #: Why the check was skipped (an earlier check of the example failed), or notes.
    detail: str = ""
    seconds: float = 0.0

    @property
    def id(self) -> str:
        return f"{self.op}[{self.example}]::{self.check}" if self.example else f"{self.op}::{self.check}"

    def as_json(self) -> dict:
        return {"plugin": self.plugin, "op": self.op, "example": self.example, "check": self.check,
                "status": self.status, "detail": self.detail, "seconds": round(self.seconds, 4),
                "failures": [f.as_json() for f in self.failures]}


@dataclass
class ConformanceReport:
    """Everything one :func:`~plugrt.testing.check_plugin` run checked."""

    plugins: list[str]
    seed: int
    device: dict
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failures(self) -> list[Failure]:
        return [f for r in self.results for f in r.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    def counts(self) -> dict[str, int]:
        counts = {PASSED: 0, FAILED: 0, SKIPPED: 0}
        for result in self.results:
            counts[result.status] += 1
        return counts

    def ops(self) -> list[str]:
        return sorted({r.op for r in self.results})

    def summary(self) -> str:
        c = self.counts()
        return (f"plugrt conformance of {', '.join(self.plugins)} (seed {self.seed}, "
                f"{self.device.get('name', '?')}): {len(self.ops())} op(s), {sum(c.values())} checks: "
                f"{c[PASSED]} passed, {c[FAILED]} failed, {c[SKIPPED]} skipped")

    def as_json(self) -> dict:
        return {"plugins": list(self.plugins), "seed": self.seed, "device": dict(self.device),
                "ok": self.ok, "counts": self.counts(), "ops": self.ops(),
                "results": [r.as_json() for r in self.results]}


class ConformanceError(AssertionError):
    """A plugin failed the conformance kit; ``failures`` lists every problem found."""

    def __init__(self, failures: list[Failure], report: ConformanceReport | None = None):
        self.failures = list(failures)
        self.report = report
        head = report.summary() if report is not None else f"{len(self.failures)} conformance failure(s)"
        body = "\n".join(f"- {failure}" for failure in self.failures)
        super().__init__(f"{head}\n{body}")
