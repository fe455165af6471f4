"""A Triton Inference Server model repository for a plan (``plugrt export-triton``).

``REPO/NAME/config.pbtxt`` names the Python backend, the bindings (dims without the batch
axis when the model is batchable, -1 where the profile lets a dim vary), ``max_batch_size``
the profile's max batch, dynamic batching preferring its opt batch, and the instance
group; ``REPO/NAME/1/model.py`` is a ``TritonPythonModel`` that loads ``1/model.plan`` (a
copy of the plan) once per instance and runs each dynamic batch through
:class:`plugrt.serving.batching.Batcher`. Triton's Python backend runs ``model.py`` in
its stub process: ``model.py`` imports plugrt (and NumPy) from the site-packages of the
environment that exported it, recorded in it (``PLUGRT_SITE_PACKAGES`` overrides); the
stub must run the same Python version (``LD_LIBRARY_PATH`` to its ``libpython``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from plugrt.errors import PlugrtError
from plugrt.files import write_atomically
from plugrt.serving.batching import batch_symbol, max_batch, preferred_batch

TEMPLATES = Path(__file__).with_name("templates")
#: Triton's data types by NumPy dtype.
TRITON_TYPES = {np.dtype(t): name for t, name in (
    (np.bool_, "TYPE_BOOL"), (np.uint8, "TYPE_UINT8"), (np.uint16, "TYPE_UINT16"), (np.uint32, "TYPE_UINT32"),
    (np.uint64, "TYPE_UINT64"), (np.int8, "TYPE_INT8"), (np.int16, "TYPE_INT16"), (np.int32, "TYPE_INT32"),
    (np.int64, "TYPE_INT64"), (np.float16, "TYPE_FP16"), (np.float32, "TYPE_FP32"), (np.float64, "TYPE_FP64"))}
NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


def export(plan: str, repo: str, name: str | None = None, instances: int = 1, kind: str = "gpu",
           max_queue_delay_us: int = 100, profile: int = 0) -> Path:
    """Write the model repository entry for ``plan``; return the model's folder."""
    import re

    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    from plugrt.engine import Engine

    name = name or Path(plan).stem
    if not re.match(NAME_PATTERN, name):
        raise PlugrtError(f"--name {name!r}: a Triton model name is letters, digits, '_', '.' and '-'")
    if kind not in ("gpu", "cpu"):
        raise PlugrtError(f"--kind {kind!r}: gpu or cpu")
    if int(instances) < 1 or int(max_queue_delay_us) < 0:
        raise PlugrtError("--instances must be at least 1 and --max-queue-delay-us at least 0")
    engine = Engine.load(plan)
    batched = batch_symbol(engine, profile) is not None
    limit = max_batch(engine, profile) if batched else 0

    def tensor(n: str, ranges: bool) -> dict:
        info = engine.graph.info(n)
        if info.dtype not in TRITON_TYPES:
            raise PlugrtError(f"binding {n!r} has dtype {info.dtype}, which Triton has no type for")
        dims = _input_dims(engine, n, profile) if ranges else [d if isinstance(d, int) else -1 for d in info.shape]
        return {"name": n, "data_type": TRITON_TYPES[info.dtype], "dims": (dims[1:] if batched else dims) or [1]}

    import site

    settings = {"site_packages": repr([p for p in site.getsitepackages() if os.path.isdir(p)]), "name": name, "plan_name": Path(plan).name, "max_batch_size": limit, "instances": int(instances),
                "kind": kind, "max_queue_delay_us": int(max_queue_delay_us), "profile": int(profile),
                "preferred": [preferred_batch(engine, profile)],
                "inputs": [tensor(n, True) for n in engine.graph.inputs],
                "outputs": [tensor(n, False) for n in engine.graph.outputs]}
    templates = Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined, keep_trailing_newline=True)
    folder = Path(repo) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    write_atomically(str(folder / "config.pbtxt"), templates.get_template("config.pbtxt.j2").render(**settings).encode())
    write_atomically(str(folder / "1" / "model.py"), templates.get_template("model.py.j2").render(**settings).encode())
    copy = folder / "1" / "model.plan"
    if not (copy.exists() and os.path.samefile(copy, plan)):  # (a plan already in place stays)
        write_atomically(str(copy), Path(plan).read_bytes())
    return folder


def _input_dims(engine, name: str, profile: int) -> list[int]:
    low, _, high = engine.profiles[profile].shapes[name]
    return [a if a == c else -1 for a, c in zip(low, high)]


__all__ = ["export", "TRITON_TYPES"]
