"""The channels-last convolution ``plugrt.conv::ConvNHWC``: in the simulator one
warpgroup over 8 channels with the MMAs emulated checks the wgmma implicit GEMM's NHWC
gather (padding, strides, dilations, 1-D, ragged pixels and K, K split, the bias and the
epilogue) in FP16 and TF32, and the plain kernel (groups too), against Conv's reference;
on a GPU the production tiles run ResNet-like layers."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.device import simulated
from plugrt.kernels import Epilogue
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from plugrt.testing import node_tactics, run_tactic, single_node_model
from plugrt_builtin_ops.conv import wgmma_nhwc
from plugrt_builtin_ops.matmul.wgmma import WgmmaConfig

from test_kernels_epilogue import _run, residual_relu, residual_relu_numpy

#: One warpgroup over 8 channels in the simulator; on a GPU tiles known right there.
TINY = (WgmmaConfig(1, 8, 3),) if simulated() else (WgmmaConfig(1, 64, 3), WgmmaConfig(2, 128, 3))
TOL = {np.float32: 5e-3, np.float16: 1e-2}


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(wgmma_nhwc, "SIM_CONFIGS", TINY)
    monkeypatch.setattr(wgmma_nhwc, "GPU_CONFIGS", TINY)


def nhwc_graph(rng, x_shape, w_shape, attrs, dtype, bias=True):
    """A one-node ConvNHWC model; X ``[N, spatial..., C]``, W ``[M, k..., C/group]``."""
    fan_in = np.prod(w_shape[1:])
    feeds = {"x": rng.standard_normal(x_shape).astype(dtype),
             "w": (rng.standard_normal(w_shape) / np.sqrt(fan_in)).astype(dtype)}
    if bias:
        feeds["b"] = rng.standard_normal(w_shape[0]).astype(dtype)
    model = single_node_model("ConvNHWC", feeds, attrs, constants=("w", "b"), domain="plugrt.conv", opset=1)
    return import_model(model, registry=default_registry()), feeds


def nchw_reference(feeds, attrs):
    """Conv's reference (another op) on the tensors moved to NCHW, moved back."""
    conv = default_registry().find_op("", "Conv", 17)

    class Node:
        pass

    node = Node()
    node.attrs = {"auto_pad": "NOTSET", "group": 1, "strides": None, "dilations": None, "pads": None,
                  "kernel_shape": None, **attrs}
    node.describe = lambda: "Conv"
    x, w = (np.moveaxis(feeds[k], -1, 1) for k in ("x", "w"))
    return np.moveaxis(conv.reference(node, [x, w, feeds.get("b")])[0], 1, -1)


def close(got, want, dtype, label):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-6)
    err = float(np.max(np.abs(got - want)))
    assert err <= TOL[dtype] * scale, f"{label}: max error {err:.3g} > {TOL[dtype]} * {scale:.3g}"


def tactics_named(graph, prefix):
    return [t for t in node_tactics(graph, default_registry()) if t.name.startswith(prefix)]


CASES = [
    # 3x3, pad 1: 16 pixels of a 64-row tile; FP16 K = 9 * 8 = 72 halves (two tiles, the second ragged)
    ((1, 4, 4, 8), (16, 3, 3, 8), {"pads": [1, 1, 1, 1]}),
    # stride 2, uneven pads, ragged pixels
    ((1, 7, 5, 8), (8, 3, 3, 8), {"pads": [1, 0, 0, 1], "strides": [2, 2]}),
    # dilation, no padding, several K tiles around the ring (K = 16 * 9 = 144)
    ((1, 7, 7, 16), (8, 3, 3, 16), {"dilations": [2, 2]}),
    # two images, 1x1 (also a plain GEMM)
    ((2, 3, 3, 16), (24, 1, 1, 16), {}),
    # 1-D
    ((2, 9, 8), (8, 3, 8), {"pads": [1, 1]}),
]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("x_shape, w_shape, attrs", CASES)
def test_wgmma_nhwc_tactics_match_the_reference(tiny, rng, dtype, x_shape, w_shape, attrs):
    graph, feeds = nhwc_graph(rng, x_shape, w_shape, attrs, dtype)
    tactics = tactics_named(graph, "wgmma_nhwc")
    assert tactics and all(t.params["bn"] in {c.bn for c in TINY} for t in tactics)
    want = nchw_reference(feeds, attrs)
    reference = ReferenceExecutor(graph, default_registry()).run({"x": feeds["x"]})[graph.outputs[0]]
    close(reference, want, dtype, "ConvNHWC's reference")
    for tactic in tactics:
        close(run_tactic(graph, tactic, {"x": feeds["x"]})[0], want, dtype, tactic.name)


def test_a_small_output_splits_k_and_sums_once(tiny, rng, monkeypatch):
    from plugrt_builtin_ops.matmul import simt

    monkeypatch.setattr(simt, "choose_splits", lambda meta, bm, bn, bk: 3)
    monkeypatch.setattr(wgmma_nhwc, "choose_splits", lambda meta, bm, bn, bk: 3)
    attrs = {"pads": [1, 1, 1, 1]}
    graph, feeds = nhwc_graph(rng, (1, 3, 3, 32), (8, 3, 3, 32), attrs, np.float16)
    split = [t for t in tactics_named(graph, "wgmma_nhwc") if t.params["splits"] > 1]
    assert split and split[0].workspace_bytes > 0
    close(run_tactic(graph, split[0], {"x": feeds["x"]})[0], nchw_reference(feeds, attrs), np.float16, split[0].name)


def test_the_epilogue_is_applied_once_per_output(tiny, rng):
    graph, feeds = nhwc_graph(rng, (1, 4, 3, 8), (8, 3, 3, 8), {"pads": [1, 1, 1, 1]}, np.float32, bias=True)
    from numba import cuda as ncuda

    fn = ncuda.jit(device=True)(residual_relu)
    epilogue = Epilogue(fn, first=3, label="Add+Relu")
    node = graph.nodes[0]
    op = default_registry().op(node)
    ins = [graph.info(n) for n in node.inputs]
    tactics = [t for t in op.tactics(node, ins, [graph.info(node.outputs[0])], epilogue) if t.name.startswith("wgmma")]
    assert tactics
    residual = rng.standard_normal((1, 4, 3, 8)).astype(np.float32)
    want = residual_relu_numpy(nchw_reference(feeds, {"pads": [1, 1, 1, 1]}), residual)
    for tactic in tactics:
        got, counts = _run(graph, tactic, {"x": feeds["x"]}, [residual])
        close(got, want, np.float32, tactic.name)
        assert (counts == 1).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_plain_kernel_takes_groups_and_odd_channels(rng, dtype):
    attrs = {"group": 3, "strides": [2, 1], "pads": [0, 1, 1, 0]}
    graph, feeds = nhwc_graph(rng, (2, 5, 4, 6), (9, 2, 3, 2), attrs, dtype)
    tactics = node_tactics(graph, default_registry())
    assert [t.name for t in tactics] == ["direct_nhwc"]
    close(run_tactic(graph, tactics[0], {"x": feeds["x"]})[0], nchw_reference(feeds, attrs), dtype, "direct_nhwc")


# ----------------------------------------------------------------------------- GPU only


@pytest.mark.skipif(simulated(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 56, 56, 64), (64, 3, 3, 64), {"pads": [1, 1, 1, 1]}),
    ((2, 14, 14, 256), (1024, 1, 1, 256), {}),
    ((2, 28, 28, 128), (128, 3, 3, 128), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((3, 7, 7, 512), (512, 3, 3, 512), {"pads": [1, 1, 1, 1]}),
    ((1, 9, 11, 24), (40, 3, 3, 24), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
])
def test_wgmma_nhwc_on_the_gpu(rng, dtype, x_shape, w_shape, attrs):
    graph, feeds = nhwc_graph(rng, x_shape, w_shape, attrs, dtype)
    tactics = [t for t in node_tactics(graph, default_registry()) if t.name != "direct_nhwc"]
    assert tactics
    want = nchw_reference(feeds, attrs)
    failures = []
    for tactic in tactics:
        try:
            close(run_tactic(graph, tactic, {"x": feeds["x"]})[0], want, dtype, tactic.name)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "; ".join(failures)


def test_nhwc_kernels_compile_for_the_gpu():
    """sm_90 typing of the production kernels (the simulator does not type them): the
    gathering wgmma GEMM in FP16 and TF32 with a residual epilogue, whole and ragged
    tiles, with and without K split; the plain kernel; the first layers' im2col."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt_builtin_ops.conv import wgmma_nhwc as N
        from plugrt_builtin_ops.matmul.wgmma import wgmma_kernel

        @cuda.jit(device=True)
        def epi(v, i, ops):
            return max(v + float32(ops[1][i]), float32(0))

        f16, f32, i64 = arr(np.float16), arr(np.float32), arr(np.int64)
        for half, out in ((True, f16), (False, f32)):
            args = [out, f32, f32, out, f32, i64, i64, types.float32, types.float32, types.int64, types.int64,
                    types.Tuple((i64, out))]
            for index, config in enumerate(N.GPU_CONFIGS):  # each tile's MMA shape; both stores on the first
                for even, split in ((True, False), (False, True)) if index == 0 else ((False, False),):
                    kernel = wgmma_kernel(config, True, True, even, split, epi, False, half, N.nhwc_gather)
                    check(f"{config.name} half={half} even={even} split={split}", kernel, args, True)
            from plugrt.kernels import vector8
            load8 = vector8()[0]

            @cuda.jit(device=True)
            def vepi(v, i, ops):  # the vector form, reading the residual by vectors
                r = load8(ops[1], i)
                return (max(v[0] + r[0], float32(0)), v[1] + r[1], v[2] + r[2], v[3] + r[3], v[4] + r[4],
                        v[5] + r[5], v[6] + r[6], v[7] + r[7])

            for even, split in ((True, False), (False, True)):
                kernel = wgmma_kernel(N.GPU_CONFIGS[0], True, True, even, split, epi, False, half, N.nhwc_gather, vepi)
                check(f"vector store half={half} even={even} split={split}", kernel, args, True)
        for dt in (f16, f32):
            check(f"direct_nhwc {dt}", N.direct_nhwc_kernel(float32, epi),
                  [dt, dt, dt, dt, types.int64, types.int64, i64, types.Tuple((i64, dt))], True)
            from plugrt_builtin_ops.conv.im2col import im2col_kernel
            check(f"im2col {dt}", im2col_kernel(), [dt, dt, i64, types.int64], True)
    """)
    assert not failures, "\\n".join(failures)


def test_tile_order_follows_channels_and_k_depth(monkeypatch):
    """The tuner times only the first few tactics: tiles no wider than the layer, shallow
    rings first for a short K (the stem, 3x3 over 64 channels), deep ones for a long K."""
    monkeypatch.setattr(wgmma_nhwc, "configs", lambda: wgmma_nhwc.GPU_CONFIGS)
    stem = wgmma_nhwc.config_order(64, 7)
    assert stem and all(c.bn == 64 for c in stem) and stem[0].stages == 3 and stem[-1].stages > 3
    assert stem[0].min_blocks == 2 and stem[0].name.endswith("_s3_b2"), stem  # two blocks an SM lead a short K
    wide = wgmma_nhwc.config_order(128, 18)
    assert wide[0].bn == 128 and wide[0].stages > 3 and all(c.bn <= 128 for c in wide)
    assert wide[-1].min_blocks == 2 and wide[-1].stages == 3, wide  # ... and trail a long one
    assert all(c.bn >= 128 for c in wgmma_nhwc.config_order(512, 72))
    assert {c.name for c in wgmma_nhwc.config_order(100, 3)} == {c.name for c in wgmma_nhwc.GPU_CONFIGS if c.bn <= 64}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("x_shape, w_shape, attrs, used, bias", [
    # a stem: 3 real channels of 8, 3x3 stride 2, uneven pads, ragged pixels (K 27 -> 32 of 72)
    ((2, 7, 6, 8), (16, 3, 3, 8), {"pads": [1, 0, 1, 1], "strides": [2, 2]}, 3, True),
    # grayscale: 1 real channel of 8, 5x5 with dilation (K 25 -> 32 of 200), no bias
    ((1, 9, 8, 8), (8, 5, 5, 8), {"pads": [2, 2, 2, 2], "dilations": [1, 2]}, 1, False),
])
def test_a_first_layer_runs_as_an_explicit_im2col_and_gemm(rng, dtype, x_shape, w_shape, attrs, used, bias):
    """A ConvNHWC whose weight is zero on the padded channels gets the im2col tactic
    (:mod:`plugrt_builtin_ops.conv.im2col`): K packed without them, then a GEMM with the
    bias at its store; it matches Conv's reference whatever the padded input channels
    hold (random here, as they never count)."""
    graph, feeds = nhwc_graph(rng, x_shape, w_shape, attrs, dtype, bias=bias)
    feeds["w"][..., used:] = 0
    model = single_node_model("ConvNHWC", feeds, attrs, constants=("w", "b"), domain="plugrt.conv", opset=1)
    graph = import_model(model, registry=default_registry())
    packed = tactics_named(graph, "im2col_")
    assert packed, [t.name for t in node_tactics(graph, default_registry())]
    real = w_shape[1] * w_shape[2] * used
    assert packed[0].params["packed_k"] == real + (-real % 8)
    want = nchw_reference(feeds, attrs)
    for tactic in packed:
        close(run_tactic(graph, tactic, {"x": feeds["x"]})[0], want, dtype, tactic.name)


def test_im2col_is_not_offered_where_every_channel_counts(rng):
    graph, _ = nhwc_graph(rng, (1, 5, 5, 8), (8, 3, 3, 8), {"pads": [1, 1, 1, 1]}, np.float16)
    assert not tactics_named(graph, "im2col_")
    from plugrt_builtin_ops.conv.im2col import used_channels
    w = np.zeros((4, 3, 3, 8))
    w[1, 2, 0, 5] = 1
    assert used_channels(w) == 6 and used_channels(None) is None


def test_a_1x1_with_one_k_tile_leads_with_a_shallow_ring(monkeypatch):
    """A bottleneck's first 1x1 (64 -> 256 channels: K is one FP16 tile) runs as a plain
    GEMM on :func:`config_order`'s tiles: a 3-stage ring first (two blocks an SM), the
    deep ones after; a long K (1024 channels) keeps the deep rings first."""
    from plugrt.kernels import no_epilogue
    from plugrt_builtin_ops.conv.geometry import ConvGeometry

    monkeypatch.setattr(wgmma_nhwc, "configs", lambda: wgmma_nhwc.GPU_CONFIGS)

    def plain(cin, cout):
        geo = ConvGeometry(32, cin, cout, 1, (14, 14), (1, 1), (14, 14), (1, 1), (1, 1), (0, 0))
        tactics = wgmma_nhwc._plain_gemm(geo, np.dtype(np.float16), no_epilogue(3), True, None)
        return [t.name for t in tactics if not t.name.endswith("_ragged")]

    short, long = plain(64, 256), plain(1024, 256)
    assert short[0].endswith("_s3_b2") and short[1].endswith("_s3"), short
    assert any(name.endswith(("_s4", "_s5")) for name in short[:3]), short  # the tuner's three: the deep one too
    assert not long[0].endswith("_s3"), long
