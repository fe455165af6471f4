"""The plan check: build a one-node engine with the real builder, and for every tactic
save it as a plan file, load it again, run it through an execution context and compare.

The builder runs without fusion and at optimization level 0 (the plugin's first tactic,
untimed, on a GPU as in the simulator); each other tactic is put in the layer record the
way the tuner would have recorded it, so every tactic takes the whole road: plan header,
``Engine.load`` (plugin and version checks, inference), the context's tactic lookup by
recorded name and parameters, arena views, prebuilt launches.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import replace

from plugrt.testing.comparison import canonical_json, compare

_HINT = "a plan must rebuild exactly this node and tactic; see the message"


def plan_round_trips(run) -> tuple[list, list[tuple[str, bytes]]]:
    """``(failures, [(label, plan bytes)])`` for an :class:`~plugrt.testing.example_run.ExampleRun`."""
    from plugrt.engine import Builder, BuilderConfig

    failures: list = []
    plans: list[tuple[str, bytes]] = []
    # Strongly typed: the plan must hold the node exactly as the example types it (a weakly
    # typed FP16 example would run in FP32, through casts of a plugin the kit does not load).
    config = BuilderConfig(fusion=False, optimization_level=0, progress=False, strongly_typed=True)
    try:
        with run.watch("plan build"):
            engine = Builder(run.registry).build_engine(run.model, config)
    except Exception as exc:
        return [run.failure("plan", f"the builder failed on the example: {type(exc).__name__}: {exc}", _HINT)], plans
    tactics, _ = run.tactic_list()
    position = _layer_of(engine, run.node)
    variants = [(t.name, t) for t in tactics] if position is not None and tactics else [("", None)]
    original, _ = run.serialized(run.node)
    with _plan_folder(run.plan_dir) as folder:
        for number, (name, tactic) in enumerate(variants):
            path = os.path.join(folder, f"{_safe(run.op_label)}-{run.index}-{number}.plan")
            built = _with_tactic(engine, position, tactic) if tactic is not None else engine
            failures += _round_trip(run, built, path, name, tactic, position, original, plans)
    return failures, plans


def _round_trip(run, engine, path: str, name: str, tactic, position, original, plans: list) -> list:
    from plugrt.engine import Engine

    phase = "plan save"
    try:
        with run.watch(phase):
            engine.save(path)
        with open(path, "rb") as f:
            plans.append((f"tactic {name!r}" if name else "the built engine", f.read()))
        phase = "plan load"
        with run.watch(phase):
            loaded = Engine.load(path, registry=run.registry)
        phase = "plan execute"
        with run.watch(phase):
            context = loaded.create_execution_context()
            got = context.execute(run.feeds)
    except Exception as exc:
        hint = ("the engine runs the tactic on views of its arena and workspace, as the kit's own runs do: "
                "see this example's guards and tactics checks") if phase == "plan execute" else _HINT
        return [run.failure("plan", f"{phase} raised {type(exc).__name__}: {exc}", hint, name)]
    failures = []
    if tactic is not None:
        failures += _identity_failures(run, loaded, context, position, tactic)
    rtol, atol = run.tolerance(tactic) if tactic is not None else (run.example.rtol, run.example.atol)
    for i, (output, want) in enumerate(zip(run.node.outputs, run.expected)):
        problem = compare(got[output], want, rtol, atol, values=run.op.foldable)
        if problem:
            failures.append(run.failure("plan", f"output {i} of the engine loaded from the plan differs from the "
                                        f"reference: {problem}", _HINT, name))
    node = loaded.graph.nodes[loaded.layers[position].node_index] if position is not None else None
    if node is not None and isinstance(original, dict):
        again, error = run.serialized(node)
        if error or canonical_json(again) != canonical_json(original):
            failures.append(run.failure("plan", "serialize() of the node loaded from the plan differs from the "
                                        f"original's ({error or again!r} vs {original!r})",
                                        "serialize() must depend only on what the plan stores (attributes, "
                                        "input types)", name))
    return failures


def _identity_failures(run, loaded, context, position: int, tactic) -> list:
    """The plan records the tactic's name and parameters, and loading finds exactly it."""
    layer = loaded.layers[position]
    recorded = layer.tactic
    wanted = json.loads(json.dumps(tactic.identity(), default=repr))
    if recorded != wanted:
        return [run.failure("plan", f"the plan records {recorded!r} for this tactic, not {wanted!r}", _HINT,
                            tactic.name)]
    graph = context.current.graph
    node = graph.nodes[layer.node_index]
    ins = [graph.info(n) if n else None for n in node.inputs]
    outs = [graph.info(n) for n in node.outputs if n]
    try:
        candidates = run.offered(node, ins, outs)
    except Exception as exc:
        return [run.failure("plan", f"tactics() raised on the loaded node: {type(exc).__name__}: {exc}", _HINT,
                            tactic.name)]
    exact = [t for t in candidates if t.identity() == recorded]
    if len(exact) == 1:
        return []
    if not exact:
        names = ", ".join(f"{t.name}{dict(t.params)}" for t in candidates) or "none"
        return [run.failure("plan", f"loading the plan finds no tactic named {recorded['name']!r} with parameters "
                            f"{recorded['params']!r} (offered: {names}); the context falls back to another",
                            "tactics() must offer the same tactics, with JSON-stable params, for the same node",
                            tactic.name)]
    return [run.failure("plan", f"{len(exact)} tactics share the name and parameters the plan records, so a plan "
                        "cannot tell them apart", "give each tactic a unique (name, params)", tactic.name)]


def _layer_of(engine, node) -> int | None:
    """The layer running the example's node (``None``: the passes removed or replaced it)."""
    for position, layer in enumerate(engine.layers):
        built = engine.graph.nodes[layer.node_index]
        if built.op_type == node.op_type and built.domain == node.domain:
            return position
    return None


def _with_tactic(engine, position: int, tactic):
    """The engine with layer ``position`` recorded as running ``tactic``."""
    from plugrt.engine import Engine

    layers = list(engine.layers)
    layers[position] = replace(layers[position], tactic=tactic.identity(), workspace_bytes=int(tactic.workspace_bytes),
                               tactic_provider=dict(tactic.source) if tactic.source else None,
                               generic_tactics=None)  # (the tactic at every shape)
    workspace = max(layer.workspace_bytes for layer in layers)
    return Engine(engine.graph, engine.profile, layers, engine.offsets, engine.arena_bytes, workspace,
                  engine.registry, engine.shapes, engine.device, engine.passes, profiles=engine.profiles)


@contextlib.contextmanager
def _plan_folder(folder: str | None):
    """The caller's folder (plans are kept there), or a temporary one."""
    if folder is not None:
        os.makedirs(folder, exist_ok=True)
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="plugrt-conformance-") as tmp:
        yield tmp


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label)


__all__ = ["plan_round_trips"]
