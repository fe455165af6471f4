"""Fuzz targets for ONNX import, run by tests/fuzz_harness.py in a worker process.

:func:`import_and_build` takes a serialized model (or any bytes). Its first byte says how far
to go: ``b"C"`` runs ``plugrt check``'s per-node report, imports it and runs every check the builder makes before timing tactics
(graph passes, shapes at the profile, a tactic for every layer: :meth:`Builder.check_model`);
``b"B"`` builds the engine too (optimization level 0: no timing, no kernels run) and
serializes its plan: a model the checks pass must build (what ``plugrt check``
promises), else the case fails. Each outcome is appended, one letter a case, to the file named by
``PLUGRT_FUZZ_COUNTS`` when set: ``r`` refused with a PlugrtError, ``c`` imported and
checked, ``b`` built.
"""

from __future__ import annotations

import json
import os

from plugrt import PlugrtError
from plugrt.engine import Builder, BuilderConfig
from plugrt.onnx import import_model
from plugrt.onnx.importer import support_report
from plugrt.registry import default_registry

_BUILDER = None


def _builder() -> Builder:
    global _BUILDER
    if _BUILDER is None:
        _BUILDER = Builder(default_registry())
    return _BUILDER


def _count(letter: str) -> None:
    path = os.environ.get("PLUGRT_FUZZ_COUNTS")
    if path:
        with open(path, "a") as f:
            f.write(letter)


def import_and_build(payload: bytes):
    mode, data = payload[:1], payload[1:]
    builder = _builder()
    try:
        json.dumps(support_report(data, registry=builder.registry))
    except PlugrtError:
        pass  # what ``plugrt check`` prints before the build's checks; import must refuse too
    try:
        graph = import_model(data, registry=builder.registry)
        checked = builder.check_model(graph, BuilderConfig(optimization_level=0, progress=False), dynamic_dim=2)
    except PlugrtError:
        _count("r")
        raise
    if mode == b"B":
        config = BuilderConfig(optimization_level=0, progress=False)
        config.add_optimization_profile(checked.profile)
        try:
            engine = builder.build_engine(graph, config)
        except PlugrtError as exc:
            return f"check passed but build refused the model: {exc}"
        json.dumps(engine.inspect())
        engine.serialize()
    _count("b" if mode == b"B" else "c")
    return None
