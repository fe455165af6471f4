"""builtin-quant's CUDA tactics (in the simulator without a GPU) against the references:
QuantizeLinear and DequantizeLinear per tensor (the pointwise kernel of their device
functions), per axis and per block; DynamicQuantizeLinear; every ConvInteger tactic, alone
and with a requantizing epilogue storing int8; integer anchors fused with a
Cast -> Mul -> Relu -> QuantizeLinear chain through the Builder; the conformance kit on
the family; the kernels typed for sm_90."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, float32
from onnx import TensorProto, helper, numpy_helper

from plugrt.engine import Builder, BuilderConfig
from plugrt.kernels import Epilogue, jit
from plugrt.launcher import PreparedLaunch
from plugrt.onnx.backend import prepare
from plugrt.onnx.importer import import_model
from plugrt.testing import check_node, check_plugin, single_node_model
from plugrt_builtin_ops.quant import device_functions, dp4a, tactics as quant_tactics
from plugrt_builtin_ops.quant.conv_integer import TileConfig

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: Tiles small enough for the simulator: K steps of 8 and 4, ragged edges, 1-wide register tiles.
TINY_TILES = (TileConfig(4, 4, 8, 2, 2), TileConfig(8, 4, 4, 2, 1))


@pytest.fixture(autouse=True)
def tiny_tiles(monkeypatch):
    monkeypatch.setattr(quant_tactics, "TILE_CONFIGS", TINY_TILES)


def _ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


# ----------------------------------------------------------------------------- Q / DQ


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
def test_quantize_per_tensor_tactics(rng, dtype):
    x = (rng.standard_normal((3, 5)) * 50).astype(np.float32)
    x[0, :4] = [0.5, 1.5, 2.5, -2.5]  # ties round to even
    check_node("QuantizeLinear", {"x": x, "s": np.float32(1.0), "z": dtype(3)}, constants={"s", "z"}, opset=21)
    check_node("QuantizeLinear", {"x": x, "s": np.float32(0.2), "z": dtype(7)}, opset=21)  # runtime scale, zero point


def test_quantize_float16_no_zero_point_and_precision(rng):
    x = (rng.standard_normal((4, 6)) * 20).astype(np.float16)
    check_node("QuantizeLinear", {"x": x, "s": np.float16(0.3)}, opset=19)
    x32 = (rng.standard_normal((4, 6)) * 20).astype(np.float32)
    check_node("QuantizeLinear", {"x": x32, "s": np.float32(0.3)}, {"precision": 10, "output_dtype": 3}, opset=25)
    check_node("QuantizeLinear", {"x": rng.integers(-500, 500, 7).astype(np.int32), "s": np.float32(3.0),
                                  "z": np.int8(1)}, opset=25)


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
def test_per_axis_and_blocked_tactics(rng, op):
    x = (rng.standard_normal((2, 3, 5)) * 30).astype(np.float32) if op == "QuantizeLinear" else _ints(rng, np.int8, (2, 3, 5))
    for axis in (0, 1, 2):
        n = x.shape[axis]
        feeds = {"x": x, "s": rng.uniform(0.1, 0.5, n).astype(np.float32), "z": rng.integers(-5, 5, n).astype(np.int8)}
        check_node(op, feeds, {"axis": axis}, constants={"s", "z"}, opset=13)
        shape = list(x.shape)
        shape[axis] = -(-shape[axis] // 2)
        feeds = {"x": x, "s": rng.uniform(0.1, 0.5, shape).astype(np.float32)}
        check_node(op, feeds, {"axis": axis, "block_size": 2}, opset=21)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32])
def test_dequantize_tactics(rng, dtype):
    x = _ints(rng, dtype, (3, 5)) if dtype != np.int32 else rng.integers(-10**6, 10**6, (3, 5)).astype(np.int32)
    zero = None if dtype == np.int32 else dtype(2)
    check_node("DequantizeLinear", {"x": x, "s": np.float32(0.05), "z": zero}, opset=21)
    check_node("DequantizeLinear", {"x": x, "s": np.float16(0.05), "z": zero}, opset=21, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("low, high", [(-3.0, 5.0), (0.5, 2.0), (-2.0, -1.0)])
def test_dynamic_quantize_tactic(rng, low, high):
    check_node("DynamicQuantizeLinear", {"x": rng.uniform(low, high, (5, 9)).astype(np.float32)}, n_outputs=3, opset=11)


# ----------------------------------------------------------------------------- dp4a


@pytest.mark.parametrize("a_signed, b_signed", [(True, True), (True, False), (False, True), (False, False)])
def test_dot4_plain_sibling(rng, a_signed, b_signed):
    a = _ints(rng, np.int8 if a_signed else np.uint8, (16, 4))
    b = _ints(rng, np.int8 if b_signed else np.uint8, (16, 4))
    c = rng.integers(-1000, 1000, 16).astype(np.int32)
    dot = dp4a.dot4(a_signed, b_signed)

    @jit
    def kernel(out, a, b, c):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            pa = dp4a.pack4(a[i, 0], a[i, 1], a[i, 2], a[i, 3])
            pb = dp4a.pack4(b[i, 0], b[i, 1], b[i, 2], b[i, 3])
            out[i] = dot(pa, pb, c[i])

    out = np.zeros(16, np.int32)
    kernel[1, 8](out, a, b, c)
    np.testing.assert_array_equal(out, c + np.sum(a.astype(np.int64) * b.astype(np.int64), axis=1))
    assert dp4a.dp4a_ptx(a_signed, b_signed).startswith("dp4a.")


# ----------------------------------------------------------------------------- ConvInteger


CONV_CASES = [
    ((1, 3, 5, 5), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 5, 4), (6, 2, 2, 3), {"group": 2, "strides": [2, 1], "pads": [0, 1, 1, 0]}),
    ((1, 2, 6, 5), (3, 2, 3, 2), {"dilations": [2, 1], "auto_pad": "SAME_UPPER"}),
    ((2, 5, 7), (3, 5, 3), {"strides": [2], "pads": [2, 1]}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), {"pads": [1, 0, 0, 0, 1, 1]}),
]


@pytest.mark.parametrize("x_dtype, w_dtype", [(np.uint8, np.int8), (np.int8, np.uint8), (np.int8, np.int8),
                                              (np.uint8, np.uint8)])
def test_conv_integer_tactics(rng, x_dtype, w_dtype):
    for x_shape, w_shape, attrs in CONV_CASES:
        x, w = _ints(rng, x_dtype, x_shape), _ints(rng, w_dtype, w_shape)
        x_zp, w_zp = x_dtype(rng.integers(0, 100)), w_dtype(rng.integers(0, 100))
        check_node("ConvInteger", {"x": x, "w": w, "xz": x_zp, "wz": w_zp}, attrs, constants={"w"}, opset=10)
    x, w = _ints(rng, x_dtype, (1, 3, 4, 4)), _ints(rng, w_dtype, (5, 3, 2, 2))  # K = 12: weights by words
    per_channel = _ints(rng, w_dtype, (5,))
    check_node("ConvInteger", {"x": x, "w": w, "xz": x_dtype(9), "wz": per_channel}, constants={"w", "wz"}, opset=10)
    check_node("ConvInteger", {"x": x, "w": w}, opset=10)  # no zero points: no correction terms
    check_node("ConvInteger", {"x": x, "w": w, "xz": None, "wz": per_channel}, opset=10)


def test_conv_integer_offers_both_kernels(registry):
    graph = import_model(single_node_model("ConvInteger", {"x": np.zeros((1, 3, 4, 4), np.uint8),
                                                           "w": np.zeros((2, 3, 3, 3), np.int8)}, opset=10))
    node = graph.nodes[0]
    found = registry.tactics(registry.op(node), node, [graph.info(n) for n in node.inputs], [graph.info("out0")])
    assert [t.name for t in found] == ["direct"] + [c.name for c in TINY_TILES]  # the simulator's order
    ins = [cuda.to_device(np.zeros((1, 3, 4, 4), np.uint8)), cuda.to_device(np.zeros((2, 3, 3, 3), np.int8))]
    out = cuda.device_array((1, 2, 2, 2), np.int32)
    names = [t.launches(ins, [out], None)[0].kernel.py_func.__name__ for t in found[1:]]
    assert not any(n.endswith("_words") for n in names)  # K = 27: weights by bytes
    graph = import_model(single_node_model("ConvInteger", {"x": np.zeros((1, 3, 4, 4), np.uint8),
                                                           "w": np.zeros((2, 3, 2, 2), np.int8)}, opset=10))
    node = graph.nodes[0]
    found = registry.tactics(registry.op(node), node, [graph.info(n) for n in node.inputs], [graph.info("out0")])
    ins[1] = cuda.to_device(np.zeros((2, 3, 2, 2), np.int8))
    out = cuda.device_array((1, 2, 3, 3), np.int32)
    names = [t.launches(ins, [out], None)[0].kernel.py_func.__name__ for t in found[1:]]
    assert all(n.endswith("_words") for n in names)  # K = 12: weights by 4-byte words


@jit(device=True)
def _count(ops, i):
    cuda.atomic.add(ops[2], i, 1)


_REQUANTIZE = device_functions.quantize(np.dtype(np.float32), np.dtype(np.float32), np.dtype(np.int8), True)


@jit(device=True)
def requantize(value, i, ops):
    """Cast -> Mul by a per-element scale -> Relu -> QuantizeLinear(0.5, zero point 3), int8."""
    _count(ops, i)
    return _REQUANTIZE(max(float32(value) * ops[1][i], float32(0)), float32(0.5), np.int8(3))


def _requantize_numpy(acc, scale):
    q = np.rint((np.maximum(acc.astype(np.float32) * scale, 0) / np.float32(0.5)).astype(np.float64)) + 3
    return np.clip(q, -128, 127).astype(np.int8)


def test_conv_integer_tactics_store_what_the_epilogue_returns(rng, registry):
    """Every tactic passes the int32 accumulator to the epilogue once per element and stores
    its int8 result into an int8 output."""
    feeds = {"x": _ints(rng, np.uint8, (2, 3, 5, 4)), "w": _ints(rng, np.int8, (4, 3, 3, 2)), "xz": np.uint8(128),
             "wz": np.arange(4, dtype=np.int8) - 2}
    graph = import_model(single_node_model("ConvInteger", feeds, {"pads": [1, 0, 1, 1]}, {"w", "wz"}, opset=10))
    node = graph.nodes[0]
    acc = prepare(single_node_model("ConvInteger", feeds, {"pads": [1, 0, 1, 1]}, opset=10), "CPU").run(feeds)[0]
    scale = rng.uniform(0.001, 0.01, acc.shape).astype(np.float32)
    epilogue = Epilogue(requantize, len(node.inputs), label="requantize")
    found = registry.tactics(registry.op(node), node, [graph.info(n) for n in node.inputs], [graph.info("out0")],
                             epilogue=epilogue)
    assert len(found) == 1 + len(TINY_TILES)
    env = dict(graph.initializers(), x=feeds["x"], xz=feeds["xz"])
    for tactic in found:
        counts = cuda.to_device(np.zeros(acc.shape, np.int64))
        ins = [cuda.to_device(np.ascontiguousarray(env[n])) for n in node.inputs]
        ins += [cuda.to_device(scale), counts]
        out = cuda.device_array(acc.shape, np.int8)
        for launch in tactic.launches(ins, [out], None):
            PreparedLaunch(launch)(0)
        np.testing.assert_array_equal(counts.copy_to_host(), 1, err_msg=tactic.name)
        np.testing.assert_array_equal(out.copy_to_host(), _requantize_numpy(acc, scale), err_msg=tactic.name)


# ----------------------------------------------------------------------------- fused through the Builder


def _requantized_model(anchor, rng, channels_shape):
    """anchor -> Cast(float) -> Mul(per-channel constant) -> Relu -> QuantizeLinear(int8)."""
    if anchor == "ConvInteger":
        inputs = [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 5, 5])]
        inits = [numpy_helper.from_array(_ints(rng, np.int8, (4, 3, 3, 3)), "w"),
                 numpy_helper.from_array(np.array(128, np.uint8), "xz")]
        node = helper.make_node("ConvInteger", ["x", "w", "xz"], ["acc"], pads=[1, 1, 1, 1], name="conv")
    else:
        inputs = [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 3, 8])]
        inits = [numpy_helper.from_array(_ints(rng, np.int8, (8, 4)), "w"),
                 numpy_helper.from_array(np.array(-2, np.int8), "xz"),
                 numpy_helper.from_array(np.arange(4, dtype=np.int8), "wz")]
        node = helper.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["acc"], name="matmul")
    inits += [numpy_helper.from_array(rng.uniform(1e-4, 1e-3, channels_shape).astype(np.float32), "scale"),
              numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
              numpy_helper.from_array(np.array(-1, np.int8), "yz")]
    nodes = [node, helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["f", "scale"], ["m"], name="rescale"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"], name="quantize")]
    graph = helper.make_graph(nodes, "requantized", inputs, [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("anchor, channels", [("ConvInteger", (1, 4, 1, 1)), ("MatMulInteger", (4,))])
def test_integer_anchor_fuses_a_requantizing_chain(rng, registry, anchor, channels):
    """One layer: the anchor's kernel converts, rescales, activates and quantizes at its store.
    (Needs the core's epilogue fusion to accept a chain that changes dtype after an integer
    anchor.)"""
    model = _requantized_model(anchor, rng, channels)
    engine = Builder(registry).build_engine(model)
    layers = engine.inspect()["layers"]
    assert [layer["op"] for layer in layers] == [f"{anchor}+Cast+Mul+Relu+QuantizeLinear"], layers
    unfused = Builder(registry).build_engine(model, BuilderConfig(fusion=False))
    dtype = np.uint8 if anchor == "ConvInteger" else np.int8
    shape = (1, 3, 5, 5) if anchor == "ConvInteger" else (2, 3, 8)
    for _ in range(2):  # fresh inputs each time
        feeds = {"x": _ints(rng, dtype, shape)}
        want = prepare(model, "CPU").run(feeds)[0]
        assert np.count_nonzero(want != -1) > want.size // 4  # the chain is not all clamped
        for built in (engine, unfused):
            got = built.create_execution_context().execute(feeds)["y"]
            assert got.dtype == np.int8
            np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- QLinearConv, QLinearMatMul


@pytest.fixture
def tiny_matmul_tiles(monkeypatch):
    from plugrt_builtin_ops.matmul import tactics as matmul_tactics

    monkeypatch.setattr(matmul_tactics, "TILE_CONFIGS", ((4, 4, 4, 2, 2),))


def test_qlinear_tactics(rng, tiny_matmul_tiles):
    """Every tactic of both ops (the integer kernels with the requantizing store), with
    constant and runtime scales and zero points."""
    f32 = np.float32
    feeds = {"x": _ints(rng, np.uint8, (1, 3, 5, 4)), "xs": f32(0.02), "xz": np.uint8(128),
             "w": _ints(rng, np.int8, (4, 3, 3, 3)), "ws": rng.uniform(0.01, 0.02, 4).astype(f32), "wz": np.int8(0),
             "ys": f32(0.5), "yz": np.uint8(100), "b": rng.integers(-500, 500, 4).astype(np.int32)}
    check_node("QLinearConv", feeds, {"pads": [1, 1, 1, 1]}, constants={"w", "ws", "b"}, opset=10)
    del feeds["b"]
    check_node("QLinearConv", dict(feeds, ws=f32(0.015)), {"strides": [2, 1]}, opset=10)
    a, b = _ints(rng, np.int8, (2, 3, 5)), _ints(rng, np.int8, (5, 6))
    check_node("QLinearMatMul", {"a": a, "as": f32(0.05), "az": np.int8(-3), "b": b,
                                 "bs": rng.uniform(0.01, 0.03, 6).astype(f32), "bz": np.arange(6, dtype=np.int8),
                                 "ys": f32(0.3), "yz": np.int8(4)}, opset=21)
    f16 = np.float16
    check_node("QLinearMatMul", {"a": a.view(np.uint8), "as": f16(0.05), "az": np.uint8(130), "b": b.view(np.uint8),
                                 "bs": f16(0.02), "bz": np.uint8(120), "ys": f16(0.7), "yz": np.uint8(128)}, opset=21)


def test_qlinear_conv_fuses_the_dequantize_after_it(rng, registry):
    """QLinearConv -> DequantizeLinear -> Relu: one layer, the requantized int8 value
    dequantized and activated in the same store."""
    f32 = np.float32
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in (
        ("xs", f32(0.02)), ("xz", np.uint8(128)), ("w", _ints(rng, np.int8, (4, 3, 3, 3))), ("ws", f32(0.01)),
        ("wz", np.int8(0)), ("ys", f32(0.25)), ("yz", np.int8(-10)), ("b", rng.integers(-300, 300, 4).astype(np.int32)),
        ("ds", f32(0.25)))]
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["q"], pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["q", "ds", "yz"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    engine = Builder(registry).build_engine(model)
    assert [layer["op"] for layer in engine.inspect()["layers"]] == ["QLinearConv+DequantizeLinear+Relu"]
    feeds = {"x": _ints(rng, np.uint8, (1, 3, 4, 4))}
    want = prepare(model, "CPU").run(feeds)[0]
    np.testing.assert_array_equal(engine.create_execution_context().execute(feeds)["y"], want)


# ----------------------------------------------------------------------------- conformance kit and GPU typing


def test_conformance_kit_passes_the_family(registry):
    report = check_plugin("builtin-quant", registry=registry)  # raises ConformanceError naming any failure
    assert report.ok and report.ops() == ["ConvInteger", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                                          "QLinearMatMul", "QuantizeLinear", "plugrt.quant::ConvIntegerNHWC"]


def test_dp4a_assembles_for_sm_90(tmp_path):
    """Numba's typing never reads the asm text: ptxas checks every dp4a variant the
    implicit GEMM emits."""
    import shutil
    import subprocess

    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not installed")
    body = "\n    ".join(dp4a.dp4a_ptx(a, b).replace("$0", "%r1").replace("$1", "%r2").replace("$2", "%r3")
                          .replace("$3", "%r1") for a in (True, False) for b in (True, False))
    source = f"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry probe(.param .u64 out)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    mov.b32 %r1, 7;
    mov.b32 %r2, 16909060;
    mov.b32 %r3, 4294967295;
    {body}
    st.global.u32 [%rd1], %r1;
    ret;
}}
"""
    (tmp_path / "dp4a.ptx").write_text(source)
    proc = subprocess.run([ptxas, "-arch=sm_90", str(tmp_path / "dp4a.ptx"), "-o", str(tmp_path / "dp4a.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + source


def test_kernels_compile_for_the_gpu():
    """The simulator runs no inline PTX and types nothing: compile every kernel of the family
    for sm_90 (dp4a as inline PTX there), float32 quantization free of float64."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt.kernels import no_epilogue
        from plugrt_builtin_ops.quant import conv_integer as ci, device_functions as qd, dynamic as dq, per_axis as pa
        from plugrt_builtin_ops.quant.tactics import TILE_CONFIGS

        q8 = qd.quantize(np.dtype("float32"), np.dtype("float32"), np.dtype("int8"), True)

        @cuda.jit(device=True)
        def requant(v, i, ops):
            return q8(float32(v) * ops[1][i], float32(0.5), np.int8(3))

        plain = no_epilogue(4).fn
        # Every code path once: each signedness with and without zero points on the first
        # tile, the requantizing store on int8 x int8; the other tiles differ in constants only.
        for xs in ("int8", "uint8"):
            for ws in ("int8", "uint8"):
                for out, fn, ops in (("int32", plain, types.Tuple((arr(np.int64),))),
                                     ("int8", requant, types.Tuple((arr(np.int64), arr(np.float32))))):
                    if out == "int8" and (xs, ws) != ("int8", "int8"):
                        continue
                    args = [arr(out), arr(xs), arr(ws), arr(xs), arr(ws), I64, arr(np.int64), arr(np.int64), ops]
                    words = args[:2] + [arr(np.uint32)] + args[3:]
                    first = TILE_CONFIGS[0]
                    for zx, zw in ((False, False), (True, True)):
                        check(f"gemm {first.name} {xs} {ws} {out} {zx} {zw}",
                              ci.gemm_kernel(first, xs == "int8", ws == "int8", zx, zw, fn), args)
                    check(f"gemm {first.name} {xs} {ws} {out} weight words",
                          ci.gemm_kernel(first, xs == "int8", ws == "int8", True, False, fn, w_words=True), words)
                    if (xs, ws, out) == ("int8", "int8", "int32"):
                        for c in TILE_CONFIGS[1:]:
                            check(f"gemm {c.name} {xs} {ws} {out}", ci.gemm_kernel(c, True, True, True, True, fn),
                                  args)
                    check(f"direct {xs} {ws} {out}", ci.direct_kernel(fn), args[:6] + [I64] + args[6:])
        for x, s, t, f32 in (("float32", "float32", "int8", True), ("float16", "float16", "uint8", True),
                             ("int32", "float32", "int16", False)):
            for z in (False, True):
                fn = qd.quantize(np.dtype(x), np.dtype(s), np.dtype(t), z)
                check(f"per_axis q {x} {s} {t} {z}", pa.per_axis_kernel(fn, np.dtype(x), np.dtype(s), z),
                      [arr(t), arr(x), arr(s), arr(t), arr(np.int64)], f32)
        for x, out in (("int8", "float32"), ("uint8", "float16"), ("int32", "float32")):
            fn = qd.dequantize(np.dtype(out), True)
            check(f"per_axis dq {x} {out}", pa.per_axis_kernel(fn, np.dtype(x), np.dtype("float32"), True),
                  [arr(out), arr(x), arr(np.float32), arr(x), arr(np.int64)], True)
        from plugrt_builtin_ops.quant import requantize as rq
        for s_dt, o_dt in (("float32", "int8"), ("float16", "uint8")):
            fn = rq.composed(rq.requantizer(np.dtype(s_dt), np.dtype(o_dt)), plain)
            mine = types.Tuple((arr(np.int64), arr(s_dt), arr(s_dt), arr(s_dt), arr(o_dt), arr(np.int32)))
            check(f"qlinear requantizing store {s_dt} {o_dt}", ci.direct_kernel(fn),
                  [arr(o_dt), arr("uint8"), arr("int8"), arr("uint8"), arr("int8"), I64, I64, arr(np.int64),
                   arr(np.int64), types.Tuple((mine, types.Tuple((arr(np.int64),))))])
        check("range", dq.range_kernel(256), [arr(np.float32), I64, arr(np.float32)], True)
        check("parameters", dq.parameters_kernel(256), [arr(np.float32), I64, arr(np.float32), arr(np.uint8)], True)
        check("dynamic quantize", dq.quantize_kernel(),
              [arr(np.uint8), arr(np.float32), I64, arr(np.float32), arr(np.uint8)], True)
    """)
    assert not failures, "\\n".join(failures)
