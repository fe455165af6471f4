"""The reference executor: runs a graph on the CPU through the plugins' NumPy references.

It is the ground truth the engine is compared with, and serves constant folding,
calibration and layer-wise comparison (``keep_intermediates``).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from plugrt.bindings import check_inputs
from plugrt.errors import PlugrtError
from plugrt.ir.dims import format_shape
from plugrt.ir.graph import Graph


class ReferenceExecutor:
    """Runs ``graph`` node by node with each op plugin's ``reference``."""

    def __init__(self, graph: Graph, registry=None):
        if registry is None:
            from plugrt.registry import default_registry

            registry = default_registry()
        self.graph = graph
        self.registry = registry
        self._ops = [registry.op(node) for node in graph.nodes]
        self._last_use = _last_uses(graph)

    def run(self, feeds: Mapping[str, np.ndarray], keep_intermediates: bool = False,
            observe: Callable | None = None) -> dict[str, np.ndarray]:
        """Run the graph; return the graph outputs (and every value if asked).
        ``observe(node, outputs)`` sees each node's results as they are made."""
        graph = self.graph
        feeds = {name: np.asarray(array) for name, array in feeds.items()}
        check_inputs({name: graph.values[name].info for name in graph.inputs}, feeds)
        env: dict[str, np.ndarray] = dict(graph.initializers())
        env.update(feeds)
        keep = set(graph.outputs)
        for index, (node, op) in enumerate(zip(graph.nodes, self._ops)):
            args = [env[name] if name else None for name in node.inputs]
            try:
                results = op.reference(node, args)
            except PlugrtError:
                raise
            except Exception as exc:
                shapes = ", ".join("none" if a is None else f"{a.dtype}{format_shape(a.shape)}" for a in args)
                raise PlugrtError(
                    f"{node.describe()}: reference of plugin {type(op).__name__} failed: "
                    f"{type(exc).__name__}: {exc} (inputs: {shapes})"
                ) from exc
            if len(results) < len(node.outputs):
                raise PlugrtError(
                    f"{node.describe()}: reference returned {len(results)} outputs, the node has {len(node.outputs)}"
                )
            for name, result in zip(node.outputs, results):
                if name:
                    env[name] = np.asarray(result)
            if observe is not None:
                observe(node, [env[name] for name in node.outputs if name])
            if not keep_intermediates:
                for name in node.inputs:
                    if name and self._last_use.get(name) == index and name not in keep and name in env:
                        if name not in feeds and graph.values[name].const is None:
                            del env[name]
        if keep_intermediates:
            return env
        return {name: env[name] for name in graph.outputs}


def _last_uses(graph: Graph) -> dict[str, int]:
    last: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        for name in node.inputs:
            if name:
                last[name] = index
    return last
