"""The KServe v2 / Open Inference Protocol's JSON tensors, as Triton and KServe speak them.

A request is ``{"inputs": [{"name", "shape", "datatype", "data"}], "outputs": [{"name"}]?}``
with ``data`` the tensor's elements in row-major order (flat, or nested as the shape);
a response ``{"model_name", "model_version", "outputs": [{"name", "shape", "datatype",
"data"}]}``; model metadata ``{"name", "versions", "platform", "inputs", "outputs"}`` with
``-1`` for a dimension the profile lets vary. Anything wrong in a request is a
:class:`RequestError` naming the input and what to send instead (a server answers 400).

Triton's binary tensor extension (what ``tritonclient`` sends by default) is understood:
the body is the JSON header (``Inference-Header-Content-Length`` bytes) followed by the
raw little-endian bytes of each input whose ``parameters`` give ``binary_data_size``, in
order; outputs asked for with ``"parameters": {"binary_data": true}`` (or all, with the
request's ``binary_data_output``) come back the same way (:func:`encode_response`).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from plugrt.errors import PlugrtError

#: The response header a ``plugrt serve`` replica names itself in (process, device, PCI bus
#: id: :func:`plugrt.serving.ray.served_by`); the load test counts responses by it.
SERVED_BY = "Plugrt-Served-By"
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


def parse(payload: bytes, header_length: str | None = None) -> tuple[dict, bytes]:
    """The JSON header of a request body and its binary part (empty without the extension)."""
    import json

    length = len(payload)
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            raise RequestError(f"Inference-Header-Content-Length {header_length!r} is not a byte count") from None
        if not 0 <= length <= len(payload):
            raise RequestError(f"Inference-Header-Content-Length {length} is outside the body's {len(payload)} bytes")
    try:
        return json.loads(payload[:length]), payload[length:]
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request is not JSON ({exc})") from None


def decode_request(body, inputs: Mapping[str, tuple[np.dtype, int]],
                   binary: bytes = b"") -> tuple[dict[str, np.ndarray], list[str] | None]:
    """``(feeds, requested output names or None)`` from a parsed JSON request (and the
    binary part after its header); ``inputs`` maps each engine input to its dtype and rank."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise RequestError('a request is a JSON object with "inputs": a list of {"name", "shape", "datatype", "data"}')
    feeds, offset = {}, 0
    for k, entry in enumerate(body["inputs"]):
        size = (entry.get("parameters") or {}).get("binary_data_size") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not {"name", "shape", "datatype"} <= set(entry) or (
                size is None and "data" not in entry):
            raise RequestError(f'inputs[{k}] must have "name", "shape", "datatype" and "data" (or a binary_data_size)')
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
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise RequestError(f"input {name!r}: binary_data_size {size!r} runs past the body's binary part")
            if size % np.dtype(dtype).itemsize:
                raise RequestError(f"input {name!r}: {size} bytes is no whole number of {datatype(dtype)} values")
            array = np.frombuffer(binary[offset:offset + size], np.dtype(dtype).newbyteorder("<")).astype(dtype)
            offset += size
        else:
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


def binary_outputs(body: dict) -> set[str] | bool:
    """The outputs a request asks in binary: ``True`` for all (``binary_data_output``)."""
    if (body.get("parameters") or {}).get("binary_data_output"):
        return True
    return {o["name"] for o in body.get("outputs") or () if (o.get("parameters") or {}).get("binary_data")}


def encode_response(model: str, outputs: Mapping[str, np.ndarray], wanted: list[str] | None = None,
                    request_id: str | None = None, binary: set[str] | bool = frozenset()) -> tuple[bytes, int | None]:
    """The response body and, when an output travels in binary, its JSON header's length
    (for the ``Inference-Header-Content-Length`` header; ``None`` otherwise)."""
    import json

    names = list(outputs) if wanted is None else wanted
    unknown = [name for name in names if name not in outputs]
    if unknown:
        raise RequestError(f"output {unknown[0]!r}: the model has no such output; its outputs are "
                           f"{', '.join(map(repr, outputs))}")
    entries, blobs = [], []
    for name in names:
        array = np.ascontiguousarray(outputs[name])
        entry = {"name": name, "shape": list(array.shape), "datatype": datatype(array.dtype)}
        if binary is True or name in binary:
            blobs.append(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
            entry["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    body = {"model_name": model, "model_version": "1", "outputs": entries}
    if request_id is not None:
        body["id"] = request_id
    header = json.dumps(body).encode("utf-8")
    return (header + b"".join(blobs), len(header)) if blobs else (header, None)


def encode_request(feeds: Mapping[str, np.ndarray], binary: bool = False) -> tuple[bytes, int | None]:
    """A request body for ``feeds`` (what a client sends) and, in binary, its header's
    length; a binary request asks for binary outputs too."""
    import json

    entries, blobs = [], []
    for name, value in feeds.items():
        array = np.ascontiguousarray(value)
        entry = {"name": name, "shape": list(array.shape), "datatype": datatype(array.dtype)}
        if binary:
            blobs.append(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
            entry["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    body = {"inputs": entries}
    if binary:
        body["parameters"] = {"binary_data_output": True}
    header = json.dumps(body).encode("utf-8")
    return (header + b"".join(blobs), len(header)) if binary else (header, None)


def decode_response(payload: bytes, header_length: str | None = None) -> dict[str, np.ndarray]:
    """The outputs of a response body, as arrays."""
    body, blob = parse(payload, header_length)
    found, offset = {}, 0
    for entry in body["outputs"]:
        dtype = np.dtype(DATATYPES[entry["datatype"]])
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            found[entry["name"]] = np.frombuffer(blob[offset:offset + size], dtype.newbyteorder("<")).astype(dtype) \
                .reshape(entry["shape"])
            offset += size
        else:
            found[entry["name"]] = np.asarray(entry["data"], dtype).reshape(entry["shape"])
    return found


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


__all__ = ["DATATYPES", "SERVED_BY", "RequestError", "datatype", "parse", "decode_request", "binary_outputs", "encode_response",
           "encode_request", "decode_response", "metadata"]
