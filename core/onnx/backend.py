"""plugrt as an ONNX backend (``onnx.backend.base.Backend``).

``prepare(model, device="CPU")`` imports the model and runs it with the reference
executor. Device ``"CUDA"`` builds and runs a GPU engine once the engine is installed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep, namedtupledict

from plugrt.errors import PlugrtError
from plugrt.onnx.importer import import_model, load_model
from plugrt.reference import ReferenceExecutor

DEVICES = ("CPU",)


class PlugrtRep(BackendRep):
    """A prepared model: call :meth:`run` with inputs in graph order or by name."""

    def __init__(self, graph, runner):
        self.graph = graph
        self._runner = runner

    def run(self, inputs: Any, **kwargs) -> tuple:
        feeds = self._feeds(inputs)
        results = self._runner(feeds)
        names = list(self.graph.outputs)
        return namedtupledict("Outputs", names)(*[results[name] for name in names])

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        names = list(self.graph.inputs)
        if isinstance(inputs, Mapping):
            return dict(inputs)
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        inputs = list(inputs)
        if len(inputs) != len(names):
            raise PlugrtError(f"the model has {len(names)} inputs ({', '.join(names)}), {len(inputs)} were given")
        return dict(zip(names, inputs))


class PlugrtBackend(Backend):
    """The ONNX backend entry point."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return _device_kind(device) in DEVICES

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> PlugrtRep:
        kind = _device_kind(device)
        if kind not in DEVICES:
            raise PlugrtError(f"device {device!r} is not supported; use one of {', '.join(DEVICES)}")
        registry = kwargs.pop("registry", None)
        graph = import_model(load_model(model), registry=registry)
        executor = ReferenceExecutor(graph, registry)
        return PlugrtRep(graph, executor.run)

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs: Sequence[np.ndarray], device: str = "CPU", outputs_info=None, **kwargs):
        raise PlugrtError("run_node is not supported; wrap the node in a model and use run_model")


def _device_kind(device: str) -> str:
    return str(device).split(":")[0].upper()


prepare = PlugrtBackend.prepare
run_model = PlugrtBackend.run_model
supports_device = PlugrtBackend.supports_device
