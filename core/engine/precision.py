"""Precision: the float precision each layer runs in, a builder decision (TensorRT's FP16 mode).

The builder runs this step after the graph passes that change which ops the graph holds
and before fusion into generated kernels (:func:`plugrt.passes.optimize`'s ``precision``
hook), so that the casts it inserts fuse into their neighbours' loads and stores.

Which tensors follow a node's precision. A node computes in one float type: the inputs
and outputs that the ONNX schema binds to one type variable with an activation among them
(Conv's X, W, B and Y; LayerNormalization's X, Scale, B and Y but not its float32 Mean;
Resize's X and Y but not its scales). An op without an ONNX schema (a plugin's own op, a
fused layer) follows its float activations, and its float constants of the same dtype.
Float64 never changes; integer and bool tensors are untouched.

Choosing. Allowed precisions are FP32, and FP16 with ``BuilderConfig.fp16``; a node the
user constrained (``layer_precisions``, by ONNX node name) gets its precision first
(``prefer``: else the others, with a warning; ``obey``: else the build fails; ``int8`` is
the quantize stage's, :attr:`Int8Request.required <plugrt.ir.graph.Int8Request.required>`). A precision
is possible where the node's plugin offers a tactic for it. When the tuner times tactics
(a GPU, level >= 1), each possible precision's fastest tactic is timed and the faster
precision wins; without timing (the simulator, level 0) FP16 is preferred wherever it is
allowed. With FP16 in play the model runs once through the plugins' references at the
profile's opt shapes, on random inputs: a node whose FP32 output exceeds FP16's range
stays FP32, with a warning naming it, and the outputs are what the build's accuracy check
compares the engine with.

Rewriting. Constants of an FP16 node are converted once (the plan stores them in FP16;
one used by FP32 nodes too is kept beside its copy); a tensor read in another precision
than it was produced in gets one Cast node per precision; graph inputs and outputs keep
the model's dtypes (a Cast at each end).

``strongly_typed`` builds the model as typed: no step at all. A weakly typed model with
FP16 tensors built without ``fp16`` runs in FP32, as in TensorRT.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field

import numpy as np
from plugrt.engine.precision_rewrite import DTYPES, FP16, FP32, NAMES, rewrite
from plugrt.errors import PlugrtError
from plugrt.ir.graph import Graph
from plugrt.ir.specialize import concretize, is_host_node
from plugrt.tuning.variants import retyped

log = logging.getLogger("plugrt.builder")

CONSTRAINTS = ("prefer", "obey", "none")
#: A layer precision the quantize stage applies (an INT8 build's ``Int8Request.required``).
INT8 = "int8"
#: The largest finite float16.
FP16_MAX = float(np.finfo(np.float16).max)


@dataclass
class PrecisionReport:
    """What the precision step did."""

    #: ONNX node name (or inserted Cast's name) -> ``fp32`` / ``fp16`` / ``reformat``.
    decisions: dict[str, str] = field(default_factory=dict)
    #: ``{"layer", "reason"}`` of each node that could not run as preferred.
    fallbacks: list[dict] = field(default_factory=list)
    casts: int = 0
    #: Random inputs at the opt shapes and the model's outputs on them (the plugins'
    #: references), for the accuracy check; ``None`` when FP16 was not in play.
    feeds: dict | None = None
    reference: dict | None = None

    def as_json(self, config, accuracy: dict | None, int8=None) -> dict:
        """The plan's ``precision`` section; ``int8`` (an INT8 build's
        :class:`~plugrt.ir.graph.Int8Request`) adds its decisions, fallbacks and calibration."""
        decisions, fallbacks = dict(self.decisions), list(self.fallbacks)
        found = {"fp16": bool(config.fp16), "fp16_io": bool(config.fp16_io),
                 "strongly_typed": bool(config.strongly_typed),
                 "constraints": config.precision_constraints if config.layer_precisions else "none",
                 "layer_precisions": dict(sorted(config.layer_precisions.items()))}
        if int8 is not None:
            decisions.update(int8.decisions)
            fallbacks += [entry for entry in int8.fallbacks if entry not in fallbacks]
            found["int8"] = {"algorithm": config.calibration_algorithm, "tensors": len(int8.ranges),
                             "layers": sum(1 for d in int8.decisions.values() if d == "int8"),
                             "budget": config.accuracy_budget}
        found.update({"decisions": dict(sorted(decisions.items())), "fallbacks": fallbacks, "casts": self.casts,
                      "accuracy": accuracy})
        return found


def check_config(config) -> None:
    """Refuse contradictory precision settings."""
    if config.precision_constraints not in CONSTRAINTS:
        raise PlugrtError(f"precision constraints {config.precision_constraints!r}: use one of "
                          f"{', '.join(CONSTRAINTS)}")
    for name, precision in config.layer_precisions.items():
        if precision not in DTYPES and precision != INT8:
            raise PlugrtError(f"layer precision {name}:{precision}: the precisions are {', '.join([*DTYPES, INT8])}")
        if precision == INT8 and not config.int8:
            raise PlugrtError(f"layer precision {name}:int8 in a build without --int8: add --int8 (and calibration "
                              "data or a cache), or constrain the layer to fp16 or fp32")
    if config.strongly_typed and (config.fp16 or config.layer_precisions or config.fp16_io):
        given = "--fp16" if config.fp16 else "--layer-precision" if config.layer_precisions else "--fp16-io"
        raise PlugrtError(f"{given} with --strongly-typed: a strongly typed build runs every layer in the dtype "
                          "the model gives it; drop one of them")


def assign_precisions(graph: Graph, registry, config, tuner, profile, model_nodes: set[str],
                      check_range: bool = True) -> PrecisionReport:
    """Choose each node's precision and rewrite ``graph`` in place (see the module doc).
    ``tuner`` times precisions where it times tactics (``None``: no timing);
    ``check_range`` runs the references for FP16's range and the accuracy check."""
    report = PrecisionReport()
    if config.strongly_typed:
        return report
    constraints = _constraints(graph, config, model_nodes)
    has_fp16 = any(v.info is not None and v.info.dtype == DTYPES[FP16] for v in graph.values.values())
    if not config.fp16 and not constraints and not has_fp16 and not config.fp16_io:
        return report
    if graph.int8 is not None and graph.int8.float32:  # an integer layer's rescale stays FP32
        constraints.update({index: FP32 for index, node in enumerate(graph.nodes) if node.name in graph.int8.float32})
    opt = concretize(graph, {n: s[1] for n, s in profile.shapes.items()}, registry, profile.shape_values)
    slots, choices = {}, {}
    made_in: dict[str, str] = {name: FP16 if config.fp16_io else NAMES[opt.info(name).dtype] for name in opt.inputs
                               if opt.info(name).dtype in NAMES}  # tensor -> the precision it is made in
    for index, node in enumerate(opt.nodes):
        if is_host_node(opt, node):
            continue
        found = float_slots(opt, node)
        if found is None:
            continue
        choice = _choose(opt, node, index, found, registry, config, tuner, constraints.get(index), report, made_in)
        if choice is not None:
            slots[index], choices[index] = found, choice
            for i in found[1]:
                made_in[node.outputs[i]] = choice
    converting = [i for i, p in choices.items() if p == FP16 and _changes(opt, opt.nodes[i], slots[i], FP16)]
    if check_range and (converting or config.fp16_io):  # (FP16 bindings round too: check them)
        _check_range(graph, registry, profile, choices, slots, constraints, config, report)
    for index, precision in choices.items():
        for name in opt.nodes[index].origin or (opt.nodes[index].name,):
            report.decisions[name] = precision
    host = {index for index, node in enumerate(opt.nodes) if is_host_node(opt, node)}
    report.casts = rewrite(graph, registry, choices, slots, host, report.decisions, config.fp16_io)
    return report


# ---------------------------------------------------------------------- which tensors


def float_slots(graph: Graph, node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The input and output positions that carry ``node``'s compute type (module doc);
    ``None`` when it computes in no FP16/FP32 type."""
    ins = [graph.info(n) if n else None for n in node.inputs]
    outs = [graph.info(n) if n else None for n in node.outputs]
    movable = set(DTYPES.values())
    schema = _schema(node)
    if schema is not None:
        in_vars = [_formal(schema.inputs, i) for i in range(len(ins))]
        out_vars = [_formal(schema.outputs, i) for i in range(len(outs))]
        floats = {c.type_param_str for c in schema.type_constraints
                  if {"tensor(float16)", "tensor(float)"} <= set(c.allowed_type_strs)}
        compute = {var for var, info in zip(in_vars + out_vars, ins + outs)
                   if var in floats and info is not None and info.dtype in movable and info.value is None}
        picked_in = tuple(i for i, (var, info) in enumerate(zip(in_vars, ins))
                          if var in compute and info is not None and info.dtype in movable)
        picked_out = tuple(i for i, (var, info) in enumerate(zip(out_vars, outs))
                           if var in compute and info is not None and info.dtype in movable)
    else:
        active = {info.dtype for info in ins if info is not None and info.value is None and info.dtype in movable}
        active |= {info.dtype for info in outs if info is not None and info.dtype in movable}
        picked_in = tuple(i for i, info in enumerate(ins) if info is not None and info.dtype in active)
        picked_out = tuple(i for i, info in enumerate(outs) if info is not None and info.dtype in active)
    if not picked_in and not picked_out:
        return None
    if not any(ins[i].value is None for i in picked_in) and not picked_out:
        return None
    return picked_in, picked_out


def _schema(node):
    if node.domain not in ("", "ai.onnx"):
        return None
    try:
        import onnx.defs

        return onnx.defs.get_schema(node.op_type, int(node.opset), "")
    except Exception:  # noqa: BLE001 - no schema (or no onnx): the activation rule
        return None


def _formal(params, index: int) -> str:
    """The type string of actual argument ``index`` (a variadic last parameter repeats)."""
    if not params:
        return ""
    return params[min(index, len(params) - 1)].type_str


def _changes(graph: Graph, node, slots, precision: str) -> bool:
    """Whether running ``node`` in ``precision`` changes the dtype of any of its tensors."""
    dtype = DTYPES[precision]
    names = [node.inputs[i] for i in slots[0]] + [node.outputs[i] for i in slots[1]]
    return any(graph.info(n).dtype != dtype for n in names if n)


# ---------------------------------------------------------------------- choosing


def _constraints(graph: Graph, config, model_nodes: set[str]) -> dict[int, str]:
    """Node index -> the precision its user constraint asks (``none``: ignored)."""
    if not config.layer_precisions:
        return {}
    if config.precision_constraints == "none":
        log.warning("layer precisions given with precision constraints 'none': they are ignored; use "
                    "--precision-constraints prefer or obey")
        return {}
    where: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        for name in node.origin or (node.name,):
            where.setdefault(name, index)
    found = {}
    for name, precision in config.layer_precisions.items():
        if name in where:
            if precision != INT8:  # (INT8 is the quantize stage's: Int8Request.required)
                found[where[name]] = precision
        elif name in model_nodes:
            log.warning("layer precision %s:%s: node %r was folded away or computed on the host at build time; "
                        "the constraint has nothing to apply to", name, precision, name)
        else:
            near = difflib.get_close_matches(name, sorted(model_nodes), n=3)
            hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
            raise PlugrtError(f"layer precision {name}:{precision}: the model has no node named {name!r}{hint} "
                              "(give ONNX node names, as `plugrt inspect --json` lists them under onnx_nodes)")
    return found


def _choose(opt: Graph, node, index: int, slots, registry, config, tuner, wanted: str | None,
            report: PrecisionReport, made_in: dict) -> str | None:
    """The node's precision; ``None`` when its plugin offers no tactic in any allowed
    precision (the builder then reports the node as it would without this step).

    Timed, each precision costs its fastest tactic's time plus a conversion of each
    activation input made in the other precision (:func:`conversion_ms`), so a layer does
    not leave its neighbours' precision for a gain smaller than the Casts it would need."""
    op = registry.op(node)
    allowed = [FP16, FP32] if config.fp16 else [FP32]
    order = allowed if wanted is None else [wanted] + ([] if config.precision_constraints == "obey"
                                                       else [p for p in allowed if p != wanted])
    possible = {}
    problems = {}
    for precision in order:
        try:
            possible[precision] = _variant(opt, node, slots, precision, registry, op, tuner)
        except PlugrtError as exc:
            problems[precision] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a plugin refusing the dtype its own way
            problems[precision] = f"{type(exc).__name__}: {exc}"
    if not possible:
        if wanted is not None and config.precision_constraints == "obey":
            raise PlugrtError(f"{node.describe()}: constrained to {wanted} (--precision-constraints obey), but "
                              f"plugin {type(op).__name__} cannot run it in {wanted}: {problems.get(wanted)}; "
                              "drop the constraint or use --precision-constraints prefer")
        log.info("%s: no tactic in %s (%s); left as typed, for the build to judge", node.describe(),
                 ", ".join(order), "; ".join(problems.values()))
        return None
    if wanted is not None and wanted not in possible:
        reason = f"no {wanted} tactic ({problems.get(wanted)})"
        log.warning("%s: constrained to %s (prefer), but %s; it runs in %s", node.describe(), wanted, reason,
                    next(iter(possible)))
        report.fallbacks.append({"layer": node.name, "reason": reason})
    candidates = list(possible)
    if len(candidates) > 1 and (wanted is None or wanted not in possible) and tuner is not None:
        times = {}
        for precision in candidates:
            scratch, tactics = possible[precision]
            choice = tuner.choose(node, scratch, op, registry.owner(op), tactics, (index + 1, len(opt.nodes)),
                                  always_time=True)
            times[precision] = choice.time_ms
        if all(ms is not None for ms in times.values()):
            cost = {p: times[p] + sum(conversion_ms(opt.info(node.inputs[i])) for i in slots[0]
                                      if made_in.get(node.inputs[i], p) != p) for p in candidates}
            return min(candidates, key=lambda p: (cost[p], candidates.index(p)))
    return candidates[0]


#: What a conversion kernel is reckoned to cost beside its bytes (a launch in a CUDA
#: graph, its tail), and the memory bandwidth it moves them at.
CONVERSION_OVERHEAD_MS = 0.003
CONVERSION_BYTES_PER_MS = 2.0e9


def conversion_ms(info) -> float:
    """An estimate of converting a tensor between FP32 and FP16 (6 bytes an element)."""
    elements = int(np.prod(info.shape, dtype=np.int64))
    return CONVERSION_OVERHEAD_MS + 6 * elements / CONVERSION_BYTES_PER_MS


def _variant(opt: Graph, node, slots, precision: str, registry, op, tuner):
    """A graph where ``node`` runs in ``precision`` (its slots retyped, outputs inferred),
    and the node's candidate tactics there; raises when it cannot run so."""
    dtype = DTYPES[precision]
    return retyped(opt, node, {i: dtype for i in slots[0]}, registry, op, tuner)


def _check_range(graph: Graph, registry, profile, choices: dict, slots: dict, constraints: dict, config,
                 report: PrecisionReport) -> None:
    """Run the model through the references at opt shapes; keep FP32 where a tensor an
    FP16 node would read or write exceeds FP16's range; keep the feeds and outputs for the
    accuracy check."""
    from plugrt.bench import graph_feeds
    from plugrt.reference import ReferenceExecutor

    feeds = graph_feeds(graph, profile)
    peaks = {name: _peak(value) for name, value in feeds.items()}

    def observe(node, outputs) -> None:
        for name, value in zip([n for n in node.outputs if n], outputs):
            peaks[name] = _peak(value)

    report.reference = ReferenceExecutor(graph, registry).run(feeds, observe=observe)
    report.feeds = feeds
    for index, precision in sorted(choices.items()):
        if precision != FP16:
            continue
        node = graph.nodes[index]
        names = [node.inputs[i] for i in slots[index][0]] + [node.outputs[i] for i in slots[index][1]]
        peak = max((peaks.get(name, 0.0) for name in names if name and graph.values[name].const is None), default=0.0)
        if peak <= FP16_MAX:
            continue
        if constraints.get(index) == FP16 and config.precision_constraints == "obey":
            log.warning("%s: its tensors reach %.4g, beyond FP16's range, but it is constrained to fp16 (obey)",
                        node.describe(), peak)
            continue
        log.warning("%s: its tensors reach %.4g, beyond FP16's range (%g): it runs in FP32", node.describe(), peak,
                    FP16_MAX)
        choices[index] = FP32
        report.fallbacks.append({"layer": node.name, "reason": f"FP16 overflow (a tensor reaches {peak:.4g})"})


def _peak(value) -> float:
    """The largest finite magnitude in a float array (0 for anything else)."""
    value = np.asarray(value)
    if value.dtype.kind != "f" or not value.size:
        return 0.0
    finite = np.abs(value[np.isfinite(value)])
    return float(finite.max()) if finite.size else 0.0
