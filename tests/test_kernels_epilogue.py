"""Anchor tactics (Conv, ConvTranspose, Gemm, MatMul, MatMulInteger) apply a fused epilogue.

Each test builds an :class:`~plugrt.kernels.Epilogue` by hand, runs every tactic the plugin
offers with it (and the implicit GEMM with K split and not), and compares the output with
the plugin's reference passed through the same epilogue in NumPy. The epilogues count
their calls per element with an atomic add, so "exactly once per element" is checked
directly, not only through the values.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, float32, int64

from plugrt.launcher import PreparedLaunch
from plugrt import kernels
from plugrt.kernels import Epilogue, broadcast_strides, c_strides, jit
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from plugrt.testing import single_node_model
from plugrt_builtin_ops.conv import implicit_gemm
from plugrt_builtin_ops.matmul import tactics as matmul_tactics, tiled

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {F16: (2e-2, 2e-2), F32: (1e-5, 1e-5), F64: (1e-10, 1e-12)}


# ----------------------------------------------------------------------------- epilogues
#
# Operands: ops[0] is the table, then the epilogue's tensors in order; the last one is
# always an int64 call counter of the output's shape.


@jit(device=True)
def residual_relu(v, i, ops):
    """``max(v + residual, 0) * 2`` with a residual of the output's shape."""
    cuda.atomic.add(ops[2], i, 1)
    return max(v + ops[1][i], 0.0) * 2.0


def residual_relu_numpy(y, residual):
    return np.maximum(y + residual, 0.0) * 2.0


@jit(device=True)
def broadcast_affine(v, i, ops):
    """``v * scale + shift``, scale and shift of one shape broadcast to the output's.

    The table is ``[ndim, *out_shape, *operand_strides]`` (strides 0 along broadcast axes).
    """
    cuda.atomic.add(ops[3], i, 1)
    table = ops[0]
    ndim = table[0]
    rest = i
    offset = int64(0)
    for d in range(ndim - 1, -1, -1):
        size = table[1 + d]
        offset += (rest % size) * table[1 + ndim + d]
        rest //= size
    return v * ops[1][offset] + ops[2][offset]


def broadcast_table(operand_shape, out_shape) -> np.ndarray:
    return np.concatenate([[len(out_shape)], out_shape, broadcast_strides(operand_shape, out_shape)]).astype(np.int64)


@jit(device=True)
def integer_residual(v, i, ops):
    """``v + 3 * residual`` in the integers (MatMulInteger, integer Gemm)."""
    cuda.atomic.add(ops[2], i, 1)
    return v + ops[1][i] * 3


# ----------------------------------------------------------------------------- running


def _node(op_type, feeds, attrs=None, constants=(), opset=17):
    registry = default_registry()
    graph = import_model(single_node_model(op_type, feeds, attrs, constants, opset=opset), registry=registry)
    node = graph.nodes[0]
    ins = [graph.info(n) if n else None for n in node.inputs]
    outs = [graph.info(n) for n in node.outputs]
    return graph, node, registry.op(node), ins, outs


def _reference(graph, feeds):
    runtime = {k: v for k, v in feeds.items() if k in graph.inputs}
    return ReferenceExecutor(graph, default_registry()).run(runtime)[graph.outputs[0]]


def _run(graph, tactic, feeds, operands):
    """Run a tactic with the epilogue's tensors after the node's inputs, as
    :func:`plugrt.testing.run_tactic` does; returns the output and the call counts."""
    node = graph.nodes[0]
    env = dict(graph.initializers())
    env.update(feeds)
    ins = [cuda.to_device(np.ascontiguousarray(env[n])) if n else None for n in node.inputs]
    out_info = graph.info(node.outputs[0])
    shape = tuple(int(d) for d in out_info.shape)
    counts = cuda.to_device(np.zeros(shape, np.int64))
    ins += [cuda.to_device(np.ascontiguousarray(a)) for a in operands] + [counts]
    out = cuda.device_array(shape, dtype=out_info.dtype)
    workspace = cuda.device_array(tactic.workspace_bytes, np.uint8) if tactic.workspace_bytes else None
    for launch in tactic.launches(ins, [out], workspace):
        PreparedLaunch(launch)(0)
    cuda.synchronize()
    return out.copy_to_host(), counts.copy_to_host()


def _check(graph, tactics, feeds, operands, want, label):
    """Run each tactic; its output must equal ``want`` and every element be stored once."""
    assert tactics, label
    dtype = graph.info(graph.outputs[0]).dtype
    for tactic in tactics:
        got, counts = _run(graph, tactic, feeds, operands)
        name = f"{label}, tactic {tactic.name!r} {dict(tactic.params)}"
        assert got.dtype == dtype, name
        np.testing.assert_array_equal(counts, 1, err_msg=f"{name}: epilogue calls per element")
        if tactic.math == "tf32":  # tensor cores: TF32's error, relative to max |want|
            assert np.max(np.abs(got.astype(F64) - want)) <= 5e-3 * max(np.max(np.abs(want)), 1e-6), name
        elif dtype.kind == "f":
            rtol, atol = TOL[dtype.type]
            np.testing.assert_allclose(got.astype(F64), want, rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(got, want.astype(dtype), err_msg=name)
    return [t.name for t in tactics]


def _epilogues(rng, node, out_shape, dtype, channel_shape):
    """The two float epilogues for a node: (epilogue, operands, numpy function) each."""
    first = len(node.inputs)
    residual = rng.standard_normal(out_shape).astype(dtype)
    scale = rng.standard_normal(channel_shape).astype(dtype)
    shift = rng.standard_normal(channel_shape).astype(dtype)
    return [
        (Epilogue(residual_relu, first, label="Add+Relu+Mul"), [residual],
         lambda y: residual_relu_numpy(y, residual.astype(F64))),
        (Epilogue(broadcast_affine, first, broadcast_table(channel_shape, out_shape), label="Mul+Add"), [scale, shift],
         lambda y: y * scale.astype(F64) + shift.astype(F64)),
    ]


def _check_node(rng, op_type, feeds, attrs=None, constants=(), channel_axis=1, extra_tactics=None):
    """Every tactic of the node under both float epilogues (plus ``extra_tactics(epilogue)``)."""
    graph, node, op, ins, outs = _node(op_type, feeds, attrs, constants)
    out_shape = tuple(int(d) for d in outs[0].shape)
    channel_shape = (out_shape[channel_axis],) + (1,) * (len(out_shape) - channel_axis - 1)
    reference = _reference(graph, feeds).astype(F64)
    names = []
    for epilogue, operands, numpy_fn in _epilogues(rng, node, out_shape, outs[0].dtype, channel_shape):
        tactics = op.tactics(node, ins, outs, epilogue=epilogue)
        if extra_tactics is not None:
            tactics += extra_tactics(op, node, ins, outs, epilogue)
        names = _check(graph, tactics, feeds, operands, numpy_fn(reference), f"{op_type} with {epilogue.label}")
    return names


# ----------------------------------------------------------------------------- Conv


def _conv_feeds(rng, op, x_shape, w_shape, group=1, bias=True, dtype=F32):
    feeds = {"x": rng.standard_normal(x_shape).astype(dtype), "w": rng.standard_normal(w_shape).astype(dtype)}
    if bias:
        out_channels = w_shape[0] if op == "Conv" else w_shape[1] * group
        feeds["b"] = rng.standard_normal(out_channels).astype(dtype)
    return feeds


def _forced_splits(*splits):
    """Implicit-GEMM tactics of the node with K split as given (simulator tile)."""
    def make(op, node, ins, outs, epilogue):
        geo = op._kernel_geometry(node, ins, outs)
        return [implicit_gemm.gemm_tactic(geo, ins[0].dtype, config=implicit_gemm.SIM_CONFIG, splits=s,
                                              epilogue=epilogue) for s in splits]
    return make


@pytest.mark.parametrize("bias", [True, False])
def test_conv_2d_every_tactic(rng, bias):
    feeds = _conv_feeds(rng, "Conv", (2, 8, 4, 3), (8, 8, 3, 2), bias=bias)
    names = _check_node(rng, "Conv", feeds, dict(pads=[1, 0, 1, 1], strides=[1, 1]), constants=("w", "b"),
                        extra_tactics=_forced_splits(1, 3))
    gemm = [n for n in names if n.startswith("implicit_gemm_")]
    assert names[-4:-2] == ["direct2d", "direct"] and names[0] in gemm and len(gemm) == len(names) - 2
    assert names[-2:] == ["implicit_gemm_16x16x8_2x2", "implicit_gemm_16x16x8_2x2_splitk"]


def test_conv_split_k_applies_the_epilogue_once(rng):
    """The split tactic's GEMM kernel writes partial sums; only ``split_sum`` applies it."""
    feeds = _conv_feeds(rng, "Conv", (1, 8, 5, 4), (6, 4, 3, 3), group=2)
    graph, node, op, ins, outs = _node("Conv", feeds, dict(group=2, pads=[1, 1, 0, 1]), ("w", "b"))
    (split,) = _forced_splits(4)(op, node, ins, outs, Epilogue(residual_relu, 3))
    assert split.params["splits"] > 1 and split.workspace_bytes > 0
    _check_node(rng, "Conv", feeds, dict(group=2, pads=[1, 1, 0, 1]), constants=("w", "b"),
                extra_tactics=_forced_splits(1, 4))


def test_conv_depthwise_1d_and_3d(rng):
    feeds = _conv_feeds(rng, "Conv", (1, 4, 5, 5), (4, 1, 3, 3), group=4)
    assert _check_node(rng, "Conv", feeds, dict(group=4, strides=[2, 1], pads=[1, 1, 1, 1]),
                       constants=("w", "b"))[0] == "depthwise_w4"
    feeds = _conv_feeds(rng, "Conv", (2, 4, 9), (4, 2, 3), group=2)
    _check_node(rng, "Conv", feeds, dict(group=2, strides=[2], dilations=[2], pads=[2, 1]),
                constants=("w", "b"), extra_tactics=_forced_splits(1, 2))
    feeds = _conv_feeds(rng, "Conv", (1, 2, 3, 4, 3), (3, 2, 2, 2, 2))
    assert _check_node(rng, "Conv", feeds, dict(auto_pad="SAME_UPPER"), constants=("w",)) == ["direct"]


@pytest.mark.parametrize("dtype", [F16, F64])
def test_conv_dtypes(rng, dtype):
    feeds = _conv_feeds(rng, "Conv", (1, 4, 4, 4), (4, 2, 3, 3), group=2, dtype=dtype)
    _check_node(rng, "Conv", feeds, dict(group=2, pads=[1, 0, 0, 1]), constants=("w", "b"))


def test_conv_runtime_weights(rng):
    feeds = _conv_feeds(rng, "Conv", (1, 3, 4, 4), (2, 3, 2, 2))
    _check_node(rng, "Conv", feeds, dict(strides=[2, 1]))


# ----------------------------------------------------------------------------- ConvTranspose


@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_2d(rng, bias):
    feeds = _conv_feeds(rng, "ConvTranspose", (1, 4, 3, 2), (4, 1, 3, 2), group=2, bias=bias)
    names = _check_node(rng, "ConvTranspose", feeds, dict(group=2, strides=[2, 1], output_padding=[1, 0]),
                        constants=("w", "b"))
    assert names == ["direct2d", "direct"]


def test_conv_transpose_1d_and_3d(rng):
    feeds = _conv_feeds(rng, "ConvTranspose", (2, 3, 4), (3, 2, 3))
    _check_node(rng, "ConvTranspose", feeds, dict(strides=[2], pads=[1, 0]), constants=("w", "b"))
    feeds = _conv_feeds(rng, "ConvTranspose", (1, 2, 2, 2, 2), (2, 1, 2, 2, 2))
    assert _check_node(rng, "ConvTranspose", feeds, dict(strides=[2, 1, 2]), constants=("w", "b")) == ["direct"]


# ----------------------------------------------------------------------------- MatMul and Gemm


@pytest.fixture(autouse=True)
def tiny_tiles(monkeypatch):
    """Two tiled configurations small enough for the simulator (one leaves threads idle)."""
    monkeypatch.setattr(matmul_tactics, "TILE_CONFIGS", ((4, 4, 2, 2, 2), (3, 4, 2, 1, 2)))


def _rand(rng, shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("a_shape, b_shape, channel_axis", [
    ((5, 6), (6, 7), 1),           # per column
    ((2, 3, 4), (2, 4, 5), 1),     # batched, per row
    ((2, 3, 4), (4, 5), 2),        # A's batch folded into M, per column
    ((2, 1, 3, 4), (3, 4, 2), 0),  # broadcast batch, per outer batch item
])
def test_matmul(rng, a_shape, b_shape, channel_axis):
    names = _check_node(rng, "MatMul", {"a": _rand(rng, a_shape), "b": _rand(rng, b_shape)},
                        channel_axis=channel_axis)
    # (on a Hopper GPU the wgmma tiles' ragged twins too, offered at every size)
    assert "direct" in names and len([n for n in names if not n.endswith("_ragged")]) == 3, names


@pytest.mark.parametrize("dtype", [F16, F64])
def test_matmul_dtypes(rng, dtype):
    _check_node(rng, "MatMul", {"a": _rand(rng, (2, 3, 5), dtype), "w": _rand(rng, (5, 4), dtype)},
                constants=("w",), channel_axis=2)


@pytest.mark.parametrize("c_shape", [None, (5,), (3, 1)])
@pytest.mark.parametrize("trans", [(0, 0), (1, 1)])
def test_gemm(rng, trans, c_shape):
    ta, tb = trans
    m, k, n = 3, 4, 5
    feeds = {"a": _rand(rng, (k, m) if ta else (m, k)), "b": _rand(rng, (n, k) if tb else (k, n))}
    if c_shape is not None:
        feeds["c"] = _rand(rng, c_shape)
    _check_node(rng, "Gemm", feeds, {"alpha": 0.75, "beta": -1.5, "transA": ta, "transB": tb})


def test_gemm_beta_zero_and_transposed_weight(rng):
    """C given but unused (beta 0) still counts among the node's inputs."""
    feeds = {"a": _rand(rng, (3, 2)), "w": _rand(rng, (4, 2)), "c": _rand(rng, (4,))}
    _check_node(rng, "Gemm", feeds, {"beta": 0.0, "transB": 1}, constants=("w", "c"), channel_axis=0)


def _check_integer(rng, op_type, feeds, attrs=None, opset=17):
    graph, node, op, ins, outs = _node(op_type, feeds, attrs, opset=opset)
    out_shape = tuple(int(d) for d in outs[0].shape)
    residual = rng.integers(-50, 50, out_shape).astype(outs[0].dtype)
    epilogue = Epilogue(integer_residual, len(node.inputs), label="Add")
    want = _reference(graph, feeds).astype(np.int64) + 3 * residual.astype(np.int64)
    return _check(graph, op.tactics(node, ins, outs, epilogue=epilogue), feeds, [residual], want,
                  f"{op_type} with {epilogue.label}")


@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (2.5, -0.5)])
def test_gemm_integer(rng, alpha, beta):
    """Integer Gemm's value is what the store would write: float scalings truncated."""
    feeds = {"a": rng.integers(-8, 9, (3, 4)).astype(np.int64), "b": rng.integers(-8, 9, (4, 5)).astype(np.int64),
             "c": rng.integers(-8, 9, (5,)).astype(np.int64)}
    _check_integer(rng, "Gemm", feeds, {"alpha": alpha, "beta": beta})


# ----------------------------------------------------------------------------- vector stores


_load8, _store8 = kernels.vector8()


@jit(device=True)
def residual_relu_vector(v, i, ops):
    """:func:`residual_relu` for eight elements, the residual read by :func:`vector8`."""
    for k in range(8):
        cuda.atomic.add(ops[2], i + k, 1)
    r = _load8(ops[1], i)
    return (max(v[0] + r[0], 0.0) * 2.0, max(v[1] + r[1], 0.0) * 2.0, max(v[2] + r[2], 0.0) * 2.0,
            max(v[3] + r[3], 0.0) * 2.0, max(v[4] + r[4], 0.0) * 2.0, max(v[5] + r[5], 0.0) * 2.0,
            max(v[6] + r[6], 0.0) * 2.0, max(v[7] + r[7], 0.0) * 2.0)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("op_type, shapes, attrs", [
    ("MatMul", {"a": (5, 12), "b": (12, 16)}, {}),                     # guarded rows, N = 16
    ("MatMul", {"a": (2, 4, 12), "b": (2, 12, 8)}, {}),                # batched
    ("Gemm", {"a": (5, 12), "b": (16, 12), "c": (16,)}, {"alpha": 0.5, "beta": 2.0, "transB": 1}),  # C per column
])
def test_vector_store_applies_the_epilogue_once(rng, monkeypatch, dtype, op_type, shapes, attrs):
    """Where N is a multiple of 8 and the arrays are aligned, the GEMM kernels store eight
    columns at a time through the epilogue's vector form, K split or not: the same values,
    every element stored once; a misaligned operand takes the scalar store. (The SIMT and
    TF32 kernels share the store with the FP16 ones, which need a GPU; float16 runs through
    the SIMT kernel, which reads any float operand.)"""
    from plugrt_builtin_ops.matmul import plan as mplan, simt, tf32, wgmma

    if dtype == F16 and op_type == "Gemm":
        pytest.skip("float16 through the SIMT kernel directly: MatMul's plan only")
    monkeypatch.setattr(simt, "SIMT_CONFIGS", (simt.SimtConfig(8, 8, 4, 4, 4),))
    monkeypatch.setattr(tf32, "TF32_CONFIGS", (tf32.Tf32Config(1, 1, 1, 1, 8),))
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", ())
    monkeypatch.setattr(simt, "MIN_KTILES_PER_SPLIT", 1)
    feeds = {k: _rand(rng, v, dtype) for k, v in shapes.items()}
    graph, node, op, ins, outs = _node(op_type, feeds, attrs)
    out_shape = tuple(int(d) for d in outs[0].shape)
    residual = rng.standard_normal(out_shape).astype(outs[0].dtype)
    want = residual_relu_numpy(_reference(graph, feeds).astype(F64), residual.astype(F64))
    epilogue = Epilogue(residual_relu, len(node.inputs), label="Add+Relu+Mul", vector=residual_relu_vector,
                        vector_operands=(0,))

    def tactics_of(splits):
        if dtype == F16:
            meta, offs = mplan.product_plan(shapes["a"], shapes["b"])
            return [simt.simt_tactic(simt.SIMT_CONFIGS[0], meta, offs, epilogue=epilogue, splits=splits)]
        monkeypatch.setattr(simt, "choose_splits", lambda meta, bm, bn, bk: splits)
        monkeypatch.setattr(tf32, "choose_splits", lambda meta, bm, bn, bk: splits)
        return [t for t in op.tactics(node, ins, outs, epilogue=epilogue) if t.name.startswith(("simt", "tf32"))]

    tactics = tactics_of(1) + tactics_of(2)
    names = _check(graph, tactics, feeds, [residual], want, f"{op_type} vector store")
    assert any("splitk" in n for n in names) and any("splitk" not in n for n in names), names
    # The vector kernels are the ones launched; a misaligned residual takes the scalar store.
    env = dict(graph.initializers(), **feeds)
    dev = [cuda.to_device(np.ascontiguousarray(env[n])) for n in node.inputs]
    counts = cuda.to_device(np.zeros(out_shape, np.int64))
    out = cuda.device_array(out_shape, dtype=outs[0].dtype)
    padded = cuda.to_device(np.concatenate([[0], residual.reshape(-1)]).astype(residual.dtype))
    for operand, vector in ((cuda.to_device(residual), True), (padded[1:], False)):
        assert epilogue.vector_ready(dev + [operand, counts], out) == vector
        for tactic in tactics:
            workspace = cuda.device_array(max(tactic.workspace_bytes, 1), np.uint8)
            for launch in tactic.launches(dev + [operand, counts], [out], workspace):
                inner = [getattr(c.cell_contents, "py_func", None) for c in launch.kernel.py_func.__closure__ or ()]
                names = " ".join(getattr(f, "__qualname__", "") for f in inner)
                assert ("_vector_" in names or "residual_relu_vector" in names) == vector, (tactic.name, names)


# ----------------------------------------------------------------------------- MatMulInteger


def _int8s(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape, dtype=dtype)


@pytest.mark.parametrize("zero_points", [True, False])
def test_matmul_integer(rng, zero_points):
    """The epilogue gets the int32 accumulator; zero points are the node's, the residual the epilogue's."""
    feeds = {"a": _int8s(rng, np.uint8, (2, 3, 5)), "b": _int8s(rng, np.int8, (5, 4))}
    if zero_points:
        feeds.update(azp=_int8s(rng, np.uint8, (3,)), bzp=_int8s(rng, np.int8, (4,)))
    _check_integer(rng, "MatMulInteger", feeds, opset=10)


# ----------------------------------------------------------------------------- kernel cache


def test_kernels_are_compiled_per_epilogue_function():
    from plugrt_builtin_ops.conv import direct

    same = direct.direct_kernel(float32, False, residual_relu)
    assert direct.direct_kernel(float32, False, residual_relu) is same
    assert direct.direct_kernel(float32, False, broadcast_affine) is not same
    kernel = tiled.tiled_kernel(np.dtype(F32), np.dtype(F32), np.dtype(F32), False, 4, 4, 2, 2, 2, residual_relu)
    assert tiled.tiled_kernel(np.dtype(F32), np.dtype(F32), np.dtype(F32), False, 4, 4, 2, 2, 2,
                              residual_relu) is kernel


# ----------------------------------------------------------------------------- GPU typing


def test_epilogue_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile anchor kernels with a tuple epilogue
    argument for sm_90 (float32 kernels must stay free of float64 arithmetic)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt_builtin_ops.conv import direct as ck, geometry as cgeo, implicit_gemm as cg
        from plugrt_builtin_ops.matmul import plan as mplan, tiled as mk

        @cuda.jit(device=True)
        def epi(v, i, ops):
            cuda.atomic.add(ops[2], i, 1)
            return max(v + ops[1][i], float32(0)) * float32(2)

        @cuda.jit(device=True)
        def epi_int(v, i, ops):
            return v + ops[1][i] * 3

        def operands(dt):
            return types.Tuple((arr(np.int64), arr(dt), arr(np.int64)))

        for dt in ("float16", "float32", "float64"):
            acc = cgeo.compute_type(dt)
            conv = [arr(dt), arr(dt), arr(dt), arr(dt), I64, I64, arr(np.int64), operands(dt)]
            for transposed in (False, True):
                check(f"conv direct {dt} t={transposed}", ck.direct_kernel(acc, transposed, epi), conv,
                      dt != "float64")
                check(f"conv direct2d {dt} t={transposed}", ck.direct2d_kernel(acc, transposed, epi), conv,
                      dt != "float64")
        for dt in ("float16", "float32"):
            gemm = [arr(dt), arr(dt), arr(dt), arr(dt), arr(np.float32), arr(np.int64), arr(np.int64), operands(dt)]
            check(f"conv implicit gemm {dt}", cg.gemm_kernel(16, 16, 8, 2, 2, epi), gemm, True)
            check(f"conv split_sum {dt}", cg.split_sum_kernel(epi),
                  [arr(dt), arr(np.float32), arr(dt), I64, I64, I64, I64, I64, operands(dt)], True)
        for dt in ("float16", "float32", "float64"):
            d = np.dtype(dt)
            scale = scalar(mplan.scaling_type(d))
            args = [arr(dt)] * 6 + [arr(np.int64), arr(np.int64), scale, scale, operands(dt)]
            check(f"matmul tiled {dt}", mk.tiled_kernel(d, d, d, False, 64, 64, 16, 4, 4, epi), args, dt != "float64")
            check(f"matmul direct {dt}", mk.direct_kernel(d, d, d, False, epi), args, dt != "float64")
        for a_dt, out_dt, zp in (("int64", "int64", False), ("uint8", "int32", True)):
            a, o = np.dtype(a_dt), np.dtype(out_dt)
            f64 = scalar(np.float64)
            args = [arr(o), arr(a), arr(a), arr(o), arr(a), arr(a), arr(np.int64), arr(np.int64), f64, f64,
                    types.Tuple((arr(np.int64), arr(o), arr(np.int64)))]
            check(f"matmul tiled {a_dt}->{out_dt}", mk.tiled_kernel(a, a, o, zp, 64, 64, 16, 4, 4, epi_int), args)
            check(f"matmul direct {a_dt}->{out_dt}", mk.direct_kernel(a, a, o, zp, epi_int), args)
    """)
    assert not failures, "\n".join(failures)
