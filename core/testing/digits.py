"""A real-data INT8 accuracy fixture: a small CNN trained on scikit-learn's digits.

The INT8 checks need a model whose accuracy means something, on data that ships in a pip
package (scikit-learn's 8x8 digits, 1797 images) and without torch. This module trains
one with plain NumPy and exports it as ONNX::

    from plugrt.testing.digits import (accuracy, load_digits_split, quantize_with_onnxruntime,
                                       run_onnxruntime, train_digits_cnn)

    x_train, y_train, x_calib, x_test, y_test = load_digits_split()
    model, fp32_accuracy = train_digits_cnn()               # ~98% on the held-out images
    qdq = quantize_with_onnxruntime(model, x_calib)         # onnxruntime's own QDQ model
    accuracy(run_onnxruntime(qdq, x_test), y_test)          # the QDQ model's meaning, run

The network (opset 17, input ``input`` [batch,1,8,8], output ``logits`` [batch,10])::

    Conv(1->16, 3x3, pad 1) Relu  Conv(16->32, 3x3, pad 1) Relu  MaxPool 2x2
    Conv(32->32, 3x3, pad 1) Relu  Flatten  Gemm(512->10)

It trains in about 3 s of one core's time, deterministically for a seed. numpy, onnx,
scikit-learn and onnxruntime are imported inside the functions that need them.
"""

from __future__ import annotations

import functools

#: Images used for training, and for calibration (drawn from the training distribution but
#: never scored); the rest of the 1797 are the held-out test set.
TRAIN_SIZE = 1100
CALIBRATION_SIZE = 200
OPSET = 17
#: onnxruntime 1.17 and later read IR version 10 (onnx 1.23 writes 11+ by default).
IR_VERSION = 10


def accuracy(logits, labels) -> float:
    """The percentage of rows of ``logits`` whose largest entry is at the row's label."""
    import numpy as np

    predicted = np.argmax(np.asarray(logits), axis=1)
    return float(100.0 * np.mean(predicted == np.asarray(labels)))


def load_digits_split(seed: int = 0):
    """scikit-learn's digits as float32 [N,1,8,8] in [0,1], split stratified by class.

    :returns: ``(x_train, y_train, x_calib, x_test, y_test)``: 1100 training images, 200
        calibration images and 497 held-out test images with their labels (int64).
    """
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    labels = digits.target.astype(np.int64)
    x_seen, x_test, y_seen, y_test = train_test_split(
        images, labels, train_size=TRAIN_SIZE + CALIBRATION_SIZE, stratify=labels, random_state=seed)
    x_train, x_calib, y_train, _ = train_test_split(
        x_seen, y_seen, train_size=TRAIN_SIZE, stratify=y_seen, random_state=seed)
    return x_train, y_train, x_calib, x_test, y_test


# ---------------------------------------------------------------------------------------
# The network in NumPy. Activations are channels-last (N,H,W,C) inside, which makes im2col
# a view; weights keep ONNX's layout (O,C,kh,kw), so export needs no reordering.
# ---------------------------------------------------------------------------------------

def _im2col(x):
    """(N,H,W,C) -> (N*H*W, C*9): the 3x3, pad-1 neighbourhoods, ordered (C, kh, kw)."""
    import numpy as np

    n, h, w, c = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))
    return windows.reshape(n * h * w, c * 9)


def _col2im(dcols, shape):
    """The adjoint of :func:`_im2col`: sums each column's gradient back onto its pixels."""
    import numpy as np

    n, h, w, c = shape
    dcols = dcols.reshape(n, h, w, c, 3, 3)
    dpadded = np.zeros((n, h + 2, w + 2, c), dtype=dcols.dtype)
    for i in range(3):
        for j in range(3):
            dpadded[:, i:i + h, j:j + w, :] += dcols[..., i, j]
    return dpadded[:, 1:h + 1, 1:w + 1, :]


def _conv_forward(x, weight, bias):
    n, h, w, _ = x.shape
    cols = _im2col(x)
    out = cols @ weight.reshape(weight.shape[0], -1).T + bias
    return out.reshape(n, h, w, -1), cols


def _conv_backward(dout, cols, weight, x_shape):
    dout = dout.reshape(-1, weight.shape[0])
    dweight = (dout.T @ cols).reshape(weight.shape)
    dbias = dout.sum(axis=0)
    dx = _col2im(dout @ weight.reshape(weight.shape[0], -1), x_shape)
    return dx, dweight, dbias


def _maxpool_forward(x):
    """2x2, stride 2 over (N,H,W,C); also returns which of the four each output took."""
    import numpy as np

    n, h, w, c = x.shape
    windows = x.reshape(n, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 5, 2, 4)
    windows = windows.reshape(n, h // 2, w // 2, c, 4)
    choice = np.argmax(windows, axis=-1)
    return np.take_along_axis(windows, choice[..., None], axis=-1)[..., 0], choice


def _maxpool_backward(dout, choice, x_shape):
    import numpy as np

    n, h, w, c = x_shape
    dwindows = np.zeros(dout.shape + (4,), dtype=dout.dtype)
    np.put_along_axis(dwindows, choice[..., None], dout[..., None], axis=-1)
    dwindows = dwindows.reshape(n, h // 2, w // 2, c, 2, 2).transpose(0, 1, 4, 2, 5, 3)
    return dwindows.reshape(x_shape)


def _init_parameters(seed):
    """He-initialized weights in ONNX layout, zero biases."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {
        "conv1_weight": he((16, 1, 3, 3), 9), "conv1_bias": np.zeros(16, np.float32),
        "conv2_weight": he((32, 16, 3, 3), 144), "conv2_bias": np.zeros(32, np.float32),
        "conv3_weight": he((32, 32, 3, 3), 288), "conv3_bias": np.zeros(32, np.float32),
        "fc_weight": he((10, 512), 512) * np.float32(0.5), "fc_bias": np.zeros(10, np.float32),
    }


def _forward(params, images):
    """Logits for (N,1,8,8) images, and what the backward pass needs."""
    x0 = images.transpose(0, 2, 3, 1)
    a1, cols1 = _conv_forward(x0, params["conv1_weight"], params["conv1_bias"])
    r1 = a1.clip(min=0)
    a2, cols2 = _conv_forward(r1, params["conv2_weight"], params["conv2_bias"])
    r2 = a2.clip(min=0)
    p2, choice = _maxpool_forward(r2)
    a3, cols3 = _conv_forward(p2, params["conv3_weight"], params["conv3_bias"])
    r3 = a3.clip(min=0)
    flat = r3.transpose(0, 3, 1, 2).reshape(len(images), -1)     # ONNX Flatten of NCHW
    logits = flat @ params["fc_weight"].T + params["fc_bias"]
    cache = (x0, cols1, r1, cols2, r2, choice, p2, cols3, r3, flat)
    return logits, cache


def numpy_forward(params, images):
    """The trained network's logits for float32 (N,1,8,8) images, in NumPy."""
    return _forward(params, images)[0]


def _backward(params, cache, dlogits):
    """Gradients of the loss for every parameter, given d(loss)/d(logits)."""
    x0, cols1, r1, cols2, r2, choice, p2, cols3, r3, flat = cache
    grads = {"fc_weight": dlogits.T @ flat, "fc_bias": dlogits.sum(axis=0)}
    dflat = dlogits @ params["fc_weight"]
    dr3 = dflat.reshape(r3.shape[0], r3.shape[3], r3.shape[1], r3.shape[2]).transpose(0, 2, 3, 1)
    da3 = dr3 * (r3 > 0)
    dp2, grads["conv3_weight"], grads["conv3_bias"] = _conv_backward(
        da3, cols3, params["conv3_weight"], p2.shape)
    da2 = _maxpool_backward(dp2, choice, r2.shape) * (r2 > 0)
    dr1, grads["conv2_weight"], grads["conv2_bias"] = _conv_backward(
        da2, cols2, params["conv2_weight"], r1.shape)
    da1 = dr1 * (r1 > 0)
    _, grads["conv1_weight"], grads["conv1_bias"] = _conv_backward(
        da1, cols1, params["conv1_weight"], x0.shape)
    return grads


def _softmax_cross_entropy(logits, labels):
    """Mean loss and its gradient with respect to the logits."""
    import numpy as np

    shifted = logits - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    loss = -np.mean(np.log(probabilities[rows, labels] + 1e-12))
    dlogits = probabilities
    dlogits[rows, labels] -= 1.0
    return loss, (dlogits / len(labels)).astype(np.float32)


def fit_parameters(x_train, y_train, seed=0, epochs=12, batch_size=32, learning_rate=3e-3,
                   weight_decay=0.05):
    """Trains the network with Adam over shuffled minibatches; returns its parameters.

    ``weight_decay`` is decoupled (AdamW) and on weights only; it keeps outlier weights,
    and so INT8 scales, small. BLAS runs on one thread: its matrices are small, and two
    threads on two busy cores (pytest-xdist) made training ten times slower, not faster.
    """
    import numpy as np
    from threadpoolctl import threadpool_limits     # scikit-learn's own dependency

    params = _init_parameters(seed)
    rng = np.random.default_rng(seed + 1)
    adam = {"step": 0, "moments": {name: np.zeros_like(value) for name, value in params.items()},
            "squares": {name: np.zeros_like(value) for name, value in params.items()}}
    with threadpool_limits(limits=1, user_api="blas"):
        for epoch in range(epochs):
            # Cosine decay from learning_rate to about a tenth of it over the run.
            rate = learning_rate * (0.55 + 0.45 * np.cos(np.pi * epoch / epochs))
            order = rng.permutation(len(x_train))
            for start in range(0, len(order), batch_size):
                batch = order[start:start + batch_size]
                logits, cache = _forward(params, x_train[batch])
                _, dlogits = _softmax_cross_entropy(logits, y_train[batch])
                grads = _backward(params, cache, dlogits)
                _adam_step(params, grads, adam, rate, weight_decay)
    return params


def _adam_step(params, grads, adam, rate, weight_decay, beta1=0.9, beta2=0.999, eps=1e-8):
    """One AdamW update of ``params`` in place; ``adam`` holds the step count and moments."""
    import numpy as np

    adam["step"] += 1
    step = adam["step"]
    for name, grad in grads.items():
        moment = adam["moments"][name] = beta1 * adam["moments"][name] + (1 - beta1) * grad
        square = adam["squares"][name] = beta2 * adam["squares"][name] + (1 - beta2) * grad * grad
        corrected = moment / (1 - beta1 ** step)
        scale = np.sqrt(square / (1 - beta2 ** step)) + eps
        decay = weight_decay * params[name] if name.endswith("weight") else 0.0
        params[name] = (params[name] - rate * (corrected / scale + decay)).astype(np.float32)


# ---------------------------------------------------------------------------------------
# ONNX export and the onnxruntime checks.
# ---------------------------------------------------------------------------------------

#: The network in ONNX's text syntax; the weights are added as initializers.
GRAPH_TEXT = """
digits_cnn (float[batch, 1, 8, 8] input) => (float[batch, 10] logits)
{
    [conv1] conv1 = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (input, conv1_weight, conv1_bias)
    [relu1] relu1 = Relu (conv1)
    [conv2] conv2 = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (relu1, conv2_weight, conv2_bias)
    [relu2] relu2 = Relu (conv2)
    [pool2] pool2 = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (relu2)
    [conv3] conv3 = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (pool2, conv3_weight, conv3_bias)
    [relu3] relu3 = Relu (conv3)
    [flatten] flatten = Flatten <axis = 1> (relu3)
    [fc] logits = Gemm <transB = 1> (flatten, fc_weight, fc_bias)
}
"""


def export_onnx(params):
    """The network as an opset-17 ONNX model, weights as initializers, every node named."""
    import onnx
    from onnx import helper, numpy_helper, parser

    graph = parser.parse_graph(GRAPH_TEXT)
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in params.items())
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION, producer_name="plugrt.testing.digits")
    onnx.checker.check_model(model, full_check=True)
    return model


def run_onnxruntime(model, images, optimize: bool = False):
    """``model``'s output for ``images`` (its one input), run by onnxruntime on the CPU.

    By default with graph optimizations off, so a QDQ model runs as written: each
    QuantizeLinear/DequantizeLinear pair rounds and clamps in float, which is what the QDQ
    model means. ``optimize=True`` lets onnxruntime fuse the pairs into its int8 kernels
    (QLinearConv, ...); on x86 CPUs without VNNI those add int8 products in saturating int16
    pairs, and with full-range 8-bit weights this model's logits then came out up to 30% (of
    the largest logit) off the QDQ meaning (hence quantize_static's ``reduce_range``): not a
    reference for another engine.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1        # small batches; no spinning threads left behind
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    return session.run(None, {input_name: images})[0]


def _check_export(model, params, images):
    """Raises if onnxruntime's run of the exported model differs from the NumPy forward."""
    import numpy as np

    expected = numpy_forward(params, images)
    np.testing.assert_allclose(run_onnxruntime(model, images), expected, rtol=1e-4, atol=1e-4,
                               err_msg="the exported digits CNN disagrees with its NumPy forward")


@functools.lru_cache(maxsize=4)
def _trained(seed, epochs):
    x_train, y_train, _, x_test, y_test = load_digits_split(seed)
    params = fit_parameters(x_train, y_train, seed=seed, epochs=epochs)
    model = export_onnx(params)
    _check_export(model, params, x_test)
    return model.SerializeToString(), accuracy(numpy_forward(params, x_test), y_test)


def train_digits_cnn(seed: int = 0, epochs: int = 12):
    """Trains the digits CNN (a few seconds; cached per ``(seed, epochs)`` in the process).

    onnxruntime's output for the exported model is checked against the NumPy forward
    (rtol 1e-4) before it is returned.

    :returns: ``(model, fp32_test_accuracy)``: a fresh ``onnx.ModelProto`` on every call, and
        the FP32 accuracy in percent on the held-out images of :func:`load_digits_split`.
    """
    import onnx

    serialized, test_accuracy = _trained(seed, epochs)
    return onnx.load_from_string(serialized), test_accuracy


class _ImageReader:
    """An onnxruntime CalibrationDataReader over calibration images, in fixed-size batches."""

    def __init__(self, input_name, images, batch_size):
        self._batches = iter([{input_name: images[start:start + batch_size]}
                              for start in range(0, len(images), batch_size)])

    def get_next(self):
        return next(self._batches, None)


def quantize_with_onnxruntime(model, calibration_inputs, per_channel: bool = True,
                              symmetric: bool = True, activation_type: str = "int8",
                              calibrate_method: str = "MinMax", reduce_range: bool = False,
                              batch_size: int = 50, preprocess: bool = True):
    """onnxruntime's own QDQ model of ``model``, calibrated on ``calibration_inputs``.

    Made by ``onnxruntime.quantization.quantize_static`` in QDQ format with symmetric int8
    weights (per output channel if ``per_channel``). ``symmetric=True`` (what TensorRT
    wants) centres activations' ranges on zero (int8 zero points of 0); ``symmetric=False``
    is onnxruntime's default, zero points from the calibrated range. Activations are
    ``activation_type``: ``int8`` (onnxruntime's default) or ``uint8``.
    ``calibrate_method`` names an ``onnxruntime.quantization.CalibrationMethod`` (``MinMax``,
    ``Entropy``, ``Percentile``). ``reduce_range`` makes weights 7-bit (see
    :func:`run_onnxruntime`). ``preprocess`` runs onnxruntime's ``quant_pre_process`` first,
    as its quantizer recommends (offline: shape inference and basic graph optimizations).

    :returns: the QDQ ``onnx.ModelProto``.
    """
    import pathlib
    import tempfile

    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    activation_types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    if activation_type not in activation_types:
        raise ValueError(f"activation_type {activation_type!r}: use 'int8' or 'uint8'")
    images = np.ascontiguousarray(calibration_inputs, dtype=np.float32)
    input_name = model.graph.input[0].name
    with tempfile.TemporaryDirectory(prefix="plugrt-digits-") as folder:
        folder = pathlib.Path(folder)
        source = folder / "model.onnx"
        onnx.save(model, str(source))
        if preprocess:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            prepared = folder / "model.prepared.onnx"
            # ONNX's own shape inference serves this static CNN; the symbolic one needs sympy,
            # which onnxruntime does not install.
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            source = prepared
        target = folder / "model.qdq.onnx"
        quantize_static(
            str(source), str(target), _ImageReader(input_name, images, batch_size),
            quant_format=QuantFormat.QDQ, per_channel=per_channel, reduce_range=reduce_range,
            activation_type=activation_types[activation_type], weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, calibrate_method),
            extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True})
        return onnx.load(str(target))
