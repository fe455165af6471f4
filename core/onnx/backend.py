"""plugrt as an ONNX backend (``onnx.backend.base.Backend``).

``prepare(model, device="CPU")`` imports the model and runs it with the reference
executor. Device ``"CUDA"`` builds a GPU engine (in Numba's CUDA simulator when there is
no GPU) and runs it; a model with dynamic inputs gets one engine per set of input shapes.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep, namedtupledict

from plugrt.errors import PlugrtError
from plugrt.onnx.importer import import_model, load_model
from plugrt.reference import ReferenceExecutor

DEVICES = ("CPU", "CUDA")


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
        if kind == "CUDA":  # other keyword arguments are BuilderConfig fields (tf32=False, ...)
            return PlugrtRep(graph, _EngineRunner(graph, registry, kwargs))
        executor = ReferenceExecutor(graph, registry)
        return PlugrtRep(graph, executor.run)

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs: Sequence[np.ndarray], device: str = "CPU", outputs_info=None, **kwargs):
        raise PlugrtError("run_node is not supported; wrap the node in a model and use run_model")


class _EngineRunner:
    """Builds (once per set of input shapes) and runs GPU engines for a backend rep.

    ONNX models often feed shape operands (Reshape's shape, Slice's starts) as graph
    inputs. When the engine cannot be built with them as device tensors, the small inputs
    become shape-tensor inputs, read on the host (as TensorRT does with shape tensors).
    """

    SHAPE_TENSOR_LIMIT = 64

    def __init__(self, graph, registry, options: dict | None = None):
        from plugrt.engine import Builder, BuilderConfig

        self.graph = graph
        self.builder = Builder(registry)
        self.options = dict(options or {})
        try:
            BuilderConfig(**self.options)
        except TypeError as error:
            raise PlugrtError(f"backend option: {error}; options are BuilderConfig fields") from None
        self.contexts: dict = {}
        self.shape_inputs: list[str] | None = None

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict:
        from plugrt.bindings import check_inputs
        from plugrt.errors import UnsupportedError

        feeds = {name: np.asarray(value) for name, value in feeds.items()}
        check_inputs({name: self.graph.info(name) for name in self.graph.inputs}, feeds)
        if self.shape_inputs is None:
            try:
                context = self._context(feeds, [])
                self.shape_inputs = []
            except UnsupportedError:
                candidates = [n for n in self.graph.inputs if feeds[n].size <= self.SHAPE_TENSOR_LIMIT]
                if not candidates:
                    raise
                context = self._context(feeds, candidates)
                self.shape_inputs = candidates
        else:
            context = self._context(feeds, self.shape_inputs)
        return context.execute(feeds)

    def _context(self, feeds, shape_inputs: list[str]):
        from plugrt.engine import BuilderConfig, OptimizationProfile

        key = tuple((name, feeds[name].shape) for name in self.graph.inputs)
        key += tuple((name, feeds[name].tobytes()) for name in shape_inputs)
        context = self.contexts.get(key)
        if context is None:
            config = BuilderConfig(**self.options)
            profile = OptimizationProfile()
            for name in self.graph.inputs:
                profile.set_shape(name, feeds[name].shape, feeds[name].shape, feeds[name].shape)
            for name in shape_inputs:
                profile.set_shape_values(name, feeds[name])
            config.add_optimization_profile(profile)
            context = self.builder.build_engine(self.graph, config).create_execution_context()
            self.contexts[key] = context
        return context


def _device_kind(device: str) -> str:
    return str(device).split(":")[0].upper()


prepare = PlugrtBackend.prepare
run_model = PlugrtBackend.run_model
supports_device = PlugrtBackend.supports_device
