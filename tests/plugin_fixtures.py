"""Helpers that install throwaway plugin distributions (a module plus a dist-info on sys.path)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

ECHO_PLUGIN = '''
import functools
import numpy as np
from plugrt import hookimpl
from plugrt.kernels import jit
from plugrt.plugin import OpPlugin, TensorInfo, Attr, POINTWISE

@functools.lru_cache(maxsize=None)
def _scale_shift(scale, shift):
    scale, shift = np.float32(scale), np.float32(shift)

    @jit(device=True)
    def fn(x):
        return x * scale + shift
    return fn

class ScaleShift(OpPlugin):
    """y = x * scale + shift, in the custom domain 'com.example'."""
    domain = "com.example"
    op_type = "ScaleShift"
    version = "{version}"
    attributes = (Attr("scale", "float", 1.0), Attr("shift", "float", 0.0))
    groups = frozenset({{POINTWISE}})

    def infer(self, node, inputs):
        return [TensorInfo(inputs[0].dtype, inputs[0].shape)]

    def reference(self, node, inputs):
        x = inputs[0]
        return [(x * node.attrs["scale"] + node.attrs["shift"]).astype(x.dtype)]

    def pointwise(self, node, inputs):
        return _scale_shift(node.attrs["scale"], node.attrs["shift"])

@hookimpl
def plugrt_ops():
    return [ScaleShift()]
'''


def install_distribution(root: Path, dist: str, module: str, source: str, version: str = "1.0",
                         entry_name: str | None = None) -> Path:
    """Write ``module.py`` and a ``dist-info`` with a ``plugrt.plugins`` entry point under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[plugrt.plugins]\n{entry_name or dist} = {module}\n")
    (info / "RECORD").write_text("")
    return root


class SysPath:
    """Context manager putting a folder first on sys.path and forgetting modules after."""

    def __init__(self, root: Path, modules=()):
        self.root = str(root)
        self.modules = list(modules)

    def __enter__(self):
        sys.path.insert(0, self.root)
        return self

    def __exit__(self, *exc):
        sys.path.remove(self.root)
        for name in self.modules:
            sys.modules.pop(name, None)


def env_with_path(root: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
