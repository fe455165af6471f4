"""Bad models are refused at import with a PlugrtError naming what is wrong: names that are
not UTF-8, dims out of bounds, huge profile shapes, cycles and dangling inputs; unsorted
but acyclic graphs are sorted; ``plugrt check`` refuses what ``build`` would."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt import ModelError, PlugrtError, ShapeError
from plugrt.engine import Builder, BuilderConfig, OptimizationProfile
from plugrt.engine.builder import _check_memory
from plugrt.engine.memory import plan_memory
from plugrt.ir.dims import MAX_DIM
from plugrt.onnx import import_model

BIAS = np.array([0.5, -1.0, 2.0], np.float32)


def chain_model(order=(0, 1, 2), shape=(2, 3), batch=None):
    """x -> Relu -> Add(bias) -> Relu -> y, nodes listed in ``order``."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="first"),
             helper.make_node("Add", ["r", "bias"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="last")]
    dims = [batch, *shape[1:]] if batch else list(shape)
    graph = helper.make_graph([nodes[i] for i in order], "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
                              initializer=[numpy_helper.from_array(BIAS, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def with_raw_name(model, old: bytes, new: bytes) -> bytes:
    """The serialized model with every length-prefixed string ``old`` replaced by ``new``
    (same length: protobuf lengths stay valid)."""
    assert len(old) == len(new)
    data = model.SerializeToString()
    prefix = bytes([len(old)])
    assert prefix + old in data
    return data.replace(prefix + old, prefix + new)


# ---------------------------------------------------------------------------- names


@pytest.mark.parametrize("old, where", [(b"first", "the name of node 0"), (b"bias", "initializer"),
                                        (b"r", "node 'first': output 0"), (b"chain", "the graph's name")])
def test_names_that_are_not_utf8_are_refused(old, where):
    data = with_raw_name(chain_model(), old, b"\xff" + old[1:])
    with pytest.raises(ModelError, match="is not valid UTF-8") as info:
        import_model(data)
    assert where in str(info.value)


def test_graph_input_name_not_utf8_is_refused():
    data = with_raw_name(chain_model(), b"x", b"\xfe")
    with pytest.raises(ModelError, match=r"(graph input|node 'first': input 0) .* is not valid UTF-8"):
        import_model(data)


def test_control_characters_in_names_are_refused():
    model = chain_model()
    model.graph.node[1].name = "ad\x00d"
    with pytest.raises(ModelError, match=r"control character U\+0000"):
        import_model(model)


def test_attribute_string_not_utf8_is_refused():
    model = chain_model()
    model.graph.node[0].op_type = "Pad"
    del model.graph.node[0].input[:]
    model.graph.node[0].input.extend(["x", "pads"])
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(4, np.int64), "pads"))
    model.graph.node[0].attribute.append(helper.make_attribute("mode", b"\xffconstant"))
    with pytest.raises(ModelError, match=r"node 'first'.*'mode'.*not valid UTF-8"):
        import_model(model)


# ---------------------------------------------------------------------------- dims


@pytest.mark.parametrize("dim, words", [(-3, "negative"), (1 << 62, r"over plugrt's limit of 2\^31-1"),
                                        (1 << 31, r"over plugrt's limit of 2\^31-1")])
def test_dims_out_of_bounds_are_refused(dim, words):
    with pytest.raises(ModelError, match=f"graph input 'x' has shape .*{words}"):
        import_model(chain_model(shape=(dim, 3)))


def test_too_many_elements_are_refused():
    with pytest.raises(ModelError, match=r"elements, over plugrt's limit of 2\^40"):
        import_model(chain_model(shape=(MAX_DIM, MAX_DIM)))


def test_inferred_huge_shape_is_refused():
    shape = numpy_helper.from_array(np.array([1 << 40, 1 << 30], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill")]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[shape])
    with pytest.raises(ShapeError, match=r"node 'fill'.*output 'y' would have shape"):
        import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("shape, words", [((100_000_000_000, 3), "over plugrt's limit of 2\\^31-1"),
                                          ((-1, 3), "negative"), ((1 << 30, 1 << 30), "2\\^40")])
def test_huge_profile_shapes_are_refused(shape, words):
    with pytest.raises(ShapeError, match=f"profile max shape .* for input 'x': .*{words}"):
        OptimizationProfile().set_shape("x", (1, 3), (1, 3), shape)


def test_arena_over_the_limit_is_refused():
    profile = OptimizationProfile().set_shape("x", (1, 3), (1, 3), (2, 3))
    over = r"needs 1099511628032 bytes .* more than (plugrt's limit of 2\^40|the device's \d+ bytes)"
    with pytest.raises(ShapeError, match=over):
        _check_memory((1 << 40) + 256, profile)
    plan = plan_memory({"a": (1 << 40) * 5, "b": 1 << 41}, {"a": (0, 1), "b": (1, 2)})
    assert plan.arena_bytes == (1 << 40) * 5 + (1 << 41)  # Python ints: no wraparound


def test_profile_messages_name_only_the_shapes_given():
    profile = OptimizationProfile().set_shape("x", (4, 5), (4, 5), (4, 5), given=("opt",))
    config = BuilderConfig()
    config.add_optimization_profile(profile)
    with pytest.raises(PlugrtError) as info:
        Builder().check_model(chain_model(batch="N"), config)
    assert "profile opt shape [4, 5] for input 'x' does not fit" in str(info.value)
    assert "min" not in str(info.value)


# ---------------------------------------------------------------------------- order


def test_unsorted_acyclic_graph_is_sorted_and_matches_onnxruntime():
    import onnxruntime

    model = chain_model(order=(2, 0, 1))
    graph = import_model(model)
    assert [node.name for node in graph.nodes] == ["first", "add", "last"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = Builder().build_engine(model, BuilderConfig(optimization_level=0)).create_execution_context().execute(
        {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_file_order_is_kept_where_valid():
    model = chain_model()
    extra = helper.make_node("Relu", ["x"], ["z"], name="side")
    model.graph.node.insert(1, extra)
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3]))
    assert [n.name for n in import_model(model).nodes] == ["first", "side", "add", "last"]


def test_cycle_is_named():
    model = chain_model()
    model.graph.node[0].input[0] = "y"  # first reads last's output
    with pytest.raises(ModelError, match="cycle through node 'first' -> node 'add' -> node 'last' -> node 'first'"):
        import_model(model)


def test_dangling_input_is_named():
    model = chain_model()
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(ModelError, match="node 'add' reads value 'nowhere', which no node, input or initializer "
                                         "produces"):
        import_model(model)


def test_raw_garbage_and_wrong_types_are_model_errors():
    for source in (b"\x0a\xff\xff\xff\xff\x0f", bytearray(b"\x08"), 12, None):
        with pytest.raises(ModelError):
            import_model(source)


# ---------------------------------------------------------------------------- CLI


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "plugrt", *args], capture_output=True, text=True)


def test_cli_huge_opt_shapes_refused_naming_opt(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain_model(batch="N"), str(path))
    result = _cli("build", str(path), "-o", str(tmp_path / "m.plan"), "--opt-shapes", "x:100000000000x3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "profile opt shape [100000000000, 3] for input 'x'" in result.stderr and "2^31-1" in result.stderr
    wrong = _cli("check", str(path), "--opt-shapes", "x:2x4")
    assert wrong.returncode == 1 and "profile opt shape [2, 4]" in wrong.stdout and "min" not in wrong.stdout


def test_check_refuses_what_build_refuses(tmp_path):
    ok = tmp_path / "ok.onnx"
    onnx.save(chain_model(batch="N"), str(ok))
    assert _cli("check", str(ok)).returncode == 0
    # Supported node by node, but the Reshape's output shape depends on data: build refuses.
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                           helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    bad = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(bad))
    result = _cli("check", str(bad), "--json")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["unsupported"] == 0 and "node 'reshape'" in report["build"] and "depends on input data" in report["build"]
    cycle = chain_model()
    cycle.graph.node[0].input[0] = "y"
    onnx.save(cycle, str(bad))
    result = _cli("check", str(bad))
    assert result.returncode == 2 and "cycle through" in result.stderr


def test_build_refuses_an_arena_over_the_limit():
    # 3 * 2^38 elements is within the per-tensor limit, but 3 TiB of float32 is over the arena's.
    model = chain_model(shape=(1 << 28, 1 << 10, 3))
    with pytest.raises(ShapeError, match=r"activation memory at the profile's max shapes \(x: \[268435456, 1024, 3\]\)"):
        Builder().build_engine(model, BuilderConfig(optimization_level=0))
    with pytest.raises(ShapeError, match="more than (plugrt's limit of 2\\^40 bytes|the device's \\d+ bytes of memory)"):
        Builder().check_model(model)
