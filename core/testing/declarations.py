"""The tactics check's declaration rules: what a tactic must state for the kit to run it
and for a plan to record it (a name, a params mapping, a workspace size; unique names,
JSON-stable parameters, known math; a provider's tactics among its ``tactic_names``)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from plugrt.tactic import MATH_KINDS
from plugrt.testing.comparison import json_problems, json_round_trip
from plugrt.testing.report import Failure


def declared_well(run, tactic, failures: list) -> bool:
    """Whether the kit can run ``tactic`` at all (a name, a params mapping, a workspace size)."""
    ws = tactic.workspace_bytes
    label = str(tactic.name)
    if not isinstance(tactic.name, str) or not tactic.name:
        failures.append(run.failure("tactics", f"a tactic is named {tactic.name!r}", "name it with a str", label))
    elif not isinstance(tactic.params, Mapping):
        failures.append(run.failure("tactics", f"params is a {type(tactic.params).__name__}",
                                    "give params as a dict", label))
    elif isinstance(ws, bool) or not isinstance(ws, (int, np.integer)) or ws < 0:
        failures.append(run.failure("tactics", f"workspace_bytes is {ws!r}", "declare a non-negative int", label))
    else:
        return True
    return False


def declaration_failures(run, tactics: list) -> list[Failure]:
    """What is wrong with how the runnable ``tactics`` declare themselves: duplicate names,
    names a provider did not list, parameters a plan cannot record, unknown math."""
    failures = []
    names = [t.name for t in tactics]
    for name in sorted({n for n in names if names.count(n) > 1}):
        failures.append(run.failure("tactics", f"{names.count(name)} tactics are named {name!r}",
                                    "give every tactic of a node a unique name (plans record it)", name))
    if run.provider is not None:
        declared = tuple(run.provider[0].tactic_names)
        for name in sorted({n for n in names if n not in declared}):
            failures.append(run.failure("tactics", f"tactic {name!r} is not among the provider's tactic_names "
                                        f"{declared!r}", "list every tactic it offers in tactic_names", name))
    for tactic in tactics:
        problems = json_problems(dict(tactic.params), "params")
        if problems:
            failures.append(run.failure("tactics", f"parameters are not JSON-safe: {'; '.join(problems)}",
                                        "use str, int, float, bool, None, lists and dicts with str keys",
                                        tactic.name))
        elif json_round_trip(dict(tactic.params)) != dict(tactic.params):
            failures.append(run.failure("tactics", f"parameters {dict(tactic.params)!r} change through JSON "
                                        f"(to {json_round_trip(dict(tactic.params))!r}), so a plan cannot "
                                        "find this tactic again by them", "use lists, not tuples", tactic.name))
        if tactic.math not in MATH_KINDS:
            failures.append(run.failure("tactics", f"math is {tactic.math!r}",
                                        f"use one of {', '.join(map(repr, MATH_KINDS))}", tactic.name))
    return failures
