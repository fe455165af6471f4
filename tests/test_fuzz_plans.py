"""Mutated plan files: every one is refused with a PlanError or loads and runs correctly.

Half the cases are raw byte mutations (bit flips, truncation, insertion), which the
checksum catches; half edit the header JSON and recompute the checksum, so that header
validation is what is exercised. Seeded: the same cases every run. Each case runs in a
worker with a timeout and a memory limit (tests/fuzz_harness.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import struct
import time

from fuzz_harness import run_cases
from fuzz_plan_targets import COUNTS_VARIABLE, build_plans

CASES = 4000
_PREFIX = struct.Struct("<8sIQ")

#: Values a field is replaced with: wrong types, negative, huge, fractional, odd strings.
ODD_VALUES = (None, -1, 0, 1, 0.5, -0.5, 2**40, 2**63, -(2**40), 1e308, float("nan"), "12", "", "x" * 5, [], {},
              True, False, [1, -1], {"k": 1}, "<f4", "O", "<U4", ">f4", "float32", "V4", "|b1", "<i8")
DTYPES = ("O", "<U4", ">f4", "float32", "V4", "|b1", "<i8", "<f2", "S3", "<c8", "", "M8[ns]")


def split_plan(data: bytes) -> tuple[bytes, dict, bytes]:
    """``(magic+version, header JSON, array data)`` of a valid plan."""
    magic, version, header_len = _PREFIX.unpack_from(data)
    start = _PREFIX.size
    header = json.loads(data[start:start + header_len])
    blob_start = start + header_len + (-(start + header_len)) % 64
    return data[:12], header, data[blob_start:-32]


def join_plan(head: bytes, header, blob: bytes) -> bytes:
    """Plan bytes from the parts, with the checksum recomputed."""
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    payload = head + struct.pack("<Q", len(text)) + text
    payload += b"\0" * ((-len(payload)) % 64) + blob
    return payload + hashlib.sha256(payload).digest()


def raw_mutation(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0:
        for _ in range(rng.randint(1, 3)):
            position = rng.randrange(len(data))
            data[position] ^= 1 << rng.randrange(8)
    elif kind == 1:
        data = data[:rng.randrange(len(data))]
    elif kind == 2:
        position = rng.randrange(len(data))
        data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    else:
        position = rng.randrange(len(data))
        del data[position:position + rng.randint(1, 64)]
    return bytes(data)


def _paths(value, path=()):
    """Every (container, key) in a JSON tree."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            found.append((value, key))
            found += _paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.append((value, index))
            found += _paths(item, path + (index,))
    return found


def _nudge(rng, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return rng.choice(ODD_VALUES)
    return rng.choice([value + 1, value - 1, value * 2, -value, value + 64, value - 64, value + 0.5, str(value),
                       value + 256, 2**40, value * 1000])


def header_mutation(rng: random.Random, header: dict) -> dict:
    header = copy.deepcopy(header)
    targeted = rng.random() < 0.4
    if targeted:
        _targeted(rng, header)
        return header
    container, key = rng.choice(_paths(header))
    action = rng.randrange(5)
    if action == 0:
        del container[key]
    elif action == 1:
        container[key] = rng.choice(ODD_VALUES)
    elif action == 2:
        container[key] = _nudge(rng, container[key])
    elif action == 3 and isinstance(container, list):
        container.insert(rng.randrange(len(container) + 1), copy.deepcopy(container[key]))
    elif action == 3:
        container[f"{key}_extra"] = copy.deepcopy(container[key])
    else:
        other_container, other_key = rng.choice(_paths(header))
        container[key] = copy.deepcopy(other_container[other_key])
    return header


def _targeted(rng: random.Random, header: dict) -> None:
    """Edits aimed at what the issue saw: the array table, offsets, layers, profile, memory."""
    arrays, memory, layers = header["arrays"], header["memory"], header["layers"]
    choice = rng.randrange(10)
    if choice == 0 and arrays:
        entry = rng.choice(arrays)
        key = rng.choice(["dtype", "name", "nbytes", "offset", "shape"])
        entry[key] = rng.choice(DTYPES) if key == "dtype" and rng.random() < 0.7 else _nudge(rng, entry[key])
    elif choice == 1 and len(arrays) > 1:
        a, b = rng.sample(arrays, 2)
        if rng.random() < 0.5:
            a["offset"], b["offset"] = b["offset"], a["offset"]
        else:
            a["offset"] = b["offset"] + rng.choice([0, 64])
    elif choice == 2 and layers:
        layer = rng.choice(layers)
        layer["node_index"] = rng.choice([0.5, -1, len(header["graph"]["nodes"]), "0", None, 1])
    elif choice == 3 and layers:
        layer = rng.choice(layers)
        layer["tactic_provider"] = rng.choice([{"plugin": "ghost", "distribution": None, "version": None,
                                                "provider_version": None}, "ghost", {}, [], 3,
                                               {"plugin": None, "distribution": 1, "version": 2,
                                                "provider_version": 3}])
    elif choice == 4:
        entry = rng.choice(list(header["profiles"][0].values()))
        key = rng.choice(["min", "opt", "max"])
        entry[key] = rng.choice([[str(d) for d in entry[key]], [d + 1 for d in entry[key]], entry[key][:-1],
                                 [-1] * len(entry[key]), [2**40] * len(entry[key]), "1x3"])
    elif choice == 5:
        name = rng.choice(list(memory["offsets"]))
        memory["offsets"][name] = rng.choice([-1, 0, 256, 64, 1, 2**40, 0.5, "0", None])
    elif choice == 6:
        key = rng.choice(["arena_bytes", "workspace_bytes"])
        memory[key] = rng.choice([-1, 0, 2**40, 2**40 + 1, 1 << 30, memory[key] * 2, memory[key] + 256, "512"])
    elif choice == 7:
        nodes = [n for n in header["graph"]["nodes"]]
        nodes += [b for n in header["graph"]["nodes"] for b in n["attrs"].get("body", [])]
        node = rng.choice(nodes)
        attrs = node["attrs"]
        key = rng.choice(list(attrs) + ["bogus"])
        attrs[key] = rng.choice(ODD_VALUES + ([1, 1, 1, 1], [0, 0], "VALID", "SAME_UPPER", -3, 7))
    elif choice == 8:
        container, key = rng.choice(_paths(header))
        value = container[key]
        for _ in range(rng.choice([3, 40, 400])):
            value = [value]
        container[key] = value
    else:
        layer = rng.choice(layers)
        layer["tactic"] = rng.choice([{"name": "nope", "params": {}}, {"name": layer["tactic"]["name"]},
                                      {"name": layer["tactic"]["name"], "params": {"unroll": 3}}, "pointwise"])


def make_cases(plans: list[bytes], count: int, seed: int = 14) -> list[bytes]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        which = rng.randrange(len(plans))
        plan = plans[which]
        if i % 2 == 0:
            mutated = raw_mutation(rng, plan)
        else:
            head, header, blob = split_plan(plan)
            mutated = join_plan(head, header_mutation(rng, header), blob)
        cases.append(bytes([which]) + mutated)
    return cases


def test_split_and_join_give_back_the_plan():
    for plan in build_plans():
        assert join_plan(*split_plan(plan)) == plan


def test_mutated_plans_are_refused_or_load_consistently(tmp_path, monkeypatch):
    counts = tmp_path / "counts"
    monkeypatch.setenv(COUNTS_VARIABLE, str(counts))
    plans = build_plans()
    cases = make_cases(plans, CASES)
    started = time.monotonic()
    failures = run_cases("fuzz_plan_targets:load_plan", cases)
    seconds = time.monotonic() - started
    outcomes = counts.read_text().split() if counts.exists() else []
    refused, loaded, retyped = (outcomes.count(k) for k in ("refused", "loaded", "retyped"))
    print(f"\n{len(cases)} mutated plans ({len(cases) // 2} raw, {len(cases) - len(cases) // 2} header edits with "
          f"the checksum recomputed): {refused} refused with PlanError, {loaded} loaded and gave the original's "
          f"answer, {retyped} loaded as self-consistent plans of a model with another input dtype; "
          f"{len(failures)} failures; {seconds:.1f} s")
    assert not failures, "\n".join(str(f) for f in failures[:10])
    assert len(outcomes) == len(cases)
