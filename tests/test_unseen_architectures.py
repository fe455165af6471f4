"""Architectures no other test builds, written as ``torch.onnx.export`` writes them (opset 17,
random weights, tiny dims): speech front-ends (GRU, LSTM), a YOLO neck, U-Net blocks, an
MLP-Mixer block, a detection head and a sentence-embedding pooler. Each is built at a static shape and with a
dynamic batch profile (min 1, opt 2, max 3), run at batches 1 and 3, and compared with
onnxruntime on fresh random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

RTOL, ATOL = 1e-4, 1e-5
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def weights(seed: int, **shapes) -> list:
    rng = np.random.default_rng(seed)
    return [numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(max(np.prod(shape[1:]), 1)))
                                    .astype(np.float32), name) for name, shape in shapes.items()]


def const(name: str, value, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def gelu(x: str, out: str, tag: str) -> list:
    """GELU as torch exports it (the erf form): x * 0.5 * (1 + erf(x / sqrt 2))."""
    return [helper.make_node("Div", [x, "sqrt2"], [f"{tag}_d"], name=f"{tag}_div"),
            helper.make_node("Erf", [f"{tag}_d"], [f"{tag}_e"], name=f"{tag}_erf"),
            helper.make_node("Add", [f"{tag}_e", "one"], [f"{tag}_a"], name=f"{tag}_add"),
            helper.make_node("Mul", [x, f"{tag}_a"], [f"{tag}_m"], name=f"{tag}_mul"),
            helper.make_node("Mul", [f"{tag}_m", "half"], [out], name=f"{tag}_half")]


GELU_CONSTS = [const("sqrt2", np.sqrt(2.0), np.float32), const("one", 1.0, np.float32),
               const("half", 0.5, np.float32)]


def model(nodes, inputs, outputs, inits, opset: int = 17):
    graph = helper.make_graph(nodes, "unseen", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], inits)
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(built)
    return built


def speech(batch):
    """Conv1d (stride 2) + GELU, then a bidirectional GRU (batch_first in torch: a Transpose to
    [T, B, C] before it, Transpose + Reshape of its [T, 2, B, H] output after) and a MatMul."""
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], strides=[2], pads=[1, 1], kernel_shape=[3],
                              name="conv"),
             *gelu("c", "g", "gelu"),
             helper.make_node("Transpose", ["g"], ["t"], perm=[2, 0, 1], name="to_tbc"),
             helper.make_node("GRU", ["t", "W", "R", "B"], ["y", "yh"], hidden_size=5, direction="bidirectional",
                              linear_before_reset=1, name="gru"),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3], name="y_tb2h"),
             helper.make_node("Reshape", ["yt", "shape3"], ["yr"], name="y_merge"),
             helper.make_node("Transpose", ["yr"], ["yb"], perm=[1, 0, 2], name="to_btc"),
             helper.make_node("MatMul", ["yb", "proj"], ["out"], name="proj")]
    inits = weights(1, cw=(6, 4, 3), cb=(6,), W=(2, 15, 6), R=(2, 15, 5), B=(2, 30), proj=(10, 7))
    inits += GELU_CONSTS + [const("shape3", [0, 0, -1])]
    return model(nodes, [("x", FLOAT, [batch, 4, 12])], [("out", FLOAT, [batch, 6, 7])], inits)


def speech_lstm(batch):
    """A conformer-style front-end: depthwise Conv1d (dilation 2) and GLU (Split, Sigmoid,
    Mul); a bidirectional LSTM whose zero initial states torch builds from the input's batch
    (Shape, Gather, Concat, ConstantOfShape), then a unidirectional one with the Squeeze of
    its direction axis that torch emits, and a MatMul."""
    zero = helper.make_tensor("zero", FLOAT, [1], [0.0])
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], pads=[2, 2], dilations=[2], kernel_shape=[3], group=4,
                              name="dwconv"),
             helper.make_node("Split", ["c", "halves"], ["ga", "gb"], axis=1, name="glu_split"),
             helper.make_node("Sigmoid", ["gb"], ["gs"], name="glu_sig"),
             helper.make_node("Mul", ["ga", "gs"], ["g"], name="glu_mul"),
             helper.make_node("Transpose", ["g"], ["t"], perm=[2, 0, 1], name="to_tbc"),
             helper.make_node("Shape", ["t"], ["t_shape"], name="t_shape"),
             helper.make_node("Gather", ["t_shape", "one"], ["b"], axis=0, name="batch_dim"),
             helper.make_node("Unsqueeze", ["b", "axis0"], ["b1"], name="batch_dim1"),
             helper.make_node("Concat", ["directions", "b1", "hidden"], ["h_shape"], axis=0, name="h_shape"),
             helper.make_node("ConstantOfShape", ["h_shape"], ["h0"], value=zero, name="h0"),
             helper.make_node("LSTM", ["t", "W", "R", "B", "", "h0", "h0"], ["y", "yh", "yc"], hidden_size=5,
                              direction="bidirectional", name="lstm1"),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3], name="y_tb2h"),
             helper.make_node("Reshape", ["yt", "shape3"], ["yr"], name="y_merge"),
             helper.make_node("LSTM", ["yr", "W2", "R2", "B2"], ["y2", "yh2"], hidden_size=4, name="lstm2"),
             helper.make_node("Squeeze", ["y2", "axis1"], ["y2s"], name="squeeze_direction"),
             helper.make_node("Transpose", ["y2s"], ["yb"], perm=[1, 0, 2], name="to_btc"),
             helper.make_node("MatMul", ["yb", "proj"], ["out"], name="proj")]
    inits = weights(7, cw=(4, 1, 3), W=(2, 20, 2), R=(2, 20, 5), B=(2, 40), W2=(1, 16, 10), R2=(1, 16, 4),
                    B2=(1, 32), proj=(4, 7))
    inits += [const("halves", [2, 2]), const("one", 1), const("axis0", [0]), const("axis1", [1]),
              const("directions", [2]), const("hidden", [5]), const("shape3", [0, 0, -1])]
    return model(nodes, [("x", FLOAT, [batch, 4, 6])], [("out", FLOAT, [batch, 6, 7])], inits)


def yolo_neck(batch):
    """Conv + SiLU (Sigmoid * x), nearest Resize x2, Concat with a lateral input, Split in two,
    SPPF (three MaxPool 5x5 stride 1 pad 2 in a row) on one half, Concat of all."""
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[1, 1], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Mul", ["c", "s"], ["silu"], name="silu"),
             helper.make_node("Resize", ["silu", "", "scales"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor", name="up"),
             helper.make_node("Concat", ["up", "lateral"], ["cat"], axis=1, name="cat"),
             helper.make_node("Split", ["cat", "split"], ["a", "b"], axis=1, name="split"),
             helper.make_node("MaxPool", ["b"], ["m1"], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2],
                              name="pool1"),
             helper.make_node("MaxPool", ["m1"], ["m2"], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2],
                              name="pool2"),
             helper.make_node("MaxPool", ["m2"], ["m3"], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2],
                              name="pool3"),
             helper.make_node("Concat", ["a", "b", "m1", "m2", "m3"], ["out"], axis=1, name="sppf_cat")]
    inits = weights(2, cw=(3, 3, 1, 1), cb=(3,)) + [const("scales", [1, 1, 2, 2], np.float32),
                                                    const("split", [2, 3])]
    return model(nodes, [("x", FLOAT, [batch, 3, 3, 3]), ("lateral", FLOAT, [batch, 2, 6, 6])],
                 [("out", FLOAT, [batch, 11, 6, 6])], inits)


def unet(batch):
    """ConvTranspose (stride 2), Concat with the skip, GroupNorm as torch exports it (Reshape to
    [N, G, -1], InstanceNormalization with unit scale, Reshape back to the input's Shape, Mul
    and Add of the affine parameters), ReLU."""
    nodes = [helper.make_node("ConvTranspose", ["x", "tw", "tb"], ["up"], strides=[2, 2], kernel_shape=[2, 2],
                              name="deconv"),
             helper.make_node("Concat", ["up", "skip"], ["cat"], axis=1, name="cat"),
             helper.make_node("Reshape", ["cat", "groups"], ["grouped"], name="gn_reshape"),
             helper.make_node("InstanceNormalization", ["grouped", "ones", "zeros"], ["normed"], epsilon=1e-5,
                              name="gn_instnorm"),
             helper.make_node("Shape", ["cat"], ["cat_shape"], name="gn_shape"),
             helper.make_node("Reshape", ["normed", "cat_shape"], ["back"], name="gn_back"),
             helper.make_node("Mul", ["back", "gamma"], ["scaled"], name="gn_mul"),
             helper.make_node("Add", ["scaled", "beta"], ["shifted"], name="gn_add"),
             helper.make_node("Relu", ["shifted"], ["out"], name="relu")]
    inits = weights(3, tw=(4, 3, 2, 2), tb=(3,), gamma=(6, 1, 1), beta=(6, 1, 1))
    inits += [const("groups", [0, 3, -1]), const("ones", np.ones(3), np.float32),
              const("zeros", np.zeros(3), np.float32)]
    return model(nodes, [("x", FLOAT, [batch, 4, 3, 3]), ("skip", FLOAT, [batch, 3, 6, 6])],
                 [("out", FLOAT, [batch, 6, 6, 6])], inits)


def unet_bilinear(batch):
    """F.interpolate(x, size=skip.shape[2:]) as torch exports it (the sizes a Concat of the
    two inputs' Shape slices), bilinear (half_pixel) and nearest, and by a scale factor
    (pytorch_half_pixel); Concat with the skip."""
    nodes = [helper.make_node("Shape", ["skip"], ["skip_shape"], name="skip_shape"),
             helper.make_node("Slice", ["skip_shape", "at2", "at4"], ["hw"], name="hw"),
             helper.make_node("Shape", ["x"], ["x_shape"], name="x_shape"),
             helper.make_node("Slice", ["x_shape", "at0", "at2"], ["nc"], name="nc"),
             helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0, name="sizes"),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["up"], mode="linear",
                              coordinate_transformation_mode="half_pixel", name="up_linear"),
             helper.make_node("Resize", ["x", "", "scales"], ["up2"], mode="linear",
                              coordinate_transformation_mode="pytorch_half_pixel", name="up_scaled"),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["up3"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor", name="up_nearest"),
             helper.make_node("Concat", ["up", "skip", "up2", "up3"], ["out"], axis=1, name="cat")]
    inits = [const("at0", [0]), const("at2", [2]), const("at4", [4]), const("scales", [1, 1, 2, 2], np.float32)]
    return model(nodes, [("x", FLOAT, [batch, 2, 3, 3]), ("skip", FLOAT, [batch, 2, 6, 6])],
                 [("out", FLOAT, [batch, 8, 6, 6])], inits)


def mixer(batch):
    """An MLP-Mixer block: token mixing (LayerNorm, Transpose, MatMul over tokens, GELU, MatMul,
    Transpose back, residual Add), then channel mixing (LayerNorm, MLP, residual Add)."""
    nodes = [helper.make_node("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["n1"], axis=-1, epsilon=1e-5,
                              name="ln1"),
             helper.make_node("Transpose", ["n1"], ["t1"], perm=[0, 2, 1], name="to_tokens"),
             helper.make_node("MatMul", ["t1", "tw1"], ["h1"], name="tok_fc1"),
             helper.make_node("Add", ["h1", "tb1"], ["h1b"], name="tok_fc1_bias"),
             *gelu("h1b", "g1", "tok_gelu"),
             helper.make_node("MatMul", ["g1", "tw2"], ["h2"], name="tok_fc2"),
             helper.make_node("Add", ["h2", "tb2"], ["h2b"], name="tok_fc2_bias"),
             helper.make_node("Transpose", ["h2b"], ["t2"], perm=[0, 2, 1], name="to_channels"),
             helper.make_node("Add", ["x", "t2"], ["r1"], name="residual1"),
             helper.make_node("LayerNormalization", ["r1", "ln2_g", "ln2_b"], ["n2"], axis=-1, epsilon=1e-5,
                              name="ln2"),
             helper.make_node("MatMul", ["n2", "cw1"], ["c1"], name="ch_fc1"),
             helper.make_node("Add", ["c1", "cb1"], ["c1b"], name="ch_fc1_bias"),
             *gelu("c1b", "g2", "ch_gelu"),
             helper.make_node("MatMul", ["g2", "cw2"], ["c2"], name="ch_fc2"),
             helper.make_node("Add", ["c2", "cb2"], ["c2b"], name="ch_fc2_bias"),
             helper.make_node("Add", ["r1", "c2b"], ["out"], name="residual2")]
    inits = weights(4, ln1_g=(6,), ln1_b=(6,), tw1=(4, 8), tb1=(8,), tw2=(8, 4), tb2=(4,), ln2_g=(6,), ln2_b=(6,),
                    cw1=(6, 8), cb1=(8,), cw2=(8, 6), cb2=(6,)) + GELU_CONSTS
    return model(nodes, [("x", FLOAT, [batch, 4, 6])], [("out", FLOAT, [batch, 4, 6])], inits)


def detection(batch):
    """TopK of the scores, the boxes gathered by its indices (GatherND, batch_dims 1, and
    GatherElements as torch.gather exports it), Concat with the scores; and the class
    ArgMax, a CumSum of the kept mask and a Where."""
    nodes = [helper.make_node("TopK", ["scores", "k"], ["top", "idx"], axis=1, name="topk"),
             helper.make_node("Unsqueeze", ["idx", "axis_last"], ["idx3"], name="idx_unsqueeze"),
             helper.make_node("GatherND", ["boxes", "idx3"], ["picked"], batch_dims=1, name="gather_boxes"),
             helper.make_node("Expand", ["idx3", "expand4"], ["idx4"], name="idx_expand"),
             helper.make_node("GatherElements", ["boxes", "idx4"], ["picked2"], axis=1, name="gather_elements"),
             helper.make_node("Unsqueeze", ["top", "axis_last"], ["top3"], name="top_unsqueeze"),
             helper.make_node("Concat", ["picked", "top3", "picked2"], ["dets"], axis=2, name="cat"),
             helper.make_node("ArgMax", ["cls"], ["label"], axis=2, keepdims=0, name="argmax"),
             helper.make_node("Greater", ["scores", "thresh"], ["keep"], name="keep"),
             helper.make_node("Cast", ["keep"], ["keepf"], to=FLOAT, name="keep_cast"),
             helper.make_node("CumSum", ["keepf", "axis1"], ["rank"], name="cumsum"),
             helper.make_node("Cast", ["label"], ["labelf"], to=FLOAT, name="label_cast"),
             helper.make_node("Where", ["keep", "labelf", "minus1"], ["kept_label"], name="where"),
             helper.make_node("Add", ["kept_label", "rank"], ["ranked"], name="ranked")]
    inits = [const("k", [3]), const("axis_last", [-1]), const("expand4", [1, 1, 4]), const("axis1", 1),
             const("thresh", 0.0, np.float32), const("minus1", -1.0, np.float32)]
    return model(nodes, [("scores", FLOAT, [batch, 10]), ("boxes", FLOAT, [batch, 10, 4]),
                         ("cls", FLOAT, [batch, 10, 3])],
                 [("dets", FLOAT, [batch, 3, 9]), ("idx", INT64, [batch, 3]), ("ranked", FLOAT, [batch, 10])], inits)


def embedding(batch):
    """Sentence-transformers' mean pooling: Gather of the token embeddings, the attention mask
    Unsqueezed, Expanded to them and Cast, Mul, ReduceSum over the sequence, divided by the
    mask's ReduceSum clipped at 1e-9; then F.normalize (ReduceL2, Clip, Expand, Div)."""
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["tok"], axis=0, name="embed"),
             helper.make_node("Unsqueeze", ["attention_mask", "axis_last"], ["m3"], name="mask_unsqueeze"),
             helper.make_node("Shape", ["tok"], ["tok_shape"], name="tok_shape"),
             helper.make_node("Expand", ["m3", "tok_shape"], ["mexp"], name="mask_expand"),
             helper.make_node("Cast", ["mexp"], ["mf"], to=FLOAT, name="mask_cast"),
             helper.make_node("Mul", ["tok", "mf"], ["masked"], name="masked"),
             helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0, name="sum"),
             helper.make_node("ReduceSum", ["mf", "axis1"], ["count"], keepdims=0, name="count"),
             helper.make_node("Clip", ["count", "tiny"], ["countc"], name="clamp"),
             helper.make_node("Div", ["summed", "countc"], ["mean"], name="mean"),
             helper.make_node("ReduceL2", ["mean"], ["norm"], axes=[1], keepdims=1, name="l2"),
             helper.make_node("Clip", ["norm", "eps"], ["normc"], name="norm_clamp"),
             helper.make_node("Shape", ["mean"], ["mean_shape"], name="mean_shape"),
             helper.make_node("Expand", ["normc", "mean_shape"], ["norme"], name="norm_expand"),
             helper.make_node("Div", ["mean", "norme"], ["out"], name="normalize"),
             helper.make_node("LpNormalization", ["mean"], ["out_lp"], axis=-1, p=2, name="lpnorm")]
    inits = weights(6, emb=(11, 6)) + [const("axis_last", [-1]), const("axis1", [1]),
                                       const("tiny", 1e-9, np.float32), const("eps", 1e-12, np.float32)]
    return model(nodes, [("input_ids", INT64, [batch, 5]), ("attention_mask", INT64, [batch, 5])],
                 [("out", FLOAT, [batch, 6]), ("out_lp", FLOAT, [batch, 6])], inits)


def feeds(name: str, onnx_model, batch: int, rng) -> dict:
    out = {}
    for value in onnx_model.graph.input:
        dims = [batch] + [d.dim_value for d in value.type.tensor_type.shape.dim[1:]]
        if name == "embedding" and value.name == "input_ids":
            out[value.name] = rng.integers(0, 11, dims).astype(np.int64)
        elif value.name == "attention_mask":
            mask = (rng.random(dims) < 0.7).astype(np.int64)
            mask[:, 0] = 1
            out[value.name] = mask
        else:
            out[value.name] = rng.standard_normal(dims).astype(np.float32)
    return out


MODELS = {"speech": speech, "speech_lstm": speech_lstm, "yolo_neck": yolo_neck, "unet": unet,
          "unet_bilinear": unet_bilinear, "mixer": mixer, "detection": detection, "embedding": embedding}


def check(onnx_model, engine, batch_feeds):
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in onnx_model.graph.output]
    with engine.create_execution_context() as context:
        for inputs in batch_feeds:
            want = dict(zip(names, session.run(None, inputs)))
            got = context.execute(inputs)
            for name in names:
                assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype, name
                np.testing.assert_allclose(got[name], want[name], RTOL, ATOL, err_msg=name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_unseen_architecture_matches_onnxruntime_at_a_static_shape(name, rng):
    onnx_model = MODELS[name](2)
    engine = Builder().build_engine(onnx_model, BuilderConfig(progress=False, tf32=False))
    check(onnx_model, engine, [feeds(name, onnx_model, 2, rng)])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_unseen_architecture_matches_onnxruntime_over_a_dynamic_batch(name, rng):
    onnx_model = MODELS[name]("batch")
    config = BuilderConfig(progress=False, tf32=False)
    profile = OptimizationProfile()
    for value in onnx_model.graph.input:
        rest = tuple(d.dim_value for d in value.type.tensor_type.shape.dim[1:])
        profile.set_shape(value.name, (1, *rest), (2, *rest), (3, *rest))
    config.add_optimization_profile(profile)
    engine = Builder().build_engine(onnx_model, config)
    check(onnx_model, engine, [feeds(name, onnx_model, batch, rng) for batch in (1, 3)])
