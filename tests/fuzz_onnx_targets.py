"""Fuzz targets for ONNX import, run by tests/fuzz_harness.py in a worker process.

:func:`import_and_build` takes a serialized model (or any bytes). Its first byte says how far
to go: ``b"C"`` runs ``plugrt check``'s per-node report, imports it and runs every check the builder makes before timing tactics
(graph passes, shapes at the profile, a tactic for every layer: :meth:`Builder.check_model`);
``b"B"`` builds the engine too (optimization level 0: no timing, no kernels run) and
serializes its plan and loads it back: a model the checks pass must build (what ``plugrt check``
promises), else the case fails. Each outcome is appended, one letter a case, to the file named by
``PLUGRT_FUZZ_COUNTS`` when set: ``r`` refused with a PlugrtError, ``c`` imported and
checked, ``b`` built.
"""

from __future__ import annotations

import json
import os

from plugrt import PlugrtError
from plugrt.engine import Builder, BuilderConfig, Engine
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
        loaded = Engine.deserialize(engine.serialize(), registry=builder.registry)
        if loaded.input_names != engine.input_names:
            return f"the plan of an accepted model loads with inputs {loaded.input_names}, not {engine.input_names}"
    _count("b" if mode == b"B" else "c")
    return None


def cli_check(payload: bytes):
    """``plugrt check FILE --json`` in this process: any exception escaping ``main`` is the
    traceback a user would see; the exit status must be 0, 1 or 2."""
    import contextlib
    import io
    import tempfile

    from plugrt.cli import main

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as f:
            f.write(payload[1:])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["check", path, "--json"])
    if status not in (0, 1, 2):
        return f"plugrt check exited {status}: {err.getvalue()[-500:]}"
    if status in (0, 1):
        json.loads(out.getvalue())
    return None
