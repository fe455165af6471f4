"""The KServe v2 / Open Inference Protocol's JSON tensors, as Triton and KServe speak them.

A request is ``{"inputs": [{"name", "shape", "datatype", "data"}], "outputs": [{"name"}]?}``
with ``data`` the tensor's elements in row-major order (flat, or nested as the shape);
a response ``{"model_name", "model_version", "outputs": [{"name", "shape", "datatype",
"data"}]}``; model metadata ``{"name", "versions", "platform", "inputs", "outputs"}`` with
``-1`` for a dimension the profile lets vary. Anything wrong in a request is a
:class:`RequestError` naming the input and what to send instead (a server answers 400).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from plugrt.errors import PlugrtError

#: v2 datatype names <-> NumPy dtypes.
DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
             "FP32": np.float32, "FP64": np.float64}
_NAMES = {np.dtype(dtype): name for name, dtype in DATATYPES.items()}


class RequestError(PlugrtError):
    """A request the protocol or the engine refuses: the client's to fix (HTTP 400)."""


def datatype(dtype) -> str:
    name = _NAMES.get(np.dtype(dtype))
    if name is None:
        raise PlugrtError(f"dtype {np.dtype(dtype)} has no KServe v2 datatype")
    return name


def decode_request(body, inputs: Mapping[str, tuple[np.dtype, int]]) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """``(feeds, requested output names or None)`` from a parsed JSON request; ``inputs``
    maps each engine input to its dtype and rank."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise RequestError('a request is a JSON object with "inputs": a list of {"name", "shape", "datatype", "data"}')
    feeds = {}
    for k, entry in enumerate(body["inputs"]):
        if not isinstance(entry, dict) or not {"name", "shape", "datatype", "data"} <= set(entry):
            raise RequestError(f'inputs[{k}] must have "name", "shape", "datatype" and "data"')
        name = entry["name"]
        if name not in inputs:
            raise RequestError(f"input {name!r}: the model has no such input; its inputs are "
                               f"{', '.join(map(repr, inputs))}")
        if name in feeds:
            raise RequestError(f"input {name!r} is given twice")
        dtype, rank = inputs[name]
        if entry["datatype"] != datatype(dtype):
            raise RequestError(f"input {name!r}: datatype {entry['datatype']!r}, the model takes {datatype(dtype)!r}")
        shape = entry["shape"]
        if not isinstance(shape, list) or len(shape) != rank or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise RequestError(f"input {name!r}: shape {shape!r} must be {rank} non-negative ints")
        try:
            array = np.asarray(entry["data"], dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise RequestError(f"input {name!r}: data are not {datatype(dtype)} numbers ({exc})") from None
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise RequestError(f"input {name!r}: {array.size} values for shape {shape}")
        feeds[name] = array.reshape(shape)
    missing = [name for name in inputs if name not in feeds]
    if missing:
        raise RequestError(f"input {missing[0]!r} is missing; the model takes {', '.join(map(repr, inputs))}")
    wanted = body.get("outputs")
    if wanted is None:
        return feeds, None
    if not isinstance(wanted, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted):
        raise RequestError('"outputs" must be a list of {"name": ...}')
    return feeds, [o["name"] for o in wanted]


def encode_response(model: str, outputs: Mapping[str, np.ndarray], wanted: list[str] | None = None,
                    request_id: str | None = None) -> dict:
    names = list(outputs) if wanted is None else wanted
    unknown = [name for name in names if name not in outputs]
    if unknown:
        raise RequestError(f"output {unknown[0]!r}: the model has no such output; its outputs are "
                           f"{', '.join(map(repr, outputs))}")
    body = {"model_name": model, "model_version": "1",
            "outputs": [{"name": name, "shape": list(np.shape(outputs[name])), "datatype": datatype(outputs[name].dtype),
                         "data": np.asarray(outputs[name]).reshape(-1).tolist()} for name in names]}
    if request_id is not None:
        body["id"] = request_id
    return body


def encode_request(feeds: Mapping[str, np.ndarray]) -> dict:
    """A request for ``feeds`` (what a client sends)."""
    return {"inputs": [{"name": name, "shape": list(np.shape(value)), "datatype": datatype(np.asarray(value).dtype),
                        "data": np.asarray(value).reshape(-1).tolist()} for name, value in feeds.items()]}


def decode_response(body: dict) -> dict[str, np.ndarray]:
    """The outputs of a response, as arrays."""
    return {entry["name"]: np.asarray(entry["data"], DATATYPES[entry["datatype"]]).reshape(entry["shape"])
            for entry in body["outputs"]}


def metadata(name: str, engine) -> dict:
    """Model metadata: each binding's datatype and shape (-1 where the profiles let it vary)."""
    def shape(dims) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in dims]

    graph = engine.graph
    return {"name": name, "versions": ["1"], "platform": "plugrt",
            "inputs": [{"name": n, "datatype": datatype(graph.info(n).dtype), "shape": _range_shape(engine, n)}
                       for n in graph.inputs],
            "outputs": [{"name": n, "datatype": datatype(graph.info(n).dtype), "shape": shape(graph.info(n).shape)}
                        for n in graph.outputs]}


def _range_shape(engine, name: str) -> list[int]:
    """An input's shape with -1 where its profiles' min and max differ."""
    low = [min(p.shapes[name][0][k] for p in engine.profiles) for k in range(len(engine.profiles[0].shapes[name][0]))]
    high = [max(p.shapes[name][2][k] for p in engine.profiles) for k in range(len(low))]
    return [a if a == c else -1 for a, c in zip(low, high)]


__all__ = ["DATATYPES", "RequestError", "datatype", "decode_request", "encode_response", "encode_request",
           "decode_response", "metadata"]
