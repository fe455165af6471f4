"""Optimization profiles and builder configuration, shaped like TensorRT's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from plugrt.errors import BindingError, PlugrtError, ShapeError
from plugrt.ir.dims import format_shape, is_static, shape_problem

if TYPE_CHECKING:
    from plugrt.ir.graph import Graph

WHICH = ("min", "opt", "max")


@dataclass
class OptimizationProfile:
    """The range of shapes each dynamic input takes: min, opt (tactics are chosen and
    timed here) and max (memory is planned for it)."""

    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    #: Shape-tensor inputs (TensorRT's shape tensors): their values are read on the host at
    #: run time. Here the opt values, which layers are tuned at (:attr:`value_ranges` has
    #: each value's min and max; a run outside them is refused).
    shape_values: dict[str, list] = field(default_factory=dict)
    #: Per input, which of min/opt/max the user gave (the others copy one of them); messages
    #: name only these. Absent: all three.
    given: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Shape-tensor inputs' ``(min values, max values)``, elementwise bounds of a run's values.
    value_ranges: dict[str, tuple[list, list]] = field(default_factory=dict)

    def set_shape_input(self, name: str, min, opt, max) -> "OptimizationProfile":
        """Mark ``name`` as a shape-tensor input whose values lie elementwise within
        ``min``..``max`` (TensorRT's ``set_shape_input``); layers are tuned at ``opt``, and
        memory is planned for the largest tensors the range's corners make.

        :raises PlugrtError: for value lists of different lengths or out of order.
        """
        try:
            lists = [np.asarray(v).reshape(-1).tolist() for v in (min, opt, max)]
            if any(not isinstance(v, (bool, int, float)) for values in lists for v in values):
                raise TypeError
        except (TypeError, ValueError):
            raise PlugrtError(f"profile for shape-tensor input {name!r}: values must be sequences of numbers, got "
                              f"{min!r}, {opt!r}, {max!r}") from None
        if len({len(values) for values in lists}) > 1:
            raise PlugrtError(f"profile for shape-tensor input {name!r}: min, opt and max must give as many values, "
                              f"got {', '.join(str(len(v)) for v in lists)}")
        for k, (a, b, c) in enumerate(zip(*lists)):
            if not a <= b <= c:
                raise PlugrtError(f"profile for shape-tensor input {name!r}: value {k} needs min <= opt <= max, "
                                  f"got {a}, {b}, {c}")
        self.shape_values[name] = lists[1]
        self.value_ranges[name] = (lists[0], lists[2])
        return self

    def set_shape_values(self, name: str, values) -> "OptimizationProfile":
        """Mark ``name`` as a shape-tensor input of exactly these values (min = opt = max)."""
        return self.set_shape_input(name, values, values, values)

    def value_corners(self, name: str) -> tuple[list, list, list]:
        """Shape-tensor input ``name``'s min, opt and max values."""
        low, high = self.value_ranges.get(name, (self.shape_values[name], self.shape_values[name]))
        return low, self.shape_values[name], high

    def values_at(self, which: int) -> dict[str, list]:
        """Every shape-tensor input's min (0), opt (1) or max (2) values."""
        return {name: self.value_corners(name)[which] for name in self.shape_values}

    def check_values(self, values: dict) -> None:
        """Raise :class:`BindingError` unless a run's values of shape-tensor inputs (name ->
        values) lie within the profile's ranges."""
        for name, given in values.items():
            problem = self.values_problem(name, given)
            if problem:
                raise BindingError(f"shape-tensor input {name!r}: {problem}; rebuild with a wider value range "
                                   "(OptimizationProfile.set_shape_input, --min-values/--max-values)")

    def values_problem(self, name: str, values) -> str | None:
        low, _, high = self.value_corners(name)
        flat = np.asarray(values).reshape(-1).tolist()
        if len(flat) != len(low):
            return f"{len(flat)} values given, the profile has {len(low)}"
        for k, (a, v, c) in enumerate(zip(low, flat, high)):
            if not a <= v <= c:
                return f"value {k} is {v}, outside the profile's range [{a}, {c}] (min {low}, max {high})"
        return None

    def set_shape(self, name: str, min, opt, max, given=WHICH) -> "OptimizationProfile":
        """Set ``name``'s shape range; ``given`` says which of the three the user gave
        (the CLI fills in the others from them), for messages.

        :raises ShapeError: for a dim that is negative or over :data:`plugrt.ir.dims.MAX_DIM`,
            a shape of more than :data:`plugrt.ir.dims.MAX_ELEMENTS` elements, or shapes out of order.
        """
        given = tuple(w for w in WHICH if w in given) or WHICH
        try:
            triple = tuple(tuple(int(d) for d in s) for s in (min, opt, max))
        except (TypeError, ValueError):
            raise PlugrtError(f"profile for input {name!r}: shapes must be sequences of ints, got "
                              f"{min!r}, {opt!r}, {max!r}") from None
        shapes = dict(zip(WHICH, triple))
        for which in given:
            problem = shape_problem(shapes[which])
            if problem:
                raise ShapeError(f"profile {which} shape {list(shapes[which])} for input {name!r}: {problem}; "
                                 "give a smaller shape")
        if len({len(shapes[w]) for w in given}) > 1:
            raise PlugrtError(f"profile for input {name!r}: the {'/'.join(given)} shapes "
                              f"{', '.join(str(list(shapes[w])) for w in given)} must have the same rank")
        if len({len(s) for s in triple}) > 1:
            raise PlugrtError(f"profile for input {name!r}: min, opt and max must have the same rank")
        for axis, dims in enumerate(zip(*triple)):
            if list(dims) != sorted(dims):
                named = " <= ".join(given)
                got = ", ".join(f"{w} {shapes[w][axis]}" for w in given)
                raise PlugrtError(f"profile for input {name!r}: dim {axis} needs {named}, got {got}")
        self.shapes[name] = triple
        if given != WHICH:
            self.given[name] = given
        return self

    @classmethod
    def from_given(cls, min: dict, opt: dict, max: dict) -> "OptimizationProfile":
        """A profile from per-input shapes where some of min/opt/max may be missing (the
        CLI's flags): one not given copies one given (min and opt the smallest given, max
        the largest); messages name only the given ones."""
        profile = cls()
        for name in sorted(set(min) | set(opt) | set(max)):
            given = [shapes.get(name) for shapes in (min, opt, max)]
            known = [shape for shape in given if shape is not None]
            low, mid, high = (g if g is not None else (known[-1] if i == 2 else known[0]) for i, g in enumerate(given))
            which = tuple(w for w, g in zip(WHICH, given) if g is not None)
            profile.set_shape(name, low, mid, high, given=which)
        return profile

    def get_shape(self, name: str):
        return self.shapes.get(name)

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """Raise :class:`BindingError` unless ``shape`` lies within the profile."""
        low, _, high = self.shapes[name]
        if len(shape) != len(low):
            raise BindingError(f"input binding {name!r}: expected rank {len(low)}, got shape {list(shape)}")
        for axis, (a, size, c) in enumerate(zip(low, shape, high)):
            if not a <= size <= c:
                raise BindingError(
                    f"input binding {name!r}: dim {axis} is {size}, outside the engine's profile range "
                    f"[{a}, {c}] (profile min {list(low)}, max {list(high)}); rebuild with a wider profile"
                )

    def contains(self, name: str, shape: tuple[int, ...]) -> bool:
        low, _, high = self.shapes[name]
        return len(shape) == len(low) and all(a <= size <= c for a, size, c in zip(low, shape, high))

    def as_json(self) -> dict:
        data = {name: {"min": list(a), "opt": list(b), "max": list(c)} for name, (a, b, c) in self.shapes.items()}
        for name, values in self.shape_values.items():
            low, _, high = self.value_corners(name)
            data[name].update({"values": list(values), "values_min": list(low), "values_max": list(high)})
        return data

    @classmethod
    def from_json(cls, data: dict) -> "OptimizationProfile":
        profile = cls()
        for name, entry in data.items():
            profile.set_shape(name, entry["min"], entry["opt"], entry["max"])
            if "values" in entry:
                values = entry["values"]
                profile.set_shape_input(name, entry.get("values_min", values), values, entry.get("values_max", values))
        return profile


@dataclass
class BuilderConfig:
    """What the builder may do: optimization profiles, a workspace limit, which graph
    passes run (``fusion=False`` keeps every op its own layer; ``disabled_passes`` names
    passes to skip, see :mod:`plugrt.passes`), and how tactics are chosen
    (:mod:`plugrt.tuning.tuner`)."""

    profiles: list[OptimizationProfile] = field(default_factory=list)
    max_workspace_bytes: int = 1 << 30
    fusion: bool = True
    disabled_passes: set[str] = field(default_factory=set)
    #: TensorRT's 0..5: 0 takes each plugin's first tactic untimed, 1-4 time the first
    #: 2, 3, 3 or 6 of each layer (``TACTICS_BY_LEVEL``), 5 times them all.
    optimization_level: int = 3
    #: Allow tactics on TF32 tensor cores (``Tactic.math == "tf32"``) for float32 layers.
    tf32: bool = True
    #: A timing cache file (JSON), read before the build and written after it when new
    #: timings were made; a missing file starts an empty cache.
    timing_cache: str | None = None
    #: Show one updating line on stderr (a terminal) while tactics are timed.
    progress: bool = True
    #: Let layers run in FP16 where a plugin offers it and it is faster (TensorRT's kFP16;
    #: :mod:`plugrt.engine.precision`).
    fp16: bool = False
    #: ONNX node name -> ``"fp32"`` or ``"fp16"``: per-layer precision constraints.
    layer_precisions: dict[str, str] = field(default_factory=dict)
    #: How ``layer_precisions`` bind: ``prefer`` (followed where the layer's plugin can,
    #: else a warning), ``obey`` (else the build fails) or ``none`` (ignored).
    precision_constraints: str = "prefer"
    #: The engine's float32 inputs and outputs become FP16 bindings (TensorRT's
    #: ``--inputIOFormats=fp16``): no conversion at either end of an FP16 engine.
    fp16_io: bool = False
    #: Binding name -> memory format (TensorRT's ``--inputIOFormats``/``--outputIOFormats``
    #: layouts): ``"channels_last"`` binds an ``[N, C, spatial...]`` input or output as
    #: ``[N, spatial..., C]`` (its profile shapes, feeds and results in that layout), so a
    #: caller holding channels-last data hands it over without a transpose on either side.
    io_formats: dict[str, str] = field(default_factory=dict)
    #: Build the model exactly as typed: no precision choice (``fp16`` and
    #: ``layer_precisions`` are refused with it).
    strongly_typed: bool = False
    #: After a build that changed precisions, run the engine on the precision step's random
    #: inputs at the opt shapes and record its relative error against the model's reference.
    accuracy_check: bool = True
    #: Let layers run in INT8 where calibration gives their inputs a range (TensorRT's
    #: kINT8; :mod:`plugrt.quantization.int8`).
    int8: bool = False
    #: Calibration batches: an ``.npz`` file or a folder of them (one batch each, keyed by
    #: input name), or any iterable of feed dicts.
    calibration_data: object = None
    #: ``entropy`` (TensorRT's entropy calibrator 2), ``minmax``, ``percentile`` or ``mse``.
    calibration_algorithm: str = "entropy"
    calibration_percentile: float = 99.99
    #: A text calibration cache: read when it exists (for this model and algorithm), else
    #: written after calibration.
    calibration_cache: str | None = None
    #: Keep the most sensitive layers in float until the outputs are within this relative
    #: error of the FP32 network's (:mod:`plugrt.quantization.budget`).
    accuracy_budget: float | None = None
    #: ``metric(output name, int8 output, fp32 output) -> error`` for the budget.
    accuracy_metric: object = None
    #: Input shapes (name -> shape, each set inside a profile) the layers are also tuned
    #: at: a context runs those tactics at exactly these shapes (``--specialize-shapes``).
    specialize_shapes: list = field(default_factory=list)

    def add_optimization_profile(self, profile: OptimizationProfile) -> int:
        """Add a profile; return its index (what a context selects). Each profile is tuned
        at its own opt shapes; memory is planned for the largest of their max shapes."""
        if not isinstance(profile, OptimizationProfile):
            raise PlugrtError(f"add_optimization_profile takes an OptimizationProfile, got {type(profile).__name__}")
        self.profiles.append(profile)
        return len(self.profiles) - 1


def resolve_profiles(graph: Graph, config: BuilderConfig) -> list[OptimizationProfile]:
    """Every profile of the config resolved (:func:`resolve_profile`); one for a config
    without any (a static model)."""
    return [resolve_profile(graph, config, index) for index in range(max(len(config.profiles), 1))]


def resolve_specializations(graph: Graph, config: BuilderConfig, profiles: list) -> list[tuple[int, dict]]:
    """``(profile index, every input's shape)`` of each of ``config.specialize_shapes``:
    static inputs filled in; the first profile holding all the shapes."""
    found = []
    for k, given in enumerate(config.specialize_shapes):
        unknown = sorted(set(given) - set(graph.inputs))
        if unknown:
            raise PlugrtError(f"specialized shapes {k}: {', '.join(map(repr, unknown))} is not an input of the model; "
                              f"the inputs are {', '.join(map(repr, graph.inputs))}")
        shapes = {name: tuple(int(d) for d in given.get(name, profiles[0].shapes[name][1])) for name in graph.inputs}
        missing = [n for n in graph.inputs if n not in given and not is_static(graph.info(n).shape)]
        inside = [i for i, p in enumerate(profiles) if all(p.contains(n, s) for n, s in shapes.items())]
        if missing or not inside:
            why = f"give input {missing[0]!r} too" if missing else "they lie in no optimization profile"
            raise PlugrtError(f"specialized shapes {k} ({', '.join(f'{n}:{list(s)}' for n, s in shapes.items())}): "
                              f"{why}; specialize shapes inside a profile (--min-shapes/--max-shapes)")
        found.append((inside[0], shapes))
    return found


def profile_index(engine, index) -> int:
    """``index`` checked as one of ``engine``'s optimization profiles."""
    count = len(engine.profiles)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < count:
        raise PlugrtError(f"optimization profile {index!r}: the engine has {count} profile(s), 0 to {count - 1}")
    return int(index)


def check_binding(profiles: list[OptimizationProfile], index: int, name: str, shape: tuple[int, ...]) -> None:
    """Raise :class:`BindingError` unless input ``name``'s ``shape`` lies within profile
    ``index`` (the one a context uses); the message gives every profile's range and one
    that accepts the shape."""
    if len(profiles) == 1:
        profiles[0].check(name, shape)
        return
    if profiles[index].contains(name, shape):
        return
    low = profiles[index].shapes[name][0]
    if len(shape) != len(low):
        raise BindingError(f"input binding {name!r}: expected rank {len(low)}, got shape {list(shape)}")
    ranges = "; ".join(f"profile {i}: min {list(p.shapes[name][0])}, max {list(p.shapes[name][2])}"
                       for i, p in enumerate(profiles))
    fits = [i for i, p in enumerate(profiles) if p.contains(name, shape)]
    fix = (f"select profile {fits[0]} first (context.set_optimization_profile_async({fits[0]}, stream); "
           f"--profile {fits[0]} on the command line)" if fits else "rebuild with a profile that covers it")
    raise BindingError(f"input binding {name!r}: shape {list(shape)} is outside profile {index}, the one this "
                       f"context uses ({ranges}); {fix}")


def resolve_profile(graph: Graph, config: BuilderConfig, index: int = 0) -> OptimizationProfile:
    """The config's profile ``index`` with static inputs filled in; every dynamic input
    must be in it."""
    given = config.profiles[index] if config.profiles else OptimizationProfile()
    where = f"profile {index}" if len(config.profiles) > 1 else "profile"
    profile = OptimizationProfile()
    for name in graph.inputs:
        info = graph.info(name)
        entry = given.get_shape(name)
        if entry is None and name in given.shape_values and len(info.shape) == 1 and not is_static(info.shape):
            entry = ((len(given.shape_values[name]),),) * 3  # (a shape-tensor input's shape: its values')
        if entry is None:
            if not is_static(info.shape):
                raise PlugrtError(f"input {name!r} has dynamic shape {format_shape(info.shape)}; give its "
                                  f"min/opt/max shapes in an optimization profile (--min-shapes/--opt-shapes/"
                                  f"--max-shapes {name}:...)")
            entry = (tuple(info.shape),) * 3
        named = given.given.get(name, WHICH)
        for which, shape in zip(WHICH, entry):
            if which not in named:
                continue  # a copy of a shape the user gave
            if len(shape) != len(info.shape) or any(isinstance(d, int) and d != s for d, s in zip(info.shape, shape)):
                raise PlugrtError(f"{where} {which} shape {list(shape)} for input {name!r} does not fit the "
                                  f"model's shape {format_shape(info.shape)}")
        profile.set_shape(name, *entry, given=named)
        if name in given.shape_values:
            values = given.value_corners(name)
            if len(values[1]) != math.prod(entry[2]) or entry[0] != entry[2]:
                raise PlugrtError(f"shape-tensor input {name!r} must have one fixed shape holding its "
                                  f"{len(values[1])} values")
            profile.set_shape_input(name, *values)
    unknown = sorted(set(given.shapes) - set(graph.inputs))
    if unknown:
        raise PlugrtError(f"the {where} names {', '.join(map(repr, unknown))}, which are not inputs of the "
                          f"model; the inputs are {', '.join(map(repr, graph.inputs))}")
    return profile
