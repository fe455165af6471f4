"""Optimization profiles and builder configuration, shaped like TensorRT's."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from plugrt.errors import BindingError, PlugrtError


@dataclass
class OptimizationProfile:
    """The range of shapes each dynamic input takes: min, opt (tactics are chosen and
    timed here) and max (memory is planned for it)."""

    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    #: Shape-tensor inputs: their values are read on the host at run time (TensorRT's
    #: shape tensors); the value given here is the one the engine is built and planned for.
    shape_values: dict[str, list] = field(default_factory=dict)

    def set_shape_values(self, name: str, values) -> "OptimizationProfile":
        """Mark ``name`` as a shape-tensor input, built for ``values``."""
        self.shape_values[name] = np.asarray(values).reshape(-1).tolist()
        return self

    def set_shape(self, name: str, min, opt, max) -> "OptimizationProfile":
        triple = tuple(tuple(int(d) for d in s) for s in (min, opt, max))
        low, mid, high = triple
        if not len(low) == len(mid) == len(high):
            raise PlugrtError(f"profile for input {name!r}: min, opt and max must have the same rank")
        for axis, (a, b, c) in enumerate(zip(low, mid, high)):
            if not 0 <= a <= b <= c:
                raise PlugrtError(f"profile for input {name!r}: dim {axis} needs 0 <= min <= opt <= max, got {a}, {b}, {c}")
        self.shapes[name] = triple
        return self

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

    def as_json(self) -> dict:
        data = {name: {"min": list(a), "opt": list(b), "max": list(c)} for name, (a, b, c) in self.shapes.items()}
        for name, values in self.shape_values.items():
            data[name]["values"] = list(values)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "OptimizationProfile":
        profile = cls()
        for name, entry in data.items():
            profile.set_shape(name, entry["min"], entry["opt"], entry["max"])
            if "values" in entry:
                profile.set_shape_values(name, entry["values"])
        return profile


@dataclass
class BuilderConfig:
    """What the builder may do: profiles (one for now), a workspace limit, which graph
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

    def add_optimization_profile(self, profile: OptimizationProfile) -> int:
        if self.profiles:
            raise PlugrtError("this plugrt supports one optimization profile per engine")
        self.profiles.append(profile)
        return len(self.profiles) - 1
