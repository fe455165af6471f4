"""Graph passes: the optimizations the builder runs between import and tactic selection.

Each core pass is one module here with one function ``run(graph, registry) -> int`` that
rewrites the graph in place and returns how many rewrites it made (0: nothing to do).
:data:`PIPELINE` is the order; :func:`optimize` runs it, plugins' passes included
(``plugrt_passes``), validates the graph after every pass, and logs node counts.

Order, and why:

1. cleanup: constant folding (shape computations included), no-op removal, the plugins'
   cleanup passes (the built-in shape family's: pairs of layout ops that cancel or merge),
   common subexpressions, dead code;
2. fusion that changes what ops the graph holds: scales (an op's ``as_scale``) folded
   into anchor weights, then the plugins' fusion passes (primitive-op patterns replaced
   by a plugin's op: the built-ins' LayerNorm, Softmax and GELU recognizers, a contrib
   plugin's attention), lowest ``priority`` first, then plugin name, then pass name. A
   node one pass has rewritten is not there for a later pass to match: the first wins;
3. quantization: an INT8 build's calibrated ranges are handed to the graph
   (:class:`~plugrt.ir.graph.Int8Request`), then the plugins' ``quantize`` passes run
   (the built-in quant family's: Q/DQ inserted where the ranges allow, Q/DQ pairs around
   anchors turned into integer anchors); they run in every build, so a model's own Q/DQ
   placement (explicit quantization) is honoured with or without ``--no-fusion``; dead
   code (the Q/DQ nodes integer layers now read past); then the builder's precision
   step (FP16);
4. fusion into generated kernels: epilogues onto anchors, then chains of pointwise ops;
5. dead code again.

``--no-fusion`` (``BuilderConfig.fusion = False``) skips groups 2 and 4;
``--disable-pass NAME`` skips one pass (a plugin's pass is named ``plugin:pass``; its bare
``pass`` name works too where no other pass has it).
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from plugrt.errors import PlugrtError
from plugrt.ir.graph import Graph
from plugrt.ir.validate import validate_graph

log = logging.getLogger("plugrt.passes")

CLEANUP = "cleanup"
FUSION = "fusion"
QUANTIZE = "quantize"


@dataclass(frozen=True)
class PassEntry:
    """One step of the pipeline: a name, its group and the function that runs it."""

    name: str
    group: str
    run: Callable[[Graph, object], int]
    plugin: str | None = None


@dataclass(frozen=True)
class PassResult:
    """What one pass did: node counts before and after, rewrites, seconds."""

    name: str
    nodes_before: int
    nodes_after: int
    rewrites: int
    seconds: float

    def as_json(self) -> dict:
        """What a plan records: no timings, so the same build gives the same plan file."""
        return {"name": self.name, "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
                "rewrites": self.rewrites}


#: (module name, group), in order; a bare group name marks where the plugins' passes of
#: that stage run.
PIPELINE: tuple = (
    ("fold_constants", CLEANUP),
    ("remove_noops", CLEANUP),
    CLEANUP,
    ("eliminate_common_subexpressions", CLEANUP),
    ("eliminate_dead_code", CLEANUP),
    ("fold_scales", FUSION),
    FUSION,
    ("eliminate_dead_code", CLEANUP),
    QUANTIZE,
    ("eliminate_dead_code", CLEANUP),
    ("fuse_epilogues", FUSION),
    ("fuse_pointwise", FUSION),
    ("eliminate_dead_code", CLEANUP),
)


def core_pass_names() -> list[str]:
    return sorted({entry[0] for entry in PIPELINE if isinstance(entry, tuple)})


def pipeline(registry) -> list[PassEntry]:
    """The passes in the order they run, the registry's plugin passes included."""
    entries = []
    for step in PIPELINE:
        if isinstance(step, str):
            for owner, graph_pass in registry.passes(step):
                entries.append(PassEntry(f"{owner}:{graph_pass.name}", step, graph_pass.run, owner))
            continue
        name, group = step
        module = importlib.import_module(f"plugrt.passes.{name}")
        entries.append(PassEntry(name, group, module.run))
    return entries


#: The pass before which the builder's precision step runs (:mod:`plugrt.engine.precision`).
PRECISION_BEFORE = "fuse_epilogues"
PRECISION_STEP = "assign_precision"
#: The builder's INT8 step (calibration), before the ``quantize`` passes.
INT8_STEP = "calibrate_int8"


def optimize(graph: Graph, registry, fusion: bool = True, disabled: Iterable[str] = (),
             precision: Callable[[Graph], int] | None = None,
             int8: Callable[[Graph], int] | None = None) -> list[PassResult]:
    """Run the pipeline on ``graph`` in place; return what each pass did.

    ``precision(graph) -> rewrites`` (the builder's precision step) runs after the passes
    that change which ops the graph holds and before fusion into generated kernels, so
    that the casts it inserts fuse into their neighbours. ``int8(graph) -> count`` (the
    builder's calibration, which sets :attr:`Graph.int8`) runs before the ``quantize``
    passes.

    :raises PlugrtError: for a disabled name that is no pass, or a pass that breaks the
        graph (named, with the problem).
    """
    entries = pipeline(registry)
    disabled = {_full_name(entries, name) for name in disabled}
    unknown = disabled - {e.name for e in entries}
    if unknown:
        known = ", ".join(sorted({e.name for e in entries}))
        raise PlugrtError(f"--disable-pass {', '.join(sorted(unknown))}: no such pass; the passes are {known}")
    results = []
    runs = [entry for entry in entries if entry.name not in disabled and (fusion or entry.group != FUSION)]
    if precision is not None:
        at = next((i for i, e in enumerate(entries) if e.name == PRECISION_BEFORE), len(entries))
        position = sum(1 for e in entries[:at] if e in runs)
        runs.insert(position, PassEntry(PRECISION_STEP, FUSION, lambda g, r: precision(g)))
    if int8 is not None:
        at = next((i for i, e in enumerate(runs) if e.group == QUANTIZE or e.name == PRECISION_STEP),
                  next((i for i, e in enumerate(runs) if e.name == PRECISION_BEFORE), len(runs)))
        runs.insert(at, PassEntry(INT8_STEP, QUANTIZE, lambda g, r: int8(g)))
    for entry in runs:
        before, started = len(graph.nodes), time.perf_counter()
        try:
            rewrites = int(entry.run(graph, registry) or 0)
        except PlugrtError as exc:
            if entry.name in (PRECISION_STEP, INT8_STEP):
                raise
            raise PlugrtError(f"pass {entry.name}: {exc}") from exc
        seconds = time.perf_counter() - started
        try:
            validate_graph(graph, registry)
        except PlugrtError as exc:
            owner = f" of plugin {entry.plugin!r}" if entry.plugin else ""
            raise PlugrtError(f"pass {entry.name}{owner} left an invalid graph: {exc}; build with "
                              f"--disable-pass {entry.name} to work around it") from exc
        result = PassResult(entry.name, before, len(graph.nodes), rewrites, seconds)
        results.append(result)
        log.info("pass %-32s %4d -> %4d nodes (%d rewrites, %.3f s)", entry.name, before, len(graph.nodes),
                 rewrites, seconds)
    return results


def _full_name(entries: list[PassEntry], name: str) -> str:
    """``name`` as the pipeline names it: a plugin pass's bare name stands for
    ``plugin:name`` where exactly one plugin has a pass of that name."""
    if any(entry.name == name for entry in entries):
        return name
    owners = {entry.name for entry in entries if entry.plugin and entry.name.split(":", 1)[1] == name}
    return owners.pop() if len(owners) == 1 else name


#: The binding formats a build may ask for (``--io-format NAME:FORMAT``); ``linear`` is the
#: model's own layout (asking for it changes nothing).
IO_FORMATS = ("linear", "channels_last")


def bind_formats(graph: Graph, registry, formats: dict) -> list[PassResult]:
    """Give the bindings named in ``formats`` their formats: the plugins' ``bindings``
    passes rewrite them (each takes out of :attr:`Graph.io_formats` what it did), right
    after import, before the profiles are read (their shapes are in the new layouts).

    :raises PlugrtError: for a name that is no binding, a format that is not one of
        :data:`IO_FORMATS`, or one no installed plugin rewrote.
    """
    for name, form in formats.items():
        if name not in graph.inputs and name not in graph.outputs:
            raise PlugrtError(f"--io-format {name}:{form}: the model has no input or output {name!r}; its bindings "
                              f"are {', '.join(map(repr, [*graph.inputs, *graph.outputs]))}")
        if form not in IO_FORMATS:
            raise PlugrtError(f"--io-format {name}:{form}: unknown format; the formats are {', '.join(IO_FORMATS)}")
    graph.io_formats = {name: form for name, form in formats.items() if form != "linear"}
    results = []
    for owner, graph_pass in registry.passes("bindings") if graph.io_formats else ():
        before, started = len(graph.nodes), time.perf_counter()
        try:
            rewrites = int(graph_pass.run(graph, registry) or 0)
            validate_graph(graph, registry)
        except PlugrtError as exc:
            raise PlugrtError(f"pass {owner}:{graph_pass.name}: {exc}") from exc
        results.append(PassResult(f"{owner}:{graph_pass.name}", before, len(graph.nodes), rewrites,
                                  time.perf_counter() - started))
    if graph.io_formats:
        name, form = next(iter(graph.io_formats.items()))
        raise PlugrtError(f"--io-format {name}:{form}: no installed plugin's bindings pass gives a binding that "
                          "format; install one that does, or leave the option out to keep the model's layout")
    return results
