"""A graph as JSON plus raw arrays: how plan files store the network they run.

Attributes are JSON values; tensor attributes and initializers become named raw arrays.
Nothing is pickled.
"""

from __future__ import annotations

import numpy as np

from plugrt.errors import PlanError, PlugrtError
from plugrt.ir.graph import Graph, Node
from plugrt.ir.tensor import TensorInfo

_ARRAY_KEY = "__array__"


def graph_to_json(graph: Graph) -> tuple[dict, dict[str, np.ndarray]]:
    """Return ``(header, arrays)`` describing ``graph``."""
    arrays: dict[str, np.ndarray] = {}
    for name, array in graph.initializers().items():
        arrays[f"init/{name}"] = array
    nodes = []
    for index, node in enumerate(graph.nodes):
        attrs = {key: _attr_to_json(value, f"attr/{index}/{key}", arrays, node) for key, value in node.attrs.items()}
        nodes.append({"name": node.name, "op_type": node.op_type, "domain": node.domain,
                      "inputs": list(node.inputs), "outputs": list(node.outputs), "attrs": attrs,
                      "opset": node.opset, "origin": list(node.origin)})
    inputs = [{"name": n, "dtype": graph.info(n).dtype.str, "shape": list(graph.info(n).shape)} for n in graph.inputs]
    header = {"name": graph.name, "opsets": graph.opsets, "inputs": inputs, "outputs": list(graph.outputs),
              "initializers": list(graph.initializers()), "nodes": nodes}
    return header, arrays


def graph_from_json(header: dict, arrays: dict[str, np.ndarray], label: str) -> Graph:
    """Rebuild the graph a plan stores (without inferring shapes); the header was checked
    first (:func:`plugrt.engine.plan_schema.check_header`)."""
    try:
        graph = Graph(header["name"], header["opsets"])
        for name in header["initializers"]:
            graph.add_const(name, arrays[f"init/{name}"])
        for entry in header["inputs"]:
            graph.add_input(entry["name"], TensorInfo(np.dtype(entry["dtype"]), tuple(entry["shape"])))
        for entry in header["nodes"]:
            attrs = {key: _attr_from_json(value, arrays) for key, value in entry["attrs"].items()}
            graph.add_node(Node(entry["name"], entry["op_type"], entry["domain"], tuple(entry["inputs"]),
                                tuple(entry["outputs"]), attrs, entry["opset"], tuple(entry["origin"])))
        for name in header["outputs"]:
            graph.add_output(name)
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"plan {label}: the network description is malformed ({type(exc).__name__}: {exc}); rebuild it") from None
    except PlugrtError as exc:  # a value defined twice
        raise PlanError(f"plan {label}: graph: {exc}; rebuild it") from None
    return graph


def _attr_to_json(value, key: str, arrays: dict, node: Node):
    if isinstance(value, np.ndarray):
        arrays[key] = value
        return {_ARRAY_KEY: key}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_attr_to_json(v, f"{key}/{i}", arrays, node) for i, v in enumerate(value)]
    if isinstance(value, dict):  # a fused layer's body entries
        return {str(k): _attr_to_json(v, f"{key}/{k}", arrays, node) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    raise PlanError(f"{node.describe()}: attribute value of type {type(value).__name__} cannot be stored in a plan")


def _attr_from_json(value, arrays: dict):
    if isinstance(value, dict) and _ARRAY_KEY in value:
        return arrays[value[_ARRAY_KEY]]
    if isinstance(value, list):
        return [_attr_from_json(v, arrays) for v in value]
    if isinstance(value, dict):
        return {k: _attr_from_json(v, arrays) for k, v in value.items()}
    return value
