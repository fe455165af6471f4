"""ONNX import: structure, attributes, external data, symbolic dims, and errors for bad input."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import skip_unless_ops
from plugrt import ModelError, UnsupportedError
from plugrt.onnx import import_model
from plugrt.reference import ReferenceExecutor


WEIGHT = np.arange(12, dtype=np.float32).reshape(4, 3, 1, 1) / 7.0


def small_model(with_weight=True, opset=17):
    w = numpy_helper.from_array(WEIGHT, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"], name="mm"),
             helper.make_node("LeakyRelu", ["t"], ["y"], name="act", alpha=0.2)]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 2, 2])],
        initializer=[w] if with_weight else [],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_import_infers_symbolic_shapes_and_runs(rng):
    graph = import_model(small_model())
    assert graph.values["t"].info.shape == ("batch", 4, 2, 2)
    assert graph.values["y"].info.dtype == np.float32
    x = rng.standard_normal((5, 3, 2, 2)).astype(np.float32)
    y = ReferenceExecutor(graph).run({"x": x})["y"]
    t = np.einsum("nchw,oc->nohw", x, WEIGHT[:, :, 0, 0])
    np.testing.assert_allclose(y, np.where(t >= 0, t, 0.2 * t), rtol=1e-5, atol=1e-6)


def test_three_unsupported_ops_in_one_error():
    nodes = [helper.make_node("FancyA", ["x"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="fine"),
             helper.make_node("FancyB", ["b"], ["c"], name="second", domain="com.vendor"),
             helper.make_node("FancyC", ["c"], ["y"], name="third")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.vendor", 3)])
    with pytest.raises(UnsupportedError) as info:
        import_model(model)
    message = str(info.value)
    for name, op, domain, opset in [("first", "FancyA", "ai.onnx", 17), ("second", "FancyB", "com.vendor", 3),
                                    ("third", "FancyC", "ai.onnx", 17)]:
        assert f"node {name!r}: op {op}, domain {domain!r}, opset {opset}" in message
    assert "fine" not in message and len(info.value.nodes) == 3


def test_constant_node_and_initializer_feed_shape_computation(rng):
    shape = helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([2, 6], np.int64)))
    reshape = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph([shape, reshape], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    skip_unless_ops(model)
    g = import_model(model)
    assert g.values["y"].info.shape == (2, 6)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(ReferenceExecutor(g).run({"x": x})["y"], x.reshape(2, 6))


def test_external_data_is_loaded(tmp_path, rng):
    model = small_model()
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    graph = import_model(str(path))
    np.testing.assert_array_equal(graph.values["w"].const, WEIGHT)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelError, match="external data"):
        import_model(str(path))


def test_not_a_protobuf(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"this is not an onnx model at all\xff\xfe" * 10)
    with pytest.raises(ModelError, match="junk.onnx"):
        import_model(str(path))


def test_truncated_file(tmp_path):
    data = small_model().SerializeToString()
    for cut in (len(data) // 3, len(data) // 2, len(data) - 3):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(ModelError, match=f"cut{cut}.onnx|truncated|not produced|missing"):
            import_model(str(path))


def test_missing_file():
    with pytest.raises(ModelError, match="does not exist"):
        import_model("/no/such/model.onnx")


def test_missing_initializer():
    with pytest.raises(ModelError, match=r"node 'mm' reads value 'w', which no node, input or initializer produces"):
        import_model(small_model(with_weight=False))


def test_wrong_attribute_type():
    model = small_model()
    act = model.graph.node[1]
    del act.attribute[:]
    act.attribute.append(helper.make_attribute("alpha", "high"))
    with pytest.raises(ModelError, match=r"node 'act'.*'alpha' must be of type float, got string"):
        import_model(model)


def test_unknown_attribute_names_plugin():
    model = small_model()
    model.graph.node[1].attribute.append(helper.make_attribute("beta", 1.0))
    with pytest.raises(UnsupportedError, match=r"'beta' is not known to plugin LeakyRelu"):
        import_model(model)


def test_domain_not_imported():
    model = small_model()
    model.graph.node[1].domain = "com.nowhere"
    with pytest.raises(ModelError, match="does not import"):
        import_model(model)


def test_bad_input_gets_exit_2_and_no_traceback(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x07garbage")
    proc = subprocess.run([sys.executable, "-m", "plugrt", "check", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "bad.onnx" in proc.stderr


def test_check_reports_unsupported_with_exit_1(tmp_path):
    model = small_model()
    model.graph.node[1].op_type = "Fancy"
    del model.graph.node[1].attribute[:]
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    proc = subprocess.run([sys.executable, "-m", "plugrt", "check", str(path), "--json"], capture_output=True, text=True)
    assert proc.returncode == 1
    import json

    report = json.loads(proc.stdout)
    assert [n["status"] for n in report["nodes"]] == ["supported", "unsupported"]
    ok = tmp_path / "ok.onnx"
    onnx.save(small_model(), str(ok))
    assert subprocess.run([sys.executable, "-m", "plugrt", "check", str(ok)], capture_output=True).returncode == 0


def test_wrong_input_count_names_node():
    model = small_model()
    model.graph.node[1].input.append("x")
    with pytest.raises(ModelError, match=r"node 'act'.*has 2 inputs; plugin LeakyRelu takes 1"):
        import_model(model)
