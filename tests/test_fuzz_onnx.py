"""Fuzz ONNX import: >= 2,000 seeded mutations of a few small valid models, half edited as
protobufs (ops, inputs, outputs, attributes, dims, dtypes, names, cycles, order) and half
as raw bytes. Each case must import, pass the builder's checks (and for a sample, build),
or be refused with a PlugrtError: no other exception, crash or hang
(:mod:`fuzz_harness`, target :func:`fuzz_onnx_targets.import_and_build`).
"""

from __future__ import annotations

import os
import random
import time

import numpy as np
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from fuzz_harness import run_cases

SEED = 14
PROTO_CASES = 2000
RAW_CASES = 2000
#: Every how many cases one is built in full (level 0: nothing timed, no kernel runs; a
#: build takes a few ms in the simulator, so every case that imports is built).
BUILD_EVERY = 1
#: Every how many cases one also runs through ``plugrt check`` (the CLI, in the worker).
CLI_EVERY = 4
#: A name that becomes non-UTF-8 bytes once serialized (same length: lengths stay valid).
MARK = "@@NOT-UTF8@@"
MARK_BYTES = b"\xff\xfeNOT-UTF8\xc3\x28"

OPS = ["Relu", "Add", "Mul", "Conv", "Reshape", "Transpose", "MatMul", "Sigmoid", "Concat", "Gather",
       "Shape", "ConstantOfShape", "Expand", "Slice", "Softmax", "MaxPool", "Cast", "Identity", "Fancy", ""]
ATTRIBUTES = ["perm", "axis", "axes", "pads", "strides", "kernel_shape", "group", "alpha", "mode", "to",
              "value", "dilations", "keepdims", "auto_pad", "bogus"]
DIMS = [-1, 0, 1, 2, 3, 7, (1 << 31) - 1, 1 << 31, 1 << 40, 1 << 62, "N", ""]


def _model(nodes, inputs, outputs, initializers, name):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def seed_models():
    value = helper.make_tensor_value_info
    f32 = TensorProto.FLOAT
    chain = _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                    helper.make_node("Add", ["r", "bias"], ["a"], name="add"),
                    helper.make_node("Relu", ["a"], ["y"], name="relu2")],
                   [value("x", f32, [2, 3])], [value("y", f32, [2, 3])],
                   [numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "bias")], "chain")
    weight = np.linspace(-1, 1, 3 * 2 * 3 * 3, dtype=np.float32).reshape(3, 2, 3, 3)
    conv = _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                                    kernel_shape=[3, 3]),
                   helper.make_node("Relu", ["c"], ["y"], name="relu")],
                  [value("x", f32, [1, 2, 4, 4])], [value("y", f32, [1, 3, 4, 4])],
                  [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.ones(3, np.float32), "b")],
                  "conv")
    dynamic = _model([helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
                      helper.make_node("Sigmoid", ["m"], ["y"], name="sigmoid")],
                     [value("x", f32, ["N", 3])], [value("y", f32, ["N", 4])],
                     [numpy_helper.from_array(np.eye(3, 4, dtype=np.float32), "w")], "dynamic")
    layout = _model([helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
                     helper.make_node("Transpose", ["r"], ["y"], name="transpose", perm=[1, 0])],
                    [value("x", f32, [2, 3, 4])], [value("y", f32, [4, 6])],
                    [numpy_helper.from_array(np.array([6, 4], np.int64), "shape")], "layout")
    return [chain, conv, dynamic, layout]


def _names(model) -> list[str]:
    graph = model.graph
    names = {vi.name for vi in list(graph.input) + list(graph.output)} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
    return sorted(names)


def _random_attribute(rng: random.Random):
    name = rng.choice(ATTRIBUTES)
    kind = rng.randrange(6)
    if kind == 0:
        return helper.make_attribute(name, rng.choice([-1, 0, 1, 2, 5, 1 << 40]))
    if kind == 1:
        return helper.make_attribute(name, rng.choice([0.0, -1.5, 1e30, float("nan")]))
    if kind == 2:
        return helper.make_attribute(name, [rng.choice([-2, 0, 1, 2, 3]) for _ in range(rng.randrange(1, 5))])
    if kind == 3:
        return helper.make_attribute(name, rng.choice(["SAME_UPPER", "constant", "", MARK]))
    if kind == 4:
        return helper.make_attribute(name, numpy_helper.from_array(np.array([rng.random()], np.float32)))
    attr = AttributeProto(name=name, type=AttributeProto.INTS)
    return attr


def _mutate(model, rng: random.Random) -> None:
    """One protobuf-level edit of ``model``, in place."""
    graph = model.graph
    names = _names(model) + ["", "nowhere", MARK]
    kind = rng.randrange(16)
    node = rng.choice(graph.node) if graph.node else None
    if kind == 0 and node is not None:
        node.op_type = rng.choice(OPS)
    elif kind == 1 and node is not None:
        if node.input and rng.random() < 0.7:
            node.input[rng.randrange(len(node.input))] = rng.choice(names)
        elif node.input and rng.random() < 0.5:
            del node.input[rng.randrange(len(node.input))]
        else:
            node.input.append(rng.choice(names))
    elif kind == 2 and node is not None:
        if node.output and rng.random() < 0.7:
            node.output[rng.randrange(len(node.output))] = rng.choice(names)
        else:
            node.output.append(rng.choice(names))
    elif kind == 3 and node is not None:
        if node.attribute and rng.random() < 0.4:
            del node.attribute[rng.randrange(len(node.attribute))]
        else:
            node.attribute.append(_random_attribute(rng))
    elif kind == 4:
        values = list(graph.input) + list(graph.output)
        vi = rng.choice(values)
        dims = vi.type.tensor_type.shape.dim
        if dims and rng.random() < 0.8:
            dim = dims[rng.randrange(len(dims))]
            choice = rng.choice(DIMS)
            if isinstance(choice, str):
                dim.dim_param = choice or MARK
            else:
                dim.dim_value = choice
        else:
            dims.add().dim_value = rng.choice([1, 2, 1 << 35])
    elif kind == 5:
        vi = rng.choice(list(graph.input) + list(graph.output))
        vi.type.tensor_type.elem_type = rng.randrange(0, 26)
    elif kind == 6 and node is not None:
        graph.node.remove(node)
    elif kind == 7 and node is not None:
        graph.node.insert(rng.randrange(len(graph.node) + 1), node)
    elif kind == 8 and len(names) > 4:
        a, b = rng.sample(_names(model), 2)
        _rename(model, {a: b, b: a})
    elif kind == 9:
        target = rng.choice(["node", "value", "initializer", "graph", "attribute"])
        if target == "node" and node is not None:
            node.name = MARK
        elif target == "value" and _names(model):
            _rename(model, {rng.choice(_names(model)): MARK})
        elif target == "initializer" and graph.initializer:
            _rename(model, {rng.choice(graph.initializer).name: MARK})
        elif target == "attribute" and node is not None and node.attribute:
            rng.choice(node.attribute).name = MARK
        else:
            graph.name = MARK
    elif kind == 10 and len(graph.node) > 1:
        first, last = graph.node[0], graph.node[len(graph.node) - 1]
        if first.input and last.output:
            first.input[0] = last.output[0]  # a cycle
    elif kind == 11:
        order = list(graph.node)
        rng.shuffle(order)
        del graph.node[:]
        graph.node.extend(order)
    elif kind == 12 and graph.initializer:
        init = rng.choice(graph.initializer)
        edit = rng.randrange(3)
        if edit == 0 and init.dims:
            init.dims[rng.randrange(len(init.dims))] = rng.choice([-1, 0, 1 << 40, 1 << 62, 5])
        elif edit == 1:
            init.data_type = rng.randrange(0, 26)
        else:
            init.raw_data = init.raw_data[: rng.randrange(len(init.raw_data) + 1)]
    elif kind == 13:
        model.opset_import[0].version = rng.choice([1, 6, 11, 13, 17, 21, 99, -1])
    elif kind == 14:
        if graph.output and rng.random() < 0.5:
            graph.output[0].name = rng.choice(names)
        else:
            graph.output.append(helper.make_tensor_value_info(rng.choice(names), TensorProto.FLOAT, None))
    elif graph.node:
        big = numpy_helper.from_array(np.array([rng.choice([1 << 20, 1 << 31, 1 << 40]), 1 << 21], np.int64),
                                      f"huge{rng.randrange(100)}")
        graph.initializer.append(big)
        src = rng.choice(_names(model))
        graph.node.append(helper.make_node(rng.choice(["Expand", "ConstantOfShape", "Reshape", "Tile"]),
                                           [src, big.name] if rng.random() < 0.7 else [big.name],
                                           [f"big_out{rng.randrange(100)}"]))
        graph.output.append(helper.make_tensor_value_info(graph.node[-1].output[0], TensorProto.FLOAT, None))


def _rename(model, mapping: dict[str, str]) -> None:
    graph = model.graph
    for node in graph.node:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                field[i] = mapping.get(name, name)
    for item in list(graph.input) + list(graph.output) + list(graph.initializer):
        item.name = mapping.get(item.name, item.name)


def _raw_mutation(data: bytes, rng: random.Random) -> bytes:
    """1-3 edits; most keep the length (a flipped or replaced byte), so parsing gets past them."""
    data = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        kind = rng.choice([0, 0, 0, 1, 1, 1, 2, 3, 4, 5])
        position = rng.randrange(len(data)) if data else 0
        if kind == 0 and data:
            data[position] ^= 1 << rng.randrange(8)
        elif kind == 1 and data:
            data[position] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        elif kind == 2:
            data = data[: position]
        elif kind == 3:
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif kind == 4:
            del data[position:position + rng.randrange(1, 17)]
        else:
            chunk = data[position:position + rng.randrange(1, 33)]
            where = rng.randrange(len(data) + 1)
            data[where:where] = chunk
    return bytes(data)


def fuzz_cases():
    """The seeds, then the protobuf mutations, then the raw mutations; each payload led by
    ``b"C"`` (check) or ``b"B"`` (build too), see :mod:`fuzz_onnx_targets`."""
    rng = random.Random(SEED)
    seeds = seed_models()
    cases = [b"B" + model.SerializeToString() for model in seeds]
    for index in range(PROTO_CASES):
        model = type(seeds[0])()
        model.CopyFrom(rng.choice(seeds))
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            _mutate(model, rng)
        data = model.SerializeToString().replace(MARK.encode(), MARK_BYTES)
        cases.append((b"B" if index % BUILD_EVERY == 0 else b"C") + data)
    for index in range(RAW_CASES):
        data = _raw_mutation(rng.choice(seeds).SerializeToString(), rng)
        cases.append((b"B" if index % BUILD_EVERY == 0 else b"C") + data)
    return cases


def test_fuzz_onnx_import(tmp_path):
    counts_file = tmp_path / "counts"
    os.environ["PLUGRT_FUZZ_COUNTS"] = str(counts_file)
    try:
        cases = fuzz_cases()
        started = time.monotonic()
        failures = run_cases("fuzz_onnx_targets:import_and_build", cases)
        seconds = time.monotonic() - started
    finally:
        del os.environ["PLUGRT_FUZZ_COUNTS"]
    started = time.monotonic()
    cli_failures = run_cases("fuzz_onnx_targets:cli_check", cases[::CLI_EVERY])
    cli_seconds = time.monotonic() - started
    outcomes = counts_file.read_text() if counts_file.exists() else ""
    refused, checked, built = outcomes.count("r"), outcomes.count("c"), outcomes.count("b")
    print(f"\nONNX fuzz: {len(cases)} cases ({len(seed_models())} seeds, {PROTO_CASES} protobuf and {RAW_CASES} raw "
          f"mutations) in {seconds:.0f} s: {refused} refused with a PlugrtError, {checked + built} imported and "
          f"checked, {built} of them built; {len(failures)} failures")
    print(f"plugrt check on every {CLI_EVERY}th case: {len(cases[::CLI_EVERY])} cases in {cli_seconds:.0f} s, "
          f"{len(cli_failures)} failures")
    assert not failures, "\n".join(str(f) for f in failures[:10])
    assert not cli_failures, "\n".join(str(f) for f in cli_failures[:10])
    assert built >= len(seed_models()) and refused > 0
