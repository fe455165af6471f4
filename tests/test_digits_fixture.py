"""The real-data INT8 fixture (plugrt.testing.digits): the NumPy-trained digits CNN, its
ONNX export, and onnxruntime's own QDQ quantization of it as a sanity check of the fixture
(not of plugrt's INT8)."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from plugrt.testing import digits


@functools.lru_cache(maxsize=1)
def split():
    return digits.load_digits_split(seed=0)


def trained():
    """The seed-0 model (trained once per test process: train_digits_cnn caches it)."""
    return digits.train_digits_cnn(seed=0)


def test_split_is_stratified_float_images():
    x_train, y_train, x_calib, x_test, y_test = split()
    assert (len(x_train), len(x_calib), len(x_test)) == (1100, 200, 497)
    for images in (x_train, x_calib, x_test):
        assert images.dtype == np.float32 and images.shape[1:] == (1, 8, 8)
        assert images.min() >= 0.0 and images.max() <= 1.0
    counts_train = np.bincount(y_train, minlength=10) / len(y_train)
    counts_test = np.bincount(y_test, minlength=10) / len(y_test)
    np.testing.assert_allclose(counts_train, counts_test, atol=0.01)
    again = digits.load_digits_split(seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(split(), again))


def test_fp32_model_is_accurate_on_held_out_digits():
    _, _, _, x_test, y_test = split()
    model, fp32_accuracy = trained()
    assert fp32_accuracy >= 95.0
    assert digits.accuracy(digits.run_onnxruntime(model, x_test), y_test) == pytest.approx(fp32_accuracy)


def test_export_is_valid_and_onnxruntime_matches_the_numpy_forward():
    _, _, _, x_test, _ = split()
    model, _ = trained()
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    assert [n.op_type for n in model.graph.node] == [
        "Conv", "Relu", "Conv", "Relu", "MaxPool", "Conv", "Relu", "Flatten", "Gemm"]
    assert all(node.name for node in model.graph.node)
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert (model.graph.input[0].name, batch.dim_param) == ("input", "batch")
    assert model.graph.output[0].name == "logits"
    params = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    expected = digits.numpy_forward(params, x_test)
    np.testing.assert_allclose(digits.run_onnxruntime(model, x_test), expected, rtol=1e-4, atol=1e-5)


def test_training_is_deterministic_for_a_seed():
    x_train, y_train, _, _, _ = split()
    first = digits.fit_parameters(x_train[:128], y_train[:128], seed=3, epochs=1)
    second = digits.fit_parameters(x_train[:128], y_train[:128], seed=3, epochs=1)
    assert all(np.array_equal(first[name], second[name]) for name in first)


@pytest.mark.parametrize("symmetric, activation_type, per_channel", [
    (True, "int8", True), (True, "int8", False), (False, "int8", True), (False, "uint8", True)])
def test_onnxruntime_qdq_model_keeps_accuracy(symmetric, activation_type, per_channel):
    _, _, x_calib, x_test, y_test = split()
    model, fp32_accuracy = trained()
    qdq = digits.quantize_with_onnxruntime(model, x_calib, per_channel=per_channel,
                                           symmetric=symmetric, activation_type=activation_type)
    op_types = [node.op_type for node in qdq.graph.node]
    assert "QuantizeLinear" in op_types and "DequantizeLinear" in op_types
    zero_points = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer
                   if t.name.endswith("zero_point")}
    assert zero_points["conv2_weight_zero_point"].dtype == np.int8
    assert not zero_points["conv2_weight_zero_point"].any()
    activation = zero_points["relu1_zero_point"]
    assert activation.dtype == np.dtype(activation_type)
    assert (not activation.any()) == (symmetric or activation_type == "uint8")
    qdq_accuracy = digits.accuracy(digits.run_onnxruntime(qdq, x_test), y_test)
    assert abs(qdq_accuracy - fp32_accuracy) <= 1.5, (qdq_accuracy, fp32_accuracy)


def test_an_unknown_activation_type_is_refused():
    model, _ = trained()
    with pytest.raises(ValueError, match="int4"):
        digits.quantize_with_onnxruntime(model, split()[2], activation_type="int4")
