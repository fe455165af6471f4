"""Conv and ConvTranspose CUDA tactics against their references (Numba's simulator without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from plugrt.testing import check_node, node_tactics, run_tactic, single_node_model
from plugrt_builtin_ops.conv import implicit_gemm

TOLERANCE = {np.float16: (2e-2, 2e-2), np.float32: (1e-4, 1e-5), np.float64: (1e-10, 1e-12)}


def _feeds(rng, op, x_shape, w_shape, group=1, bias=True, dtype=np.float32):
    feeds = {"x": rng.standard_normal(x_shape).astype(dtype), "w": rng.standard_normal(w_shape).astype(dtype)}
    if bias:
        out_channels = w_shape[0] if op == "Conv" else w_shape[1] * group
        feeds["b"] = rng.standard_normal(out_channels).astype(dtype)
    return feeds


def _check(rng, op, x_shape, w_shape, bias=True, dtype=np.float32, constants=("w", "b"), **attrs):
    feeds = _feeds(rng, op, x_shape, w_shape, attrs.get("group", 1), bias, dtype)
    rtol, atol = TOLERANCE[dtype]
    return check_node(op, feeds, attrs, constants=[c for c in constants if c in feeds], rtol=rtol, atol=atol)


def _tactic_names(op, feeds, attrs, constants=("w", "b")):
    graph = import_model(single_node_model(op, feeds, attrs, constants), registry=default_registry())
    return [t.name for t in node_tactics(graph, default_registry())]


# ----------------------------------------------------------------------------- Conv


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 3, 5, 5), (4, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
        ((1, 3, 5, 6), (2, 3, 3, 2), dict(strides=[2, 2], pads=[0, 1, 2, 0])),
        ((2, 2, 6, 5), (3, 2, 2, 3), dict(strides=[1, 2], dilations=[2, 1], pads=[1, 2, 0, 1])),
        ((1, 4, 5, 5), (4, 2, 3, 3), dict(group=2, pads=[1, 0, 1, 1])),
        ((1, 4, 5, 5), (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1], strides=[2, 1])),  # depthwise
        ((2, 3, 5, 4), (6, 1, 2, 2), dict(group=3, dilations=[2, 2])),  # depthwise, multiplier 2
        ((1, 3, 5, 5), (2, 3, 1, 1), dict(strides=[2, 2])),  # 1x1
        ((1, 2, 6, 5), (3, 2, 3, 3), dict(pads=[-1, 0, 1, -1])),  # negative pads crop
    ],
)
def test_conv_2d(rng, x_shape, w_shape, attrs):
    _check(rng, "Conv", x_shape, w_shape, **attrs)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_auto_pad(rng, auto_pad):
    _check(rng, "Conv", (1, 2, 5, 6), (3, 2, 2, 3), strides=[2, 1], dilations=[1, 2], auto_pad=auto_pad)


def test_conv_1d_and_3d(rng):
    _check(rng, "Conv", (2, 4, 9), (4, 2, 3), group=2, strides=[2], dilations=[2], pads=[2, 1])
    _check(rng, "Conv", (1, 2, 4, 3, 5), (3, 2, 2, 2, 3), strides=[2, 1, 2], auto_pad="SAME_UPPER")
    _check(rng, "Conv", (1, 4, 3, 4, 3), (4, 1, 3, 2, 2), bias=False, group=4, pads=[1, 0, 1, 1, 1, 0],
           dilations=[1, 2, 1])


def test_conv_without_bias_and_runtime_weights(rng):
    _check(rng, "Conv", (2, 3, 4, 5), (2, 3, 3, 3), bias=False, pads=[1, 1, 1, 1])
    _check(rng, "Conv", (1, 2, 5, 4), (3, 2, 2, 2), constants=(), strides=[2, 1])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_dtypes(rng, dtype):
    _check(rng, "Conv", (1, 4, 5, 5), (4, 2, 3, 3), dtype=dtype, group=2, strides=[2, 1], pads=[1, 0, 0, 1])
    _check(rng, "ConvTranspose", (1, 2, 3, 4), (2, 2, 3, 3), dtype=dtype, strides=[2, 1], output_padding=[1, 0])


def _families(names):
    """Tactic names by family (``implicit_gemm_64x64x16_4x4`` -> ``implicit_gemm``), runs merged."""
    out = []
    for name in names:
        family = next((f for f in ("implicit_gemm", "gemm_1x1", "depthwise") if name.startswith(f + "_")), name)
        if not out or out[-1] != family:
            out.append(family)
    return out


def test_conv_tactic_order(rng):
    """GEMM tiles lead for wide groups; depthwise and the direct 2-D kernel for depthwise
    nodes and ConvTranspose; N-d last (test_kernels_conv_tactics.py checks the tiles)."""
    wide = _feeds(rng, "Conv", (1, 8, 5, 5), (8, 8, 3, 3))
    assert _families(_tactic_names("Conv", wide, {})) == ["implicit_gemm", "direct2d", "direct"]
    depthwise = _feeds(rng, "Conv", (1, 4, 5, 5), (4, 1, 3, 3))
    assert _families(_tactic_names("Conv", depthwise, {"group": 4})) == [
        "depthwise", "direct2d", "implicit_gemm", "direct"]
    wide64 = {k: v.astype(np.float64) for k, v in wide.items()}
    assert _tactic_names("Conv", wide64, {}) == ["direct2d", "direct"]
    volume = _feeds(rng, "Conv", (1, 2, 3, 3, 3), (2, 2, 2, 2, 2))
    assert _tactic_names("Conv", volume, {}) == ["direct"]
    transposed = _feeds(rng, "ConvTranspose", (1, 2, 3, 3), (2, 2, 3, 3))
    assert _tactic_names("ConvTranspose", transposed, {"strides": [2, 2]}) == ["direct2d", "direct"]


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs, config, splits",
    [
        # The GPU tile (256 threads) on a shape that spans two M and two P tiles.
        ((1, 3, 9, 8), (66, 3, 2, 2), dict(strides=[1, 1]), implicit_gemm.GPU_CONFIG, 1),
        # Split K (partial sums in the workspace, then the summing epilogue), grouped.
        ((2, 8, 5, 4), (6, 4, 3, 3), dict(group=2, pads=[1, 1, 0, 1]), implicit_gemm.SIM_CONFIG, 3),
        ((1, 6, 7), (5, 6, 3), dict(strides=[2], pads=[1, 2]), implicit_gemm.SIM_CONFIG, 2),  # 1-D
    ],
)
def test_conv_implicit_gemm_configs(rng, x_shape, w_shape, attrs, config, splits):
    registry = default_registry()
    feeds = _feeds(rng, "Conv", x_shape, w_shape, attrs.get("group", 1))
    graph = import_model(single_node_model("Conv", feeds, attrs, {"w", "b"}), registry=registry)
    node = graph.nodes[0]
    op = registry.op(node)
    geo = op._kernel_geometry(node, [graph.info(n) for n in node.inputs], [graph.info(n) for n in node.outputs])
    tactic = implicit_gemm.gemm_tactic(geo, np.float32, config=config, splits=splits)
    assert tactic.params["splits"] == splits
    assert tactic.workspace_bytes == (0 if splits == 1 else 4 * splits * geo.out_size)
    got = run_tactic(graph, tactic, {"x": feeds["x"]})[0]
    want = ReferenceExecutor(graph, registry).run({"x": feeds["x"]})[graph.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_conv_split_heuristic():
    """Batch-1 late ResNet layers split K; large layers do not."""
    from plugrt_builtin_ops.conv.geometry import ConvGeometry

    late = ConvGeometry(1, 512, 512, 1, (7, 7), (3, 3), (7, 7), (1, 1), (1, 1), (1, 1))
    early = ConvGeometry(32, 64, 64, 1, (56, 56), (3, 3), (56, 56), (1, 1), (1, 1), (1, 1))
    config = implicit_gemm.GPU_CONFIG
    assert implicit_gemm.choose_splits(late, config) > 1
    assert implicit_gemm.choose_splits(early, config) == 1
    tactic = implicit_gemm.gemm_tactic(late, np.float32, config=config)
    assert tactic.workspace_bytes == 4 * tactic.params["splits"] * 512 * 49


# ----------------------------------------------------------------------------- ConvTranspose


@pytest.mark.parametrize(
    "attrs",
    [
        dict(strides=[2, 3], output_padding=[1, 2]),
        dict(strides=[2, 2], pads=[1, 0, 2, 1], dilations=[1, 2]),
        dict(strides=[2, 2], output_shape=[7, 9]),
        dict(strides=[2, 1], output_shape=[9, 8]),  # larger than natural: zeros then bias
        dict(strides=[2, 3], auto_pad="SAME_UPPER"),
        dict(strides=[2, 3], auto_pad="SAME_LOWER"),
        dict(strides=[1, 2], auto_pad="VALID", output_padding=[0, 1]),
    ],
)
@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_2d(rng, attrs, group):
    _check(rng, "ConvTranspose", (1, 4, 3, 4), (4, 2, 3, 2), group=group, **attrs)


def test_conv_transpose_depthwise_1d_3d(rng):
    _check(rng, "ConvTranspose", (2, 3, 3, 3), (3, 1, 3, 3), group=3, strides=[2, 2], pads=[1, 1, 1, 1],
           output_padding=[1, 0])
    _check(rng, "ConvTranspose", (2, 3, 5), (3, 2, 4), bias=False, strides=[3], dilations=[2], pads=[2, 1],
           output_padding=[1])
    _check(rng, "ConvTranspose", (1, 4, 2, 3, 2), (4, 1, 2, 3, 2), group=2, strides=[2, 1, 2],
           output_shape=[5, 4, 5])


def test_empty_batch(rng):
    _check(rng, "Conv", (0, 2, 4, 4), (3, 2, 3, 3), pads=[1, 1, 1, 1])
    _check(rng, "ConvTranspose", (0, 2, 3, 3), (2, 3, 3, 3), strides=[2, 2])
