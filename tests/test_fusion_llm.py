"""The norms and activations of current transformer models, written the way PyTorch's
exporters write them at opset 17, built into engines (every pass) and compared with
onnxruntime on fresh random inputs: RMSNorm (LLaMA/T5, with Hugging Face's float16 upcast),
LayerNorm without a bias, GELU's tanh form, SiLU and SwiGLU, rotary embeddings. Each
has a near miss that must stay unfused and still compute the same."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

F32, F16 = np.float32, np.float16
ONNX_TYPE = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16}
TOL = {F32: dict(rtol=1e-4, atol=1e-5), F16: dict(rtol=1e-2, atol=1e-2)}


class Exported:
    """A small ONNX graph written node by node; ``inputs`` are ``name: (dtype, shape)``."""

    def __init__(self, inputs: dict, opset: int = 17):
        self.inputs, self.opset = inputs, opset
        self.nodes, self.inits, self.count = [], [], 0

    def const(self, value, dtype=F32):
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(self, op_type, *inputs, **attrs):
        self.count += 1
        out = f"{op_type.lower()}{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"/{out}", **attrs))
        return out

    def mean(self, x, axes=(-1,)):
        if self.opset >= 18:
            return self.node("ReduceMean", x, self.const(list(axes), np.int64), keepdims=1)
        return self.node("ReduceMean", x, axes=list(axes), keepdims=1)

    def model(self, *outputs):
        inputs = [helper.make_tensor_value_info(n, ONNX_TYPE[d], s) for n, (d, s) in self.inputs.items()]
        outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
        graph = helper.make_graph(self.nodes, "exported", inputs, outs, initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])


def declared_inputs(model) -> dict:
    """``name: (dtype, shape)`` of a model's inputs (symbolic dims as their names)."""
    types = {v: k for k, v in ONNX_TYPE.items()}
    return {i.name: (types[i.type.tensor_type.elem_type],
                     [d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim])
            for i in model.graph.input}


def run_both(model, rng, tol=TOL[F32], given: dict | None = None, profile: OptimizationProfile | None = None,
             **options) -> list:
    """Build the engine (``BuilderConfig(**options)``; FP16 allowed where the model has
    float16 inputs); run it and onnxruntime on the same fresh random inputs (``given`` ones
    as given, any input of ``profile`` at its opt shape); compare every output; return the
    engine's layer ops."""
    feeds = dict(given or {})
    for name, (dtype, shape) in declared_inputs(model).items():
        if name not in feeds:
            shape = profile.shapes[name][1] if profile is not None and name in profile.shapes else shape
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    options.setdefault("fp16", any(array.dtype == F16 for array in feeds.values()))
    options.setdefault("tf32", False)  # FP32 compared with onnxruntime at 1e-4: no TF32 tactics on a GPU
    if options["fp16"]:  # untimed, FP16 wherever allowed (as in the simulator): the layers asserted are the
        options.setdefault("optimization_level", 0)  # fusion's, not a GPU's timing of tiny layers
    config = BuilderConfig(progress=False, **options)
    if profile is not None:
        config.add_optimization_profile(profile)
    engine = Builder().build_engine(model, config)
    got = engine.create_execution_context().execute(feeds)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for out, want in zip(session.get_outputs(), session.run(None, feeds)):
        assert got[out.name].dtype == want.dtype, out.name
        np.testing.assert_allclose(got[out.name].astype(np.float64), want.astype(np.float64), **tol,
                                   err_msg=f"output {out.name}")
    return [layer["op"] for layer in engine.inspect()["layers"]]


# ---------------------------------------------------------------- RMSNorm

def rmsnorm(g: Exported, x, dtype=F32, square="pow", inverse="rsqrt", weight=True, upcast=None, eps=1e-6,
            axes=(-1,)):
    """LLaMA's RMSNorm as exported; ``upcast``: ``"llama"`` (x cast once, the result cast
    back before the weight) or ``"t5"`` (only the square's path cast, the product promoted)."""
    wide = g.node("Cast", x, to=TensorProto.FLOAT) if upcast else x
    sq = g.node("Pow", wide, g.const(2.0)) if square == "pow" else g.node("Mul", wide, wide)
    rms = g.node("Sqrt", g.node("Add", g.mean(sq, axes), eps if isinstance(eps, str) else g.const(eps)))
    other = g.node("Cast", x, to=TensorProto.FLOAT) if upcast == "t5" else wide
    if inverse == "div":
        y = g.node("Div", other, rms)
    elif inverse == "reciprocal":
        y = g.node("Mul", other, g.node("Reciprocal", rms))
    else:  # the TorchScript exporter's rsqrt: Div(1, Sqrt(.))
        y = g.node("Mul", other, g.node("Div", g.const([1.0]), rms))
    if upcast:
        y = g.node("Cast", y, to=ONNX_TYPE[dtype])
    if weight:
        y = g.node("Mul", g.const(np.linspace(0.5, 1.5, 8), dtype), y)
    return y


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("square, inverse, weight", [("pow", "rsqrt", True), ("mul", "div", True),
                                                     ("pow", "reciprocal", False)])
def test_rmsnorm_is_one_layer(rng, opset, square, inverse, weight):
    g = Exported({"x": (F32, [2, 3, 8])}, opset)
    assert run_both(g.model(rmsnorm(g, "x", square=square, inverse=inverse, weight=weight)), rng) == \
        ["RMSNormalization"]


@pytest.mark.parametrize("upcast", ["llama", "t5"])
def test_rmsnorm_float16_upcast_is_one_layer(rng, upcast):
    """Hugging Face's float16 RMSNorm: the Casts go into the fused op, which sums in float32."""
    g = Exported({"x": (F16, [2, 3, 8])})
    assert run_both(g.model(rmsnorm(g, "x", F16, upcast=upcast)), rng, tol=TOL[F16]) == ["RMSNormalization"]


def test_rmsnorm_over_two_axes_then_a_matmul(rng):
    g = Exported({"x": (F32, [2, 4, 2])})
    y = rmsnorm(g, "x", weight=False, axes=(-2, -1))
    y = g.node("MatMul", g.node("Reshape", y, g.const([2, 8], np.int64)), g.const(rng.standard_normal((8, 5))))
    assert run_both(g.model(y), rng)[0] == "RMSNormalization"


@pytest.mark.parametrize("case", ["middle_axis", "eps_input", "mean_square_read", "cube"])
def test_rmsnorm_near_misses_stay_unfused(rng, case):
    inputs = {"x": (F32, [2, 3, 8])}
    if case == "eps_input":
        inputs["eps"] = (F32, [1])
    g = Exported(inputs)
    if case == "middle_axis":
        outputs = [rmsnorm(g, "x", weight=False, axes=(1,))]
    elif case == "eps_input":
        outputs = [rmsnorm(g, "x", eps="eps")]
    elif case == "mean_square_read":  # the mean square is a graph output too
        outputs = [rmsnorm(g, "x"), next(n.output[0] for n in g.nodes if n.op_type == "ReduceMean")]
    else:
        rms = g.node("Sqrt", g.node("Add", g.mean(g.node("Pow", "x", g.const(3.0))), g.const(1e-6)))
        outputs = [g.node("Div", "x", rms)]
    given = {"eps": np.full(1, 1e-5, F32)} if case == "eps_input" else None
    layers = run_both(g.model(*outputs), rng, given=given)
    assert "RMSNormalization" not in layers and len(layers) > 1


def test_rmsnorm_after_a_narrowing_cast_keeps_the_cast(rng):
    """float32 x cast to float16 before the norm: the fused op must read the rounded values,
    so the Cast stays and the norm of its output fuses."""
    g = Exported({"x": (F32, [2, 3, 8])})
    narrow = g.node("Cast", "x", to=TensorProto.FLOAT16)
    sq = g.node("Mul", narrow, narrow)
    rms = g.node("Sqrt", g.node("Add", g.mean(sq), g.const(1e-3, F16)))
    y = g.node("Cast", g.node("Div", narrow, rms), to=TensorProto.FLOAT)
    layers = run_both(g.model(y), rng, tol=TOL[F16], strongly_typed=True)
    assert layers == ["Cast", "RMSNormalization", "Cast"]


def test_rmsnormalization_node_matches_onnxruntime(rng):
    """ONNX's RMSNormalization (opset 23), float16 X with a float16 scale."""
    g = Exported({"x": (F16, [2, 3, 8])}, opset=23)
    y = g.node("RMSNormalization", "x", g.const(np.linspace(0.5, 1.5, 8), F16), epsilon=1e-5)
    assert run_both(g.model(y), rng, tol=TOL[F16]) == ["RMSNormalization"]


# ---------------------------------------------------------------- LayerNorm without bias

def layernorm(g: Exported, x, beta=False):
    d = g.node("Sub", x, g.mean(x))
    var = g.mean(g.node("Pow", d, g.const(2.0)))
    y = g.node("Div", d, g.node("Sqrt", g.node("Add", var, g.const(1e-5))))
    y = g.node("Mul", y, g.const(np.linspace(0.5, 1.5, 8)))
    return g.node("Add", y, g.const(np.linspace(-1, 1, 8))) if beta else y


@pytest.mark.parametrize("opset", [13, 17])
def test_layernorm_without_bias_is_one_layer(rng, opset):
    g = Exported({"x": (F32, [2, 3, 8])}, opset)
    assert run_both(g.model(layernorm(g, "x")), rng) == ["LayerNormalization"]


@pytest.mark.parametrize("dtype", [F32, F16])
def test_layernormalization_without_b_matches_onnxruntime(rng, dtype):
    g = Exported({"x": (dtype, [2, 3, 8])})
    y = g.node("LayerNormalization", "x", g.const(np.linspace(0.5, 1.5, 8), dtype), epsilon=1e-5)
    assert run_both(g.model(y), rng, tol=TOL[dtype]) == ["LayerNormalization"]


# ---------------------------------------------------------------- GELU, tanh form

def gelu_tanh(g: Exported, x, form="torchscript", coefficient=0.044715):
    """``torchscript``: F.gelu(approximate="tanh") at opset 17, cube as x * (x * x), 0.5
    applied last; ``hf``: Hugging Face's NewGELU, Pow(x, 3) and 0.5 * x first; ``fast``:
    its FastGELU, ``x * 0.7978845608 * (1 + 0.044715 * x * x)`` inside the tanh."""
    if form == "fast":
        square = g.node("Mul", g.node("Mul", x, g.const(coefficient)), x)
        inner = g.node("Mul", g.node("Mul", x, g.const(0.7978845608)), g.node("Add", square, g.const(1.0)))
        return g.node("Mul", g.node("Mul", x, g.const(0.5)), g.node("Add", g.node("Tanh", inner), g.const(1.0)))
    cube = g.node("Mul", x, g.node("Mul", x, x)) if form == "torchscript" else g.node("Pow", x, g.const(3.0))
    inner = g.node("Add", x, g.node("Mul", g.const(coefficient), cube))
    t = g.node("Tanh", g.node("Mul", g.const(math.sqrt(2.0 / math.pi)), inner))
    term = g.node("Add", g.const(1.0), t)
    if form == "torchscript":
        return g.node("Mul", g.const(0.5), g.node("Mul", x, term))
    return g.node("Mul", g.node("Mul", g.const(0.5), x), term)


@pytest.mark.parametrize("form", ["torchscript", "hf", "fast"])
def test_gelu_tanh_fuses_into_the_matmul_epilogue(rng, form):
    g = Exported({"x": (F32, [2, 3, 8])})
    h = g.node("MatMul", "x", g.const(rng.standard_normal((8, 6)) * 0.5))
    h = g.node("Add", h, g.const(rng.standard_normal(6)))
    assert run_both(g.model(gelu_tanh(g, h, form)), rng) == ["MatMul+Add+Gelu"]


def test_gelu_node_tanh_matches_onnxruntime(rng):
    g = Exported({"x": (F32, [2, 3, 8])}, opset=20)
    assert run_both(g.model(g.node("Gelu", "x", approximate="tanh")), rng) == ["Gelu"]


@pytest.mark.parametrize("form", ["torchscript", "fast"])
def test_gelu_tanh_with_another_coefficient_stays_unfused(rng, form):
    g = Exported({"x": (F32, [2, 3, 8])})
    layers = run_both(g.model(gelu_tanh(g, "x", form, coefficient=0.05)), rng)
    assert "Gelu" not in " ".join(layers)


# ---------------------------------------------------------------- SiLU, SwiGLU

def silu(g: Exported, x, alpha=None):
    gate = x if alpha is None else g.node("Mul", x, g.const(alpha))
    return g.node("Mul", x, g.node("Sigmoid", gate))


def test_swiglu_mlp_is_three_gemms_with_epilogues(rng):
    """LLaMA's MLP, down(silu(gate(x)) * up(x)): SiLU and the product ride the gate GEMM's epilogue."""
    g = Exported({"x": (F32, [2, 3, 8])})
    weight = lambda k, n: g.const(rng.standard_normal((k, n)) * 0.3)  # noqa: E731
    gate, up = g.node("MatMul", "x", weight(8, 16)), g.node("MatMul", "x", weight(8, 16))
    y = g.node("MatMul", g.node("Mul", silu(g, gate), up), weight(16, 8))
    assert run_both(g.model(y), rng) == ["MatMul", "MatMul+Swish+Mul", "MatMul"]


@pytest.mark.parametrize("alpha", [None, 1.702])  # SiLU, CLIP's QuickGELU
def test_silu_after_a_conv_is_its_epilogue(rng, alpha):
    g = Exported({"x": (F32, [1, 3, 4, 4])})
    c = g.node("Conv", "x", g.const(rng.standard_normal((4, 3, 3, 3)) * 0.3), g.const(rng.standard_normal(4)),
               pads=[1, 1, 1, 1])
    assert run_both(g.model(silu(g, c, alpha)), rng) == ["Conv+Swish"]


def test_swish_node_and_float16_silu_match_onnxruntime(rng):
    """The Swish node (opset 24) against float64 NumPy: onnxruntime releases before 1.23
    do not run opset 24 (the GPU machine's did not); float16 SiLU against onnxruntime."""
    g = Exported({"x": (F32, [2, 3, 8])}, opset=24)
    engine = Builder().build_engine(g.model(g.node("Swish", "x", alpha=0.75)), BuilderConfig(progress=False))
    x = rng.standard_normal((2, 3, 8)).astype(F32)
    (got,) = engine.create_execution_context().execute({"x": x}).values()
    want = x.astype(np.float64) / (1.0 + np.exp(-0.75 * x.astype(np.float64)))
    np.testing.assert_allclose(got.astype(np.float64), want, **TOL[F32])
    assert [layer["op"] for layer in engine.inspect()["layers"]] == ["Swish"]
    g = Exported({"x": (F16, [2, 3, 8])})
    assert run_both(g.model(silu(g, "x")), rng, tol=TOL[F16]) == ["Swish"]


def test_gated_sigmoid_of_another_tensor_stays_a_chain(rng):
    """x * Sigmoid(y) (a GLU gate) is no Swish: it stays a pointwise chain."""
    g = Exported({"x": (F32, [2, 8]), "y": (F32, [2, 8])})
    assert run_both(g.model(g.node("Mul", "x", g.node("Sigmoid", "y"))), rng) == ["Sigmoid+Mul"]


# ---------------------------------------------------------------- rotary embeddings

def rotate_half(g: Exported, x, d, computed=False, order="neg_second", dim=3):
    """``cat(-x[..., d/2:], x[..., :d/2])`` as exported: constant bounds, or (``computed``)
    the TorchScript form, ``x.shape[dim] // 2`` from ``Shape(x)`` (through int64 Casts)."""
    if computed:
        size = g.node("Gather", g.node("Shape", x), g.const(dim, np.int64), axis=0)
        half = g.node("Cast", g.node("Div", size, g.const(2, np.int64)), to=TensorProto.INT64)
        half = g.node("Unsqueeze", half, g.const([0], np.int64))
    else:
        half = g.const([d // 2], np.int64)
    axes = g.const([3], np.int64)
    x1 = g.node("Slice", x, g.const([0], np.int64), half, axes, g.const([1], np.int64))
    x2 = g.node("Slice", x, half, g.const([2**63 - 1], np.int64), axes)
    parts = [g.node("Neg", x2), x1] if order == "neg_second" else [x1, g.node("Neg", x2)]
    return g.node("Concat", *parts, axis=-1)


def rope(g: Exported, x, cos="cos", sin="sin", d=8, **kwargs):
    return g.node("Add", g.node("Mul", x, cos), g.node("Mul", rotate_half(g, x, d, **kwargs), sin))


def rope_profile(heads=3, d=8) -> OptimizationProfile:
    profile = OptimizationProfile()
    for name, h in (("q", heads), ("k", heads), ("cos", 1), ("sin", 1)):
        profile.set_shape(name, (1, h, 1, d), (2, h, 5, d), (2, h, 8, d))
    return profile


@pytest.mark.parametrize("computed", [False, True])
def test_rope_on_q_and_k_is_one_layer_each(rng, computed):
    """HF's apply_rotary_pos_emb with dynamic batch and sequence: cos/sin [B, 1, S, D] for q and k."""
    dims = lambda h: ["B", h, "S", 8]  # noqa: E731
    g = Exported({"q": (F32, dims(3)), "k": (F32, dims(3)), "cos": (F32, dims(1)), "sin": (F32, dims(1))})
    outputs = [rope(g, "q", computed=computed), rope(g, "k", computed=computed)]
    layers = run_both(g.model(*outputs), rng, profile=rope_profile())
    assert layers == ["plugrt.elementwise::RotaryEmbedding"] * 2


def test_rope_after_the_head_split_of_a_real_export(rng):
    """LLaMA's TorchScript export: q reshaped to [B, S, -1, D] with B and S from Shape (so
    inference leaves every dim of q a symbol), transposed, its half computed from Shape(q);
    the dims are checked at the profile's shapes."""
    g = Exported({"h": (F32, ["B", "S", 24]), "cos": (F32, ["B", 1, "S", 8]), "sin": (F32, ["B", 1, "S", 8])})
    shape = g.node("Shape", "h")
    batch_seq = [g.node("Unsqueeze", g.node("Gather", shape, g.const(axis, np.int64), axis=0), g.const([0], np.int64))
                 for axis in (0, 1)]
    target = g.node("Concat", *batch_seq, g.const([-1], np.int64), g.const([8], np.int64), axis=0)
    q = g.node("Transpose", g.node("Reshape", "h", target), perm=[0, 2, 1, 3])
    profile = OptimizationProfile().set_shape("h", (1, 1, 24), (2, 5, 24), (2, 8, 24))
    for name in ("cos", "sin"):
        profile.set_shape(name, (1, 1, 1, 8), (2, 1, 5, 8), (2, 1, 8, 8))
    # the head swap moves below the rotation (it stays a kernel: its output is the graph's),
    # cos and sin read as [B, S, 1, D] through a Squeeze and an Unsqueeze (aliases)
    assert run_both(g.model(rope(g, q, computed=True)), rng, profile=profile) == \
        ["Reshape"] + ["Squeeze", "Unsqueeze"] * 2 + ["plugrt.elementwise::RotaryEmbedding", "Transpose"]


def test_rope_with_constant_tables_in_float16(rng):
    g = Exported({"q": (F16, [1, 2, 5, 8])})
    angles = np.arange(5)[:, None] * (10000.0 ** (-np.arange(4) / 4))[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    y = rope(g, "q", cos=g.const(np.cos(angles), F16), sin=g.const(np.sin(angles), F16))
    assert run_both(g.model(y), rng, tol=TOL[F16]) == ["plugrt.elementwise::RotaryEmbedding"]


@pytest.mark.parametrize("case", ["rotated_the_other_way", "sin_grows_x", "half_of_another_dim"])
def test_rope_near_misses_stay_unfused(rng, case):
    """cat(x1, -x2) rotates the other way; a sin of more rows than q broadcasts q up; a
    bound computed from dim 2 (equal to D here, but not at every shape) proves nothing."""
    g = Exported({"q": (F32, ["B", 2, 8, 8]), "cos": (F32, [1, 1, 8, 8]),
                  "sin": (F32, [2, 1, 8, 8] if case == "sin_grows_x" else [1, 1, 8, 8])})
    y = rope(g, "q", order="neg_first" if case == "rotated_the_other_way" else "neg_second",
             computed=case == "half_of_another_dim", dim=2)
    layers = run_both(g.model(y), rng, profile=OptimizationProfile().set_shape("q", (1, 2, 8, 8), (1, 2, 8, 8),
                                                                               (2, 2, 8, 8)))
    assert "plugrt.elementwise::RotaryEmbedding" not in layers and len(layers) > 1


def rotary_attention(g: Exported, cos, sin, heads=3, d=8, seq=5):
    """LLaMA's attention on ``h`` [2, S, H * D]: Q and K split into heads, swapped to
    [B, H, S, D], rotated, then attended; V split and swapped; the heads merged back."""
    def split(weight):
        x = g.node("MatMul", "h", g.const(weight))
        return g.node("Transpose", g.node("Reshape", x, g.const([2, seq, heads, d], np.int64)), perm=[0, 2, 1, 3])

    weights = np.random.default_rng(7).standard_normal((3, heads * d, heads * d)) / math.sqrt(heads * d)
    q, k = (rope(g, split(w), cos, sin, d=d, computed=True, dim=3) for w in weights[:2])
    v = split(weights[2])
    scores = g.node("Mul", g.node("MatMul", q, g.node("Transpose", k, perm=[0, 1, 3, 2])), g.const(1 / math.sqrt(d)))
    y = g.node("MatMul", g.node("Softmax", scores, axis=-1), v)
    return g.node("Reshape", g.node("Transpose", y, perm=[0, 2, 1, 3]), g.const([2, seq, heads * d], np.int64))


@pytest.mark.parametrize("tables", ["inputs", "constants"])
def test_rope_head_swaps_are_taken_into_the_attention(rng, tables, caplog):
    """Transpose(Reshape(q_proj)) -> RotaryEmbedding -> attention: the Transpose keeps the
    last axis, so it moves below the rotation (cos/sin [1, 1, S, D] read as [1, S, 1, D]:
    aliases, or constants stored so), and the attention reads Q and K as bshd: no
    Transpose kernel is left."""
    shape = [1, 1, 5, 8]
    angles = np.arange(5)[:, None] * (10000.0 ** (-np.arange(4) / 4))[None, :]
    angles = np.concatenate([angles, angles], axis=-1).reshape(shape)
    if tables == "inputs":
        g = Exported({"h": (F32, [2, 5, 24]), "cos": (F32, shape), "sin": (F32, shape)})
        cos, sin = "cos", "sin"
    else:
        g = Exported({"h": (F32, [2, 5, 24])})
        cos, sin = g.const(np.cos(angles)), g.const(np.sin(angles))
    with caplog.at_level("INFO", logger="plugrt.passes.sink_rotary_transposes"):
        layers = run_both(g.model(rotary_attention(g, cos, sin)), rng)
    assert "Transpose" not in layers and layers.count("plugrt.contrib::MultiHeadAttention") == 1, layers
    assert layers.count("plugrt.elementwise::RotaryEmbedding") == 2, layers
    assert caplog.text.count("moved below") == 2, caplog.text


@pytest.mark.parametrize("case", ["moves_the_last_axis", "cos_per_head"])
def test_rope_head_swap_near_misses_stay(rng, case, caplog):
    """A Transpose that moves the last axis (the rotation's pairs would change), and cos of
    its own heads ([1, H, S, D] read as [1, S, H, D] would take a copy), stay above the
    rotation, logged with the reason; the results are onnxruntime's."""
    perm = [0, 2, 3, 1] if case == "moves_the_last_axis" else [0, 2, 1, 3]
    table = [1, 3, 8, 8] if case == "cos_per_head" else [1, 1, 8, 8]
    g = Exported({"q": (F32, [2, 8, 3, 8]), "cos": (F32, table), "sin": (F32, table)})
    with caplog.at_level("INFO", logger="plugrt.passes.sink_rotary_transposes"):
        layers = run_both(g.model(rope(g, g.node("Transpose", "q", perm=perm))), rng)
    assert layers == ["Transpose", "plugrt.elementwise::RotaryEmbedding"], layers
    reason = "moves the last axis" if case == "moves_the_last_axis" else "cannot be read in the order"
    assert "stays above" in caplog.text and reason in caplog.text, caplog.text


# ---------------------------------------------------------------- a LLaMA block

@pytest.mark.parametrize("dtype", [F32, F16])
def test_llama_mlp_block(rng, dtype):
    """x + down(silu(gate(rmsnorm(x))) * up(rmsnorm(x))): four layers, the float16 model's
    upcasts inside the norm."""
    g = Exported({"x": (dtype, [2, 3, 8])})
    h = rmsnorm(g, "x", dtype, upcast="llama" if dtype == F16 else None)
    weight = lambda k, n: g.const(rng.standard_normal((k, n)) * 0.3, dtype)  # noqa: E731
    gate, up = g.node("MatMul", h, weight(8, 16)), g.node("MatMul", h, weight(8, 16))
    y = g.node("Add", "x", g.node("MatMul", g.node("Mul", silu(g, gate), up), weight(16, 8)))
    assert run_both(g.model(y), rng, tol=TOL[dtype]) == \
        ["RMSNormalization", "MatMul", "MatMul+Swish+Mul", "MatMul+Add"]
