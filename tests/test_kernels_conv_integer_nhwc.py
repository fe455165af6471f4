"""``plugrt.quant::ConvIntegerNHWC``: its reference, the direct NHWC integer kernel and the
Hopper ``wgmma`` s8 implicit GEMM (the conv family's NHWC gather, emulated MMAs in the
simulator over one warpgroup of 8 or 16 channels) against a plain NumPy int64
convolution, exactly; which tactics are offered (the wgmma one only for symmetric
operands, one group, C a multiple of 16); split K; the epilogue applied once per output;
an unaligned operand falling back to the direct kernel; the conformance kit."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, int32

from plugrt.device import simulated
from plugrt.kernels import Epilogue
from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.testing import check_plugin, node_tactics, run_tactic, single_node_model
from plugrt_builtin_ops.conv import wgmma_nhwc
from plugrt_builtin_ops.matmul import wgmma
from plugrt_builtin_ops.matmul.wgmma import WgmmaConfig
from plugrt_builtin_ops.quant import nhwc_integer
from plugrt_builtin_ops.quant.nhwc_ops import DOMAIN

from test_kernels_epilogue import _run

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # int32 wrapping in the simulator
I8, U8 = np.int8, np.uint8
#: One warpgroup over 8 or 16 channels in the simulator; on a GPU production-like tiles.
TINY = (WgmmaConfig(1, 8, 3), WgmmaConfig(1, 16, 4)) if simulated() else (WgmmaConfig(1, 64, 3),
                                                                          WgmmaConfig(2, 128, 3))


def sized(x_shape, out_channels):
    """Tiny in the simulator; on a GPU 128 output channels and 8+ pixels along each spatial
    axis, a problem both :data:`TINY` tiles are offered for (narrower ones are pruned)."""
    if simulated():
        return x_shape, out_channels
    return (x_shape[0], *(max(s, 8) for s in x_shape[1:-1]), x_shape[-1]), 128


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(wgmma_nhwc, "SIM_CONFIGS", TINY)
    monkeypatch.setattr(wgmma_nhwc, "GPU_CONFIGS", TINY)
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", TINY)  # (a 1x1's plain GEMM: the matmul family's tiles)


def ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def oracle(x, w, x_zp, w_zp, attrs) -> np.ndarray:
    """``conv(x - x_zp, w - w_zp)`` over NHWC ``x`` and ``[M, k..., C/group]`` ``w`` in
    int64 (padding contributes zero), wrapped to int32."""
    rank = x.ndim - 2
    strides, dilations = attrs.get("strides", [1] * rank), attrs.get("dilations", [1] * rank)
    pads, group = attrs.get("pads", [0] * 2 * rank), attrs.get("group", 1)
    xs = x.astype(np.int64) - (0 if x_zp is None else int(x_zp))
    ws = w.astype(np.int64)
    if w_zp is not None:
        ws = ws - np.asarray(w_zp, np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    xs = np.pad(xs, [(0, 0)] + [(pads[d], pads[d + rank]) for d in range(rank)] + [(0, 0)])
    kernel, cg, m = w.shape[1:-1], w.shape[-1], w.shape[0]
    mg = m // group
    out = [(xs.shape[1 + d] - dilations[d] * (kernel[d] - 1) - 1) // strides[d] + 1 for d in range(rank)]
    y = np.zeros((x.shape[0], *out, m), np.int64)
    for o in np.ndindex(*out):
        for t in np.ndindex(*kernel):
            patch = xs[(slice(None),) + tuple(o[d] * strides[d] + t[d] * dilations[d] for d in range(rank))]
            for g in range(group):
                taps = ws[(slice(g * mg, (g + 1) * mg),) + t]
                y[(slice(None),) + o + (slice(g * mg, (g + 1) * mg),)] += patch[:, g * cg:(g + 1) * cg] @ taps.T
    return y.astype(np.int32)


def nhwc_graph(x, w, attrs, x_zp=None, w_zp=None, constants=("w", "x_zp", "w_zp")):
    feeds = {"x": x, "w": w}
    if x_zp is not None or w_zp is not None:
        feeds["x_zp"] = x_zp if x_zp is not None else np.zeros((), x.dtype)
    if w_zp is not None:
        feeds["w_zp"] = w_zp
    model = single_node_model("ConvIntegerNHWC", feeds, attrs, constants=tuple(c for c in constants if c in feeds),
                              domain=DOMAIN, opset=1)
    graph = import_model(model, registry=default_registry())
    return graph, {k: v for k, v in feeds.items() if k not in constants}


def check_all(graph, tactics, feeds, want):
    assert tactics
    for tactic in tactics:
        got = run_tactic(graph, tactic, feeds)[0]
        assert got.dtype == np.int32 and got.shape == want.shape, tactic.name
        np.testing.assert_array_equal(got, want, err_msg=f"{tactic.name} {tactic.params}")


# ----------------------------------------------------------------------------- the reference and direct kernel

DIRECT_CASES = [
    # uint8 activations with a zero point, padded 3x3
    ((U8, I8), (1, 5, 5, 3), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, U8(128), None),
    # grouped, per-channel weight zero points, strides, dilation, uneven pads
    ((I8, U8), (2, 6, 5, 4), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 0, 2]},
     I8(-3), np.arange(6, dtype=U8) * 40),
    # depthwise
    ((I8, I8), (1, 4, 4, 5), (5, 3, 3, 1), {"group": 5, "pads": [1, 1, 1, 1]}, I8(2), I8(-1)),
    # 1-D and 3-D
    ((I8, I8), (2, 9, 8), (8, 3, 8), {"pads": [1, 1]}, None, None),
    ((U8, U8), (1, 3, 4, 3, 2), (2, 2, 2, 2, 2), {"strides": [1, 2, 1]}, U8(7), U8(9)),
]


@pytest.mark.parametrize("dtypes, x_shape, w_shape, attrs, x_zp, w_zp", DIRECT_CASES)
def test_reference_and_direct_kernel_match_numpy(rng, dtypes, x_shape, w_shape, attrs, x_zp, w_zp):
    x, w = ints(rng, dtypes[0], x_shape), ints(rng, dtypes[1], w_shape)
    graph, feeds = nhwc_graph(x, w, attrs, x_zp, w_zp)
    want = oracle(x, w, x_zp, w_zp, attrs)
    assert tuple(graph.info(graph.outputs[0]).shape) == want.shape
    node = graph.nodes[0]
    args = [x, w] + [graph.info(n).value if n else None for n in node.inputs[2:]]
    np.testing.assert_array_equal(default_registry().op(node).reference(node, args)[0], want)
    tactics = node_tactics(graph, default_registry())
    assert [t.name for t in tactics] == ["direct_nhwc"]  # zero points, groups or C % 16: no wgmma
    check_all(graph, tactics, feeds, want)


# ----------------------------------------------------------------------------- the wgmma implicit GEMM

WGMMA_CASES = [
    # 3x3 pad 1 stride 1: 25 pixels of a 64-row tile, K = 9 * 16 = 144 values (two K tiles, the second ragged)
    ((I8, I8), (1, 5, 5, 16), (8, 3, 3, 16), {"pads": [1, 1, 1, 1]}),
    # stride 2
    ((I8, I8), (1, 5, 5, 16), (8, 3, 3, 16), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    # uint8 activations (u8.s8), 32 channels, 16 out
    ((U8, I8), (1, 5, 5, 32), (16, 3, 3, 32), {"pads": [1, 1, 1, 1]}),
    # 1x1 (s8.u8), two images
    ((I8, U8), (2, 3, 3, 32), (16, 1, 1, 32), {}),
    # 1-D
    ((I8, I8), (1, 9, 16), (8, 3, 16), {"pads": [1, 1]}),
]


@pytest.mark.parametrize("dtypes, x_shape, w_shape, attrs", WGMMA_CASES)
def test_wgmma_nhwc_int8_is_exact(tiny, rng, dtypes, x_shape, w_shape, attrs):
    x_shape, m = sized(x_shape, w_shape[0])
    x, w = ints(rng, dtypes[0], x_shape), ints(rng, dtypes[1], (m, *w_shape[1:]))
    graph, feeds = nhwc_graph(x, w, attrs)
    tactics = node_tactics(graph, default_registry())
    assert tactics[0].name == "direct_nhwc" if simulated() else tactics[-1].name == "direct_nhwc"
    gathered = [t for t in tactics if t.name.startswith("wgmma_nhwc")]
    types = ".".join({I8: "s8", U8: "u8"}[d] for d in dtypes)
    assert {t.params["bn"] for t in gathered} == {c.bn for c in TINY}
    assert all(t.params["operands"] == types and t.params["format"] == "channels_last" for t in gathered)
    check_all(graph, gathered, feeds, oracle(x, w, None, None, attrs))


@pytest.mark.parametrize("dtypes, x_shape, m", [((I8, I8), (2, 4, 4, 32), 16), ((U8, I8), (1, 5, 7, 48), 8)])
def test_a_1x1_also_runs_the_plain_int8_gemm(tiny, rng, dtypes, x_shape, m):
    """A pointwise convolution is X ``[N*H*W, C]`` by W ``[M, C]``: the matmul family's INT8
    wgmma GEMM, first on a GPU, exact."""
    x_shape, m = sized(x_shape, m)
    x, w = ints(rng, dtypes[0], x_shape), ints(rng, dtypes[1], (m, 1, 1, x_shape[-1]))
    graph, feeds = nhwc_graph(x, w, {})
    tactics = node_tactics(graph, default_registry())
    plain = [t for t in tactics if t.name.startswith("gemm_1x1_wgmma")]
    assert plain and all(t.params["format"] == "channels_last" for t in plain)
    if not simulated():
        assert tactics[0] is plain[0]
    check_all(graph, plain, feeds, oracle(x, w, None, None, {}))
    strided, _ = nhwc_graph(x, w, {"strides": [2, 2]})
    assert not any(t.name.startswith("gemm_1x1") for t in node_tactics(strided, default_registry()))


def test_known_zero_zero_points_take_the_wgmma_tactic(tiny, rng):
    x, w = ints(rng, I8, (1, 4, 4, 16)), ints(rng, I8, (8, 3, 3, 16))
    graph, feeds = nhwc_graph(x, w, {"pads": [1, 1, 1, 1]}, I8(0), np.zeros(8, I8))
    gathered = [t for t in node_tactics(graph, default_registry()) if t.name.startswith("wgmma")]
    check_all(graph, gathered, feeds, oracle(x, w, None, None, {"pads": [1, 1, 1, 1]}))


@pytest.mark.parametrize("x_shape, w_shape, attrs, x_zp, w_zp", [
    ((1, 4, 4, 16), (8, 3, 3, 16), {"pads": [1, 1, 1, 1]}, I8(3), None),  # x zero point: padding is not 0
    ((1, 4, 4, 16), (8, 3, 3, 16), {}, None, np.arange(8, dtype=I8)),      # per-channel w zero points
    ((1, 4, 4, 8), (8, 3, 3, 8), {}, None, None),                          # C % 16
    ((1, 4, 4, 32), (8, 3, 3, 16), {"group": 2}, None, None),              # groups
])
def test_wgmma_is_offered_only_for_symmetric_ungrouped_whole_chunks(tiny, rng, x_shape, w_shape, attrs, x_zp, w_zp):
    graph, _ = nhwc_graph(ints(rng, I8, x_shape), ints(rng, I8, w_shape), attrs, x_zp, w_zp)
    assert [t.name for t in node_tactics(graph, default_registry())] == ["direct_nhwc"]


def test_x_zero_point_given_at_run_time_keeps_the_direct_kernel(tiny, rng):
    x, w = ints(rng, U8, (1, 4, 4, 16)), ints(rng, I8, (8, 3, 3, 16))
    graph, feeds = nhwc_graph(x, w, {"pads": [1, 1, 1, 1]}, U8(0), constants=("w",))
    tactics = node_tactics(graph, default_registry())
    assert [t.name for t in tactics] == ["direct_nhwc"]
    feeds["x_zp"] = U8(77)
    check_all(graph, tactics, feeds, oracle(x, w, U8(77), None, {"pads": [1, 1, 1, 1]}))


def test_split_k_sums_int32_partials_once(tiny, rng, monkeypatch):
    """K = 9 * 32 = 288 values, three tiles of 128 split 2 + 1: int32 partial sums in the
    workspace, added up by one reduction."""
    monkeypatch.setattr(nhwc_integer, "choose_splits", lambda meta, bm, bn, bk: 2)
    x, w = ints(rng, I8, (1, 3, 3, 32)), ints(rng, I8, (8, 3, 3, 32))
    graph, feeds = nhwc_graph(x, w, {"pads": [1, 1, 1, 1]})
    split = [t for t in node_tactics(graph, default_registry()) if t.params.get("splits", 1) > 1]
    assert split and all(t.workspace_bytes >= 4 * 2 * 9 * 8 and t.name.endswith("_splitk2") for t in split)
    check_all(graph, split[:1], feeds, oracle(x, w, None, None, {"pads": [1, 1, 1, 1]}))


@cuda.jit(device=True)
def _tripled_plus_residual(v, i, ops):
    """``3 * v + residual[i]`` in int32, counting the calls per output."""
    cuda.atomic.add(ops[2], i, 1)
    return int32(v * 3 + ops[1][i])


def test_the_epilogue_runs_once_per_output(tiny, rng):
    x_shape, m = sized((1, 4, 3, 16), 16)
    x, w = ints(rng, I8, x_shape), ints(rng, I8, (m, 3, 3, 16))
    attrs = {"pads": [1, 1, 1, 1]}
    graph, feeds = nhwc_graph(x, w, attrs)
    node = graph.nodes[0]
    epilogue = Epilogue(_tripled_plus_residual, first=2, label="Mul+Add")
    tactics = default_registry().op(node).tactics(node, [graph.info(n) for n in node.inputs],
                                                  [graph.info(node.outputs[0])], epilogue)
    assert len(tactics) == 1 + len(TINY)
    want = oracle(x, w, None, None, attrs)
    residual = ints(rng, np.int16, want.shape).astype(np.int32)
    want = want * 3 + residual
    for tactic in tactics:
        got, counts = _run(graph, tactic, feeds, [residual])
        np.testing.assert_array_equal(got, want, err_msg=tactic.name)
        assert (counts == 1).all(), tactic.name


def test_unaligned_operands_fall_back_to_the_direct_kernel(tiny, rng):
    from plugrt.kernels import no_epilogue
    from plugrt.launcher import PreparedLaunch

    x, w = ints(rng, I8, (1, 4, 4, 16)), ints(rng, I8, (8, 3, 3, 16))
    graph, _ = nhwc_graph(x, w, {"pads": [1, 1, 1, 1]})
    tactic = next(t for t in node_tactics(graph, default_registry()) if t.name.startswith("wgmma"))
    x_unaligned = cuda.to_device(np.concatenate([np.zeros(1, I8), x.reshape(-1)]))[1:]
    out = cuda.device_array((1, 4, 4, 8), np.int32)
    launches = tactic.launches([x_unaligned, cuda.to_device(w)], [out], None)
    assert [launch.kernel for launch in launches] == [nhwc_integer.direct_kernel(no_epilogue(2).fn)]
    for launch in launches:
        PreparedLaunch(launch)(0)
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), oracle(x, w, None, None, {"pads": [1, 1, 1, 1]}))


def test_kernels_compile_for_the_gpu():
    """sm_90 typing of the production kernels (the simulator does not type them): the
    gathering wgmma INT8 GEMM over each offered tile, whole and ragged, with and without
    K split, storing int32 or a requantized int8; the direct kernel."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32, int32
        from plugrt_builtin_ops.conv import wgmma_nhwc as N
        from plugrt_builtin_ops.matmul.integer_store import Int8Operands
        from plugrt_builtin_ops.matmul.wgmma import wgmma_kernel
        from plugrt_builtin_ops.quant import nhwc_integer

        @cuda.jit(device=True)
        def keep(v, i, ops):
            return v

        @cuda.jit(device=True)
        def requantize(v, i, ops):
            return int32(min(max(float32(v) * ops[1][i % 16], float32(-128)), float32(127)))

        i8, u8, i32, f32, i64 = arr(np.int8), arr(np.uint8), arr(np.int32), arr(np.float32), arr(np.int64)
        zp = types.Tuple((i32, i32, i32, i32, i64))
        for out, fn, ops in ((i32, keep, types.Tuple((i64,))), (i8, requantize, types.Tuple((i64, f32)))):
            args = [out, f32, f32, zp, i32, i64, i64, types.float32, types.float32, I64, I64, ops]
            for index, config in enumerate(N.GPU_CONFIGS):  # each tile's MMA shape; both stores on the first
                for even, split in ((True, False), (False, True)) if index == 0 else ((False, False),):
                    kernel = wgmma_kernel(config, True, True, even, split, fn, False, gather=N.nhwc_gather,
                                          int8=Int8Operands("s8.s8", False))
                    check(f"{config.name} {out} even={even} split={split}", kernel, args)
            kernel = wgmma_kernel(N.GPU_CONFIGS[0], True, True, False, False, fn, False, gather=N.nhwc_gather,
                                  int8=Int8Operands("u8.s8", False))
            check(f"u8.s8 {out}", kernel, args)
            for xs, ws in ((i8, i8), (u8, i8), (i8, u8)):
                check(f"direct {xs} {ws} {out}", nhwc_integer.direct_kernel(fn),
                      [out, xs, ws, xs, ws, I64, I64, i64, i64, ops])
    """)
    assert not failures, "\\n".join(failures)


# ----------------------------------------------------------------------------- GPU only


@pytest.mark.skipif(simulated(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("dtypes, x_shape, w_shape, attrs", [
    ((I8, I8), (2, 56, 56, 64), (64, 3, 3, 64), {"pads": [1, 1, 1, 1]}),
    ((U8, I8), (2, 14, 14, 256), (1024, 1, 1, 256), {}),
    ((I8, I8), (2, 28, 28, 128), (128, 3, 3, 128), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((I8, I8), (3, 7, 7, 512), (512, 3, 3, 512), {"pads": [1, 1, 1, 1]}),  # few tiles: split K
    ((I8, U8), (1, 9, 11, 48), (40, 3, 3, 48), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
])
def test_wgmma_nhwc_int8_on_the_gpu(rng, dtypes, x_shape, w_shape, attrs):
    """Production tiles: the tensor cores against NumPy's int64 convolution, exactly."""
    x, w = ints(rng, dtypes[0], x_shape), ints(rng, dtypes[1], w_shape)
    graph, feeds = nhwc_graph(x, w, attrs)
    tactics = [t for t in node_tactics(graph, default_registry()) if t.name.startswith("wgmma")]
    assert tactics
    want = oracle(x, w, None, None, attrs)
    failures = []
    for tactic in tactics:
        got = run_tactic(graph, tactic, feeds)[0]
        if not np.array_equal(got, want):
            failures.append(f"{tactic.name}: {int(np.sum(got != want))} of {want.size} differ")
    assert not failures, "; ".join(failures)


# ----------------------------------------------------------------------------- the conformance kit


def test_conformance_kit_passes_the_op(registry):
    report = check_plugin("builtin-quant", registry=registry, ops=[f"{DOMAIN}::ConvIntegerNHWC"])
    assert report.ok and report.ops() == [f"{DOMAIN}::ConvIntegerNHWC"]
    assert len(report.results) > 1 + 5  # claims, then every check of every example
