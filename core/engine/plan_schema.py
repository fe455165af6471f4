"""The plan header's schema: what every field must be before anything is built from it.

A plan's checksum proves the bytes are the ones written, not that a plugrt wrote them, so
nothing in the header is trusted: :func:`check_array_table` (the raw arrays' table, read by
:mod:`plugrt.engine.plan_file`) and :func:`check_header` (the engine header) check types,
ranges and cross-references, one small checker per section. Each problem is a
:class:`PlanError` naming the file, the field's JSON path (``layers[3].node_index``), what
was expected and the fix. What needs the plugins (attributes, shapes, the memory plan)
is checked after this, by :mod:`plugrt.engine.plan_checks`.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import numpy as np

from plugrt import __version__
from plugrt.engine.aliases import ALIAS_TACTIC
from plugrt.errors import PlanError

#: Array data offsets are multiples of this (the container's alignment).
ARRAY_ALIGNMENT = 64
#: No plan field counts more bytes than this (1 TiB): a sanity bound before the derived ones.
MAX_BYTES = 1 << 40
#: Array dtypes a plan may store: booleans, integers, floats; little-endian or byte-wide.
_DTYPE_KINDS = "biuf"
_ARRAY_KEY = "__array__"
#: Deepest JSON nesting a header may have.
MAX_DEPTH = 32


def fix() -> str:
    return f"rebuild the plan with plugrt {__version__}"


class Fields:
    """Type and range checks that name the plan file and the field's JSON path."""

    def __init__(self, label: str):
        self.label = label

    def fail(self, path: str, expected: str, got: Any = None, show: bool = True) -> PlanError:
        seen = f", got {_short(got)}" if show else ""
        return PlanError(f"plan {self.label}: {path} must be {expected}{seen}; {fix()}")

    def record(self, value, path: str, required: tuple, optional: tuple = ()) -> dict:
        """A JSON object holding every ``required`` key, and no key but those and ``optional``."""
        if not isinstance(value, dict):
            raise self.fail(path, "an object", value)
        for key in required:
            if key not in value:
                raise self.fail(f"{path}.{key}" if path else key, "present (the field is missing)", show=False)
        for key in value:
            if key not in required and key not in optional:
                raise self.fail(f"{path}.{key}" if path else str(key), "absent: this plugrt knows no such field "
                                "(a plan from a newer plugrt, or a damaged one)", show=False)
        return value

    def mapping(self, value, path: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, "an object", value)
        return value

    def sequence(self, value, path: str, length: int | None = None) -> list:
        if not isinstance(value, list):
            raise self.fail(path, "a list", value)
        if length is not None and len(value) != length:
            raise self.fail(path, f"a list of {length} entries", value)
        return value

    def text(self, value, path: str, empty: bool = True) -> str:
        if not isinstance(value, str) or (not empty and not value):
            raise self.fail(path, "a string" if empty else "a non-empty string", value)
        return value

    def optional_text(self, value, path: str) -> str | None:
        return None if value is None else self.text(value, path)

    def integer(self, value, path: str, low: int = 0, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, "an integer", value)
        if value < low or (high is not None and value > high):
            span = f">= {low}" if high is None else f"in {low}..{high}"
            raise self.fail(path, f"an integer {span}", value)
        return value

    def number(self, value, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise self.fail(path, "a finite number >= 0", value)
        return value

    def shape(self, value, path: str, symbolic: bool = False) -> list:
        """Non-negative int dims (and dim names when ``symbolic``), each below 2^40."""
        self.sequence(value, path)
        for axis, dim in enumerate(value):
            if symbolic and isinstance(dim, str) and dim:
                continue
            self.integer(dim, f"{path}[{axis}]", 0, MAX_BYTES)
        return value

    def dtype(self, value, path: str) -> np.dtype:
        """A numeric or boolean NumPy dtype string as plans write it (``"<f4"``, ``"|b1"``)."""
        self.text(value, path)
        try:
            dtype = np.dtype(value)
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or dtype.kind not in _DTYPE_KINDS or dtype.str != value or dtype.byteorder == ">":
            raise self.fail(path, "a little-endian bool, int or float NumPy dtype string such as '<f4'", value)
        return dtype


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_depth(header, label: str, limit: int = MAX_DEPTH) -> None:
    """No JSON nesting deeper than ``limit`` (a plan's is under 10), so that the checkers'
    recursion stays shallow whatever the file holds."""
    stack = [(header, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise PlanError(f"plan {label}: its header nests deeper than {limit} levels; {fix()}")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


# ---------------------------------------------------------------------- the array table


def check_array_table(table, label: str, blob_bytes: int) -> list[dict]:
    """Every array entry: a unique name, a dtype, a shape matching ``nbytes``, an aligned
    offset inside the data region (``blob_bytes`` long), no two arrays sharing bytes."""
    fields = Fields(label)
    fields.sequence(table, "arrays")
    names, spans = set(), []
    for i, entry in enumerate(table):
        path = f"arrays[{i}]"
        fields.record(entry, path, ("name", "dtype", "shape", "offset", "nbytes"))
        name = fields.text(entry["name"], f"{path}.name", empty=False)
        if name in names:
            raise fields.fail(f"{path}.name", "unique (another array has this name)", name)
        names.add(name)
        dtype = fields.dtype(entry["dtype"], f"{path}.dtype")
        shape = fields.shape(entry["shape"], f"{path}.shape")
        nbytes = fields.integer(entry["nbytes"], f"{path}.nbytes", 0, blob_bytes)
        expected = math.prod(shape) * dtype.itemsize
        if nbytes != expected:
            raise fields.fail(f"{path}.nbytes", f"{expected} (shape {shape} of {dtype})", nbytes)
        offset = fields.integer(entry["offset"], f"{path}.offset", 0, blob_bytes)
        if offset % ARRAY_ALIGNMENT:
            raise fields.fail(f"{path}.offset", f"a multiple of {ARRAY_ALIGNMENT}", offset)
        if offset + nbytes > blob_bytes:
            raise fields.fail(f"{path}.offset", f"such that the array ends inside the data region "
                              f"({blob_bytes} bytes), not at {offset + nbytes}", offset)
        spans.append((offset, offset + nbytes, path))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise fields.fail(f"{second}.offset", f"past the end of {first} ({end}): arrays may not share bytes",
                              begin)
    return table


# ---------------------------------------------------------------------- the engine header

_TOP = ("format", "plugrt_version", "device", "graph", "profiles", "layers", "memory", "shapes", "passes")
#: Sections a plan may leave out (older plugrt wrote none).
_TOP_OPTIONAL = ("kernels", "precision", "specialized")
_PRECISION = ("fp16", "strongly_typed", "constraints", "layer_precisions", "decisions", "fallbacks", "casts", "accuracy")
_NODE = ("name", "op_type", "domain", "inputs", "outputs", "attrs", "opset", "origin")
_BODY = _NODE + ("plugin", "distribution", "version", "op_version")
_LAYER = ("node_index", "tactic", "workspace_bytes", "plugin", "distribution", "distribution_version", "op_version")
_LAYER_OPTIONAL = ("time_ms", "runner_up", "tactic_provider", "alias", "profile_tactics", "generic_tactics",
                   "specialized_tactics")


def check_header(header, arrays: dict, label: str) -> None:
    """The whole engine header, section by section (the array table is checked on decode)."""
    fields = Fields(label)
    fields.record(header, "", _TOP, _TOP_OPTIONAL)
    fields.text(header["format"], "format")
    fields.text(header["plugrt_version"], "plugrt_version")
    _check_device(fields, header["device"])
    used: set = set()
    nodes = _check_graph(fields, header["graph"], arrays, used)
    if "kernels" in header:
        _check_kernels(fields, header["kernels"], arrays, used)
    unused = sorted(set(arrays) - used)
    if unused:
        raise fields.fail("arrays", f"used by the graph or the kernels, but array {unused[0]!r} is not", show=False)
    _check_profiles(fields, header["profiles"])
    _check_layers(fields, header["layers"], nodes)
    _check_memory(fields, header["memory"])
    for which in fields.record(header["shapes"], "shapes", ("opt", "max")):
        for name, shape in fields.mapping(header["shapes"][which], f"shapes.{which}").items():
            fields.shape(shape, f"shapes.{which}[{name!r}]")
    for i, entry in enumerate(fields.sequence(header["passes"], "passes")):
        fields.record(entry, f"passes[{i}]", ("name", "nodes_before", "nodes_after", "rewrites"))
        fields.text(entry["name"], f"passes[{i}].name")
        for key in ("nodes_before", "nodes_after", "rewrites"):
            fields.integer(entry[key], f"passes[{i}].{key}")
    if "precision" in header:
        _check_precision(fields, header["precision"])


def _check_precision(fields: Fields, precision) -> None:
    """What the precision step chose (:mod:`plugrt.engine.precision`): informational,
    but well formed."""
    fields.record(precision, "precision", _PRECISION, ("fp16_io", "int8"))
    if "int8" in precision:
        fields.record(precision["int8"], "precision.int8", ("algorithm", "tensors", "layers", "budget"))
        fields.text(precision["int8"]["algorithm"], "precision.int8.algorithm")
        fields.integer(precision["int8"]["tensors"], "precision.int8.tensors")
        fields.integer(precision["int8"]["layers"], "precision.int8.layers")
        if precision["int8"]["budget"] is not None:
            fields.number(precision["int8"]["budget"], "precision.int8.budget")
    for key in ("fp16", "fp16_io", "strongly_typed"):
        if key in precision and not isinstance(precision[key], bool):
            raise fields.fail(f"precision.{key}", "true or false", precision[key])
    fields.text(precision["constraints"], "precision.constraints")
    for key in ("layer_precisions", "decisions"):
        for name, value in fields.mapping(precision[key], f"precision.{key}").items():
            fields.text(value, f"precision.{key}[{name!r}]")
    for i, entry in enumerate(fields.sequence(precision["fallbacks"], "precision.fallbacks")):
        fields.record(entry, f"precision.fallbacks[{i}]", ("layer", "reason"))
        fields.text(entry["layer"], f"precision.fallbacks[{i}].layer")
        fields.text(entry["reason"], f"precision.fallbacks[{i}].reason")
    fields.integer(precision["casts"], "precision.casts")
    accuracy = precision["accuracy"]
    if accuracy is not None:
        fields.record(accuracy, "precision.accuracy", ("outputs", "max"))
        for name, error in fields.mapping(accuracy["outputs"], "precision.accuracy.outputs").items():
            if error != "inf":
                fields.number(error, f"precision.accuracy.outputs[{name!r}]")
        if accuracy["max"] != "inf":
            fields.number(accuracy["max"], "precision.accuracy.max")


def _check_device(fields: Fields, device) -> None:
    fields.record(device, "device", ("name", "compute_capability", "simulator"))
    fields.text(device["name"], "device.name")
    if not isinstance(device["simulator"], bool):
        raise fields.fail("device.simulator", "true or false", device["simulator"])
    capability = device["compute_capability"]
    if capability is not None:
        for i, part in enumerate(fields.sequence(capability, "device.compute_capability", 2)):
            fields.integer(part, f"device.compute_capability[{i}]")


def _check_graph(fields: Fields, graph, arrays: dict, used: set) -> int:
    """The network: values, nodes and attributes; each array it names used once (noted in
    ``used``)."""
    fields.record(graph, "graph", ("name", "opsets", "inputs", "outputs", "initializers", "nodes"))
    fields.text(graph["name"], "graph.name")
    for domain, version in fields.mapping(graph["opsets"], "graph.opsets").items():
        fields.integer(version, f"graph.opsets[{domain!r}]", 1)
    for i, name in enumerate(fields.sequence(graph["initializers"], "graph.initializers")):
        fields.text(name, f"graph.initializers[{i}]", empty=False)
        if f"init/{name}" not in arrays or f"init/{name}" in used:
            raise fields.fail(f"graph.initializers[{i}]", "a name with one array 'init/NAME' in the array table",
                              name)
        used.add(f"init/{name}")
    for i, entry in enumerate(fields.sequence(graph["inputs"], "graph.inputs")):
        fields.record(entry, f"graph.inputs[{i}]", ("name", "dtype", "shape"))
        fields.text(entry["name"], f"graph.inputs[{i}].name", empty=False)
        fields.dtype(entry["dtype"], f"graph.inputs[{i}].dtype")
        fields.shape(entry["shape"], f"graph.inputs[{i}].shape", symbolic=True)
    for i, name in enumerate(fields.sequence(graph["outputs"], "graph.outputs")):
        fields.text(name, f"graph.outputs[{i}]", empty=False)
    nodes = fields.sequence(graph["nodes"], "graph.nodes")
    for i, node in enumerate(nodes):
        _check_node(fields, node, f"graph.nodes[{i}]", _NODE, arrays, used)
        if node["domain"] == "plugrt.fused":
            body = node["attrs"].get("body")
            for k, entry in enumerate(fields.sequence(body, f"graph.nodes[{i}].attrs.body")):
                path = f"graph.nodes[{i}].attrs.body[{k}]"
                _check_node(fields, entry, path, _BODY, arrays, used)
                for key in ("plugin", "op_version"):
                    fields.text(entry[key], f"{path}.{key}")
                for key in ("distribution", "version"):
                    fields.optional_text(entry[key], f"{path}.{key}")
    return len(nodes)


_ARCH = re.compile(r"sm_[0-9]{2,3}[a-z]?")
_FULL_KEY = re.compile(r"[0-9a-f]{64}")
_KERNEL_ARRAY = re.compile(r"kernel/[0-9a-f]{64}")


def kernel_record_check(key: str, entry: str, cubin: str, ptx: str) -> str:
    """What binds a kernels record to its key, so that a record copied under another key
    (a damaged header whose checksum was recomputed) is refused. Not a signature: anyone
    can recompute it, so a plan must still come from a trusted builder."""
    return hashlib.sha256(f"{key}\0{entry}\0{cubin}\0{ptx}".encode("utf-8")).hexdigest()[:16]


def _check_kernels(fields: Fields, kernels, arrays: dict, used: set) -> None:
    """Compiled kernels (:mod:`plugrt.engine.plan_kernels`): full key -> entry point, the
    cubin and PTX arrays (uint8, one dimension, named ``kernel/`` + the sha256 of their
    bytes; shared by identical kernels) and the record's check; an architecture whenever
    there are functions."""
    fields.record(kernels, "kernels", ("arch", "functions"))
    functions = fields.mapping(kernels["functions"], "kernels.functions")
    arch = kernels["arch"]
    if (arch is not None or functions) and not (isinstance(arch, str) and _ARCH.fullmatch(arch)):
        raise fields.fail("kernels.arch", "the GPU architecture the kernels were compiled for, such as 'sm_90a'"
                          + ("" if functions else ", or null"), arch)
    for key, entry in functions.items():
        path = f"kernels.functions[{_short(key)}]"
        if not _FULL_KEY.fullmatch(key):
            raise fields.fail(path, "named by a kernel's full key (64 hexadecimal digits)", key)
        fields.record(entry, path, ("entry", "cubin", "ptx", "check"))
        fields.text(entry["entry"], f"{path}.entry", empty=False)
        for part in ("cubin", "ptx"):
            name = entry[part]
            if not isinstance(name, str) or not _KERNEL_ARRAY.fullmatch(name) or name not in arrays:
                raise fields.fail(f"{path}.{part}", "the name of a 'kernel/SHA256' array in the table", name)
            array = arrays[name]
            if array.dtype != np.uint8 or array.ndim != 1 or (part == "cubin" and not array.size):
                raise fields.fail(f"{path}.{part}", "a non-empty one-dimensional uint8 array" if part == "cubin"
                                  else "a one-dimensional uint8 array", f"{array.dtype}{list(array.shape)}")
            if name not in used and hashlib.sha256(array.tobytes()).hexdigest() != name[len("kernel/"):]:
                raise fields.fail(f"{path}.{part}", "an array whose bytes' sha256 is its name", name)
            used.add(name)
        if entry["check"] != kernel_record_check(key, entry["entry"], entry["cubin"], entry["ptx"]):
            raise fields.fail(f"{path}.check", "the check of this key, entry point, cubin and PTX (a record "
                              "copied or edited under another key)", entry["check"])


def _check_node(fields: Fields, node, path: str, keys: tuple, arrays: dict, used: set) -> None:
    fields.record(node, path, keys)
    for key in ("name", "op_type"):
        fields.text(node[key], f"{path}.{key}", empty=False)
    fields.text(node["domain"], f"{path}.domain")
    fields.integer(node["opset"], f"{path}.opset", 1)
    for key in ("inputs", "outputs", "origin"):
        for k, name in enumerate(fields.sequence(node[key], f"{path}.{key}")):
            fields.text(name, f"{path}.{key}[{k}]")
    for key, value in fields.mapping(node["attrs"], f"{path}.attrs").items():
        if not (node["domain"] == "plugrt.fused" and key == "body"):
            _check_attr_arrays(fields, value, f"{path}.attrs.{key}", arrays, used)


def _check_attr_arrays(fields: Fields, value, path: str, arrays: dict, used: set) -> None:
    """Attribute values are JSON; a tensor is ``{"__array__": key}`` naming an unused array."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_attr_arrays(fields, item, f"{path}[{i}]", arrays, used)
    elif isinstance(value, dict):
        fields.record(value, path, (_ARRAY_KEY,))
        key = value[_ARRAY_KEY]
        if not isinstance(key, str) or key not in arrays or key in used:
            raise fields.fail(f"{path}.{_ARRAY_KEY}", "the name of an array in the table, used once", key)
        used.add(key)


def _check_profiles(fields: Fields, profiles) -> None:
    for index, profile in enumerate(fields.sequence(profiles, "profiles") or [None]):  # (None: refused as no mapping)
        for name, entry in fields.mapping(profile, f"profiles[{index}]").items():
            _check_range(fields, entry, f"profiles[{index}][{name!r}]")


def _check_range(fields: Fields, entry, path: str) -> None:
    fields.record(entry, path, ("min", "opt", "max"), ("values", "values_min", "values_max"))
    triple = [fields.shape(entry[key], f"{path}.{key}") for key in ("min", "opt", "max")]
    if not len(triple[0]) == len(triple[1]) == len(triple[2]):
        raise fields.fail(path, "min, opt and max shapes of one rank", triple)
    for axis, (low, mid, high) in enumerate(zip(*triple)):
        if not low <= mid <= high:
            raise fields.fail(f"{path}.opt[{axis}]", f"between min {low} and max {high}", mid)
    keys = [k for k in ("values_min", "values", "values_max") if k in entry]  # a shape-tensor input's values
    lists = [fields.sequence(entry[k], f"{path}.{k}") for k in keys]
    if keys and ("values" not in keys or len({len(v) for v in lists}) > 1):
        raise fields.fail(path, "values (with values_min and values_max of its length)", keys)
    for i, column in enumerate(zip(*lists)):
        if not all(isinstance(v, (int, float)) for v in column) or list(column) != sorted(column):
            raise fields.fail(f"{path}.values[{i}]", "numbers within values_min..values_max", list(column))


def _check_layers(fields: Fields, layers, node_count: int) -> None:
    previous = -1
    for i, layer in enumerate(fields.sequence(layers, "layers")):
        path = f"layers[{i}]"
        fields.record(layer, path, _LAYER, _LAYER_OPTIONAL)
        index = fields.integer(layer["node_index"], f"{path}.node_index", 0, node_count - 1)
        if index <= previous:
            raise fields.fail(f"{path}.node_index", f"greater than the previous layer's ({previous})", index)
        previous = index
        fields.integer(layer["workspace_bytes"], f"{path}.workspace_bytes", 0, MAX_BYTES)
        for key in ("plugin", "op_version"):
            fields.text(layer[key], f"{path}.{key}", empty=False)
        for key in ("distribution", "distribution_version"):
            fields.optional_text(layer[key], f"{path}.{key}")
        if layer.get("time_ms") is not None:
            fields.number(layer["time_ms"], f"{path}.time_ms")
        provider = _check_tactic(fields, layer["tactic"], f"{path}.tactic", ("provider",))
        if layer.get("runner_up") is not None:
            _check_tactic(fields, layer["runner_up"], f"{path}.runner_up", ("provider",), ("time_ms",))
            fields.number(layer["runner_up"]["time_ms"], f"{path}.runner_up.time_ms")
        source = layer.get("tactic_provider")
        if source is not None:
            fields.record(source, f"{path}.tactic_provider", ("plugin", "distribution", "version", "provider_version"))
            fields.text(source["plugin"], f"{path}.tactic_provider.plugin", empty=False)
            for key in ("distribution", "version", "provider_version"):
                fields.optional_text(source[key], f"{path}.tactic_provider.{key}")
        if provider != (source["plugin"] if source is not None else None):
            raise fields.fail(f"{path}.tactic.provider", "the plugin named by tactic_provider (both or neither)",
                              provider)
        if layer.get("alias") is not None:
            _check_alias(fields, layer, path)
        for key in _LAYER_OPTIONAL[4:]:  # (a generic tactic may be None: the tuned one)
            for k, tactic in enumerate(fields.sequence(layer.get(key) or [], f"{path}.{key}")):
                if tactic is not None and _check_tactic(fields, tactic, f"{path}.{key}[{k}]", ("provider",)) != provider:
                    raise fields.fail(f"{path}.{key}[{k}].provider", f"the tactic's ({provider})", tactic)


def _check_alias(fields: Fields, layer: dict, path: str) -> None:
    """An alias layer (``alias``: an input index) runs no tactic and needs no workspace."""
    fields.integer(layer["alias"], f"{path}.alias", 0, MAX_BYTES)
    if layer["tactic"] != ALIAS_TACTIC or layer.get("tactic_provider") is not None:
        raise fields.fail(f"{path}.tactic", f"{ALIAS_TACTIC} with no tactic_provider for an alias layer", layer["tactic"])
    if layer["workspace_bytes"] or layer.get("time_ms") is not None or layer.get("runner_up") is not None:
        raise fields.fail(path, "free of workspace_bytes, time_ms and runner_up for an alias layer", show=False)


def _check_tactic(fields: Fields, tactic, path: str, optional: tuple, required: tuple = ()):
    """A tactic identity ``{"name", "params", ["provider"]}``; returns the provider."""
    fields.record(tactic, path, ("name", "params") + required, optional)
    fields.text(tactic["name"], f"{path}.name", empty=False)
    fields.mapping(tactic["params"], f"{path}.params")
    if "provider" in tactic:
        return fields.text(tactic["provider"], f"{path}.provider", empty=False)
    return None


def _check_memory(fields: Fields, memory) -> None:
    fields.record(memory, "memory", ("offsets", "arena_bytes", "workspace_bytes"))
    arena = fields.integer(memory["arena_bytes"], "memory.arena_bytes", 0, MAX_BYTES)
    fields.integer(memory["workspace_bytes"], "memory.workspace_bytes", 0, MAX_BYTES)
    for name, offset in fields.mapping(memory["offsets"], "memory.offsets").items():
        fields.integer(offset, f"memory.offsets[{name!r}]", 0, arena)
