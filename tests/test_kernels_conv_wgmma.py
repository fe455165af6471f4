"""The Hopper ``wgmma`` implicit-GEMM Conv (TF32): in the simulator one warpgroup over 8
output pixels with the MMAs emulated checks the im2col copies (padding, strides,
dilations, groups, 1-D, a K padded to whole chunks), the ring, split K, the bias and the
epilogue against the reference; on a GPU the production tiles run ResNet-like layers."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.device import simulated
from plugrt.kernels import Epilogue
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from plugrt.testing import node_tactics, run_tactic, single_node_model
from plugrt_builtin_ops.conv import wgmma_conv
from plugrt_builtin_ops.conv.wgmma_conv import WgmmaConfig

from test_kernels_epilogue import _run, residual_relu, residual_relu_numpy

TF32_TOL = 5e-3
TINY = (WgmmaConfig(1, 8, 3),)
#: On the H200 (2026-12-04) the one-warpgroup n8 tile and K-split tactics gave wrong
#: results (the production tiles' whole tactics were right): known, not offered, open.
UNVALIDATED_ON_GPU = pytest.mark.xfail(not simulated(), strict=False,
                                       reason="n8 tile and K split are wrong on the H200; see wgmma_conv.OFFER_SPLIT_K")


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(wgmma_conv, "SIM_CONFIGS", TINY)
    monkeypatch.setattr(wgmma_conv, "GPU_CONFIGS", TINY)
    monkeypatch.setattr(wgmma_conv, "OFFER_SPLIT_K", True)


def rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv_graph(rng, x_shape, w_shape, attrs, bias=True):
    feeds = {"x": rand(rng, x_shape), "w": rand(rng, w_shape) / np.sqrt(np.prod(w_shape[1:]))}
    if bias:
        feeds["b"] = rand(rng, (w_shape[0],))
    graph = import_model(single_node_model("Conv", feeds, attrs, constants=("w", "b")), registry=default_registry())
    return graph, feeds


def close(got, want, label):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-6)
    err = float(np.max(np.abs(got - want)))
    assert err <= TF32_TOL * scale, f"{label}: max error {err:.3g} > {TF32_TOL} * {scale:.3g}"


def geometry_of(graph):
    node = graph.nodes[0]
    op = default_registry().op(node)
    return op._kernel_geometry(node, [graph.info(n) for n in node.inputs], [graph.info(n) for n in node.outputs])


def wgmma_tactics(graph):
    return [t for t in node_tactics(graph, default_registry()) if t.name.startswith("wgmma")]


CASES = [
    # 3x3, pad 1: K = 4 * 9 = 36, two pixel tiles, 64 channels
    ((1, 4, 4, 4), (64, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    # a first layer: K = 3 * 9 = 27, held padded to 28; stride 2, ragged pixels
    ((1, 3, 7, 5), (40, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    # dilation, no padding, several K tiles around the ring (K = 16 * 9 = 144)
    ((1, 16, 7, 7), (64, 16, 3, 3), {"dilations": [2, 2]}),
    # two groups of 32 output channels, 1x1 with stride
    ((2, 8, 4, 4), (64, 4, 1, 1), {"group": 2, "strides": [2, 2]}),
    # 1-D
    ((2, 8, 9), (48, 8, 3), {"pads": [1, 1]}),
]


@UNVALIDATED_ON_GPU
@pytest.mark.parametrize("x_shape, w_shape, attrs", CASES)
def test_wgmma_conv_matches_the_reference(rng, tiny, x_shape, w_shape, attrs):
    graph, feeds = conv_graph(rng, x_shape, w_shape, attrs)
    tactics = wgmma_tactics(graph)
    assert tactics and all(t.math == "tf32" for t in tactics)
    want = ReferenceExecutor(graph, default_registry()).run({"x": feeds["x"]})[graph.outputs[0]]
    failures = []
    for tactic in tactics:
        try:
            close(run_tactic(graph, tactic, {"x": feeds["x"]})[0], want, tactic.name)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "; ".join(failures)


@UNVALIDATED_ON_GPU
@pytest.mark.parametrize("splits", [2, 3])
def test_split_k(rng, tiny, splits):
    graph, feeds = conv_graph(rng, (1, 16, 3, 3), (64, 16, 3, 3), {"pads": [1, 1, 1, 1]})  # K 144: 5 tiles
    geo = geometry_of(graph)
    tactic = wgmma_conv.wgmma_conv_tactic(geo, TINY[0], splits)
    assert tactic.params["splits"] == splits and tactic.workspace_bytes > 0
    want = ReferenceExecutor(graph, default_registry()).run({"x": feeds["x"]})[graph.outputs[0]]
    close(run_tactic(graph, tactic, {"x": feeds["x"]})[0], want, f"splits {splits}")


@UNVALIDATED_ON_GPU
def test_the_epilogue_and_bias_apply_once(rng, tiny):
    graph, feeds = conv_graph(rng, (1, 4, 3, 3), (64, 4, 3, 3), {"pads": [1, 1, 1, 1]})
    geo = geometry_of(graph)
    from test_kernels_epilogue import residual_relu, residual_relu_numpy

    residual = rand(rng, (1, 64, 3, 3))
    epilogue = Epilogue(residual_relu, 3, label="Add+Relu+Mul")
    from test_kernels_epilogue import _run

    want = ReferenceExecutor(graph, default_registry()).run({"x": feeds["x"]})[graph.outputs[0]]
    for splits in (1, 2):
        tactic = wgmma_conv.wgmma_conv_tactic(geo, TINY[0], splits, epilogue)
        got, counts = _run(graph, tactic, {"x": feeds["x"]}, [residual])
        np.testing.assert_array_equal(counts, 1, err_msg=f"{tactic.name}: epilogue calls per element")
        close(got, residual_relu_numpy(want.astype(np.float64), residual.astype(np.float64)), tactic.name)


def test_not_offered_where_it_does_not_suit(rng, tiny):
    for x_shape, w_shape, attrs in [((1, 4, 3, 3), (8, 4, 3, 3), {"pads": [1, 1, 1, 1]}),   # 8 channels
                                    ((1, 4, 2, 2), (64, 4, 1, 1), {})]:                      # 4 pixels
        graph, _ = conv_graph(rng, x_shape, w_shape, attrs)
        assert not wgmma_tactics(graph)
    with pytest.raises(ValueError, match="pixels do not divide"):
        wgmma_conv.check(WgmmaConfig(1, 48, 3))


def test_wgmma_conv_kernels_compile_for_the_gpu():
    """sm_90 typing of the production kernels."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt_builtin_ops.conv import wgmma_conv as W

        @cuda.jit(device=True)
        def epi(v, i, ops):
            return max(v + ops[1][i], float32(0))

        f32, i64 = arr(np.float32), arr(np.int64)
        args = [f32, f32, f32, f32, f32, i64, i64, types.Tuple((i64, f32))]
        for config in W.PRODUCTION_CONFIGS:
            check(config.name, W.wgmma_conv_kernel(config, epi, False), args, True)
        check("emulated", W.wgmma_conv_kernel(W.WgmmaConfig(1, 8, 3), epi, True), args, True)
    """)
    assert not failures, "\\n".join(failures)


# ----------------------------------------------------------------------------- GPU only


@pytest.mark.skipif(simulated(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 224, 224), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((2, 256, 14, 14), (1024, 256, 1, 1), {}),
    ((2, 128, 28, 28), (128, 128, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
])
@pytest.mark.xfail(strict=False, reason="wrong on batch-2 layers on the H200: not offered (wgmma_conv.GPU_CONFIGS)")
def test_wgmma_conv_on_the_gpu(rng, x_shape, w_shape, attrs, monkeypatch):
    monkeypatch.setattr(wgmma_conv, "GPU_CONFIGS", wgmma_conv.PRODUCTION_CONFIGS)
    graph, feeds = conv_graph(rng, x_shape, w_shape, attrs)
    tactics = wgmma_tactics(graph)
    assert tactics
    want = ReferenceExecutor(graph, default_registry()).run({"x": feeds["x"]})[graph.outputs[0]]
    failures = []
    for tactic in tactics:
        try:
            close(run_tactic(graph, tactic, {"x": feeds["x"]})[0], want, tactic.name)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, "; ".join(failures)
