"""GridSample, RoiAlign and Col2Im (builtin-spatial): every CUDA tactic against the NumPy
reference (simulator without a GPU), the references against ONNX's own, what the plugins
refuse, their conformance examples, and their kernels compiled for a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from plugrt.errors import ModelError, PlugrtError, ShapeError, UnsupportedError
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.testing import check_node, check_plugin, node_tactics, single_node_model
from plugrt_builtin_ops.spatial.col2im_ops import block_counts

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {F16: dict(rtol=2e-3, atol=2e-3), F32: dict(rtol=1e-5, atol=1e-5), F64: dict(rtol=1e-12, atol=1e-12)}


def _normal(rng, shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


def _ours_and_onnx(registry, op_type, feeds, attrs, opset):
    """``(plugrt's reference, ONNX's reference)`` output 0 of a one-node model."""
    model = single_node_model(op_type, feeds, attrs, opset=opset)
    graph = import_model(model, registry=registry)
    ours = ReferenceExecutor(graph, registry).run(dict(feeds))[graph.outputs[0]]
    return ours, ReferenceEvaluator(model).run(None, dict(feeds))[0]


def _tactic_names(registry, op_type, feeds, attrs, constants=(), opset=17):
    graph = import_model(single_node_model(op_type, feeds, attrs, constants, opset=opset), registry=registry)
    return [t.name for t in node_tactics(graph, registry)]


# ---------------------------------------------------------------------- GridSample

MODES = ["nearest", "linear", "cubic"]
PADDINGS = ["zeros", "border", "reflection"]


def grid_case(rng, x_shape, points, dtype=F32, grid_dtype=None, spread=1.4):
    """X and a grid of ``points`` (H1..Hr) per image, some beyond [-1, 1]."""
    r = len(x_shape) - 2
    x = _normal(rng, x_shape, dtype) if np.dtype(dtype).kind == "f" else rng.integers(-9, 9, x_shape).astype(dtype)
    grid = rng.uniform(-spread, spread, (x_shape[0], *points, r)).astype(grid_dtype or dtype)
    return {"x": x, "grid": grid}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("x_shape, points", [((2, 3, 4, 5), (3, 2)), ((1, 2, 5), (4,)), ((1, 2, 3, 2, 4), (2, 2, 1))])
def test_grid_sample_float32(registry, rng, mode, padding, align, x_shape, points):
    feeds = grid_case(rng, x_shape, points)
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    want = check_node("GridSample", feeds, attrs, opset=20, **TOL[F32])[0]
    ours, theirs = _ours_and_onnx(registry, "GridSample", feeds, attrs, 20)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert want.shape == (x_shape[0], x_shape[1], *points)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("x_dtype, grid_dtype", [(F16, F16), (F64, F64), (F32, F64), (F16, F32)])
def test_grid_sample_float_types(rng, mode, x_dtype, grid_dtype):
    feeds = grid_case(rng, (1, 3, 4, 4), (3, 3), x_dtype, grid_dtype)
    tol = TOL[F16] if F16 in (x_dtype, grid_dtype) else TOL[x_dtype]
    check_node("GridSample", feeds, {"mode": mode, "padding_mode": "reflection"}, opset=20, **tol)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("padding", PADDINGS)
def test_grid_sample_nearest_on_any_type(rng, dtype, padding):
    feeds = grid_case(rng, (2, 2, 3, 4), (2, 3), np.int64)
    feeds["x"] = feeds["x"].astype(dtype)
    feeds["grid"] = feeds["grid"].astype(F32)
    check_node("GridSample", feeds, {"mode": "nearest", "padding_mode": padding}, opset=20)


def test_grid_sample_nearest_ties_round_to_even(registry):
    """Points exactly halfway between pixels: np.rint's (and PyTorch's) ties to even."""
    x = np.arange(8, dtype=F32).reshape(1, 1, 1, 8)
    xs = (np.arange(8) + 0.5) / 8 * 2 - 1 + 1 / 8  # input coordinates 0.5, 1.5, ... (align_corners=0)
    grid = np.stack([xs, np.zeros(8)], axis=-1).reshape(1, 1, 8, 2).astype(F32)
    want = check_node("GridSample", {"x": x, "grid": grid}, {"mode": "nearest", "padding_mode": "border"}, opset=20)[0]
    np.testing.assert_array_equal(want.reshape(-1), [0, 2, 2, 4, 4, 6, 6, 7])


@pytest.mark.parametrize("old, new", [("bilinear", "linear"), ("bicubic", "cubic"), ("nearest", "nearest")])
def test_grid_sample_opset16_names(rng, old, new):
    feeds = grid_case(rng, (1, 2, 4, 5), (3, 3))
    attrs = {"padding_mode": "border", "align_corners": 1}
    at_16 = check_node("GridSample", feeds, {"mode": old, **attrs}, opset=16)[0]
    at_20 = check_node("GridSample", feeds, {"mode": new, **attrs}, opset=20)[0]
    np.testing.assert_array_equal(at_16, at_20)
    default = check_node("GridSample", feeds, attrs, opset=16)[0]  # bilinear
    np.testing.assert_array_equal(default, check_node("GridSample", feeds, attrs, opset=22)[0])


def test_grid_sample_splits_channels_over_few_points(registry, rng):
    few = grid_case(rng, (1, 16, 4, 4), (2, 1))
    assert _tactic_names(registry, "GridSample", few, {}, opset=20) == ["points", "channel_split"]
    check_node("GridSample", few, {"mode": "cubic"}, opset=20, tactics=["channel_split"], **TOL[F32])
    single = grid_case(rng, (1, 1, 4, 4), (2, 2))
    assert _tactic_names(registry, "GridSample", single, {}, opset=20) == ["points"]


def test_grid_sample_empty_output(rng):
    feeds = grid_case(rng, (2, 3, 4, 4), (0, 3))
    assert check_node("GridSample", feeds, {}, opset=20)[0].shape == (2, 3, 0, 3)


@pytest.mark.parametrize("x_shape, grid_shape, attrs, opset, error, message", [
    ((1, 1, 3, 3), (1, 2, 2, 2), {"mode": "linear"}, 16, UnsupportedError, "mode='linear' at opset 16"),
    ((1, 1, 3, 3), (1, 2, 2, 2), {"mode": "bilinear"}, 20, UnsupportedError, "mode='bilinear' at opset 20"),
    ((1, 1, 3, 3), (1, 2, 2, 2), {"padding_mode": "wrap"}, 20, UnsupportedError, "padding_mode='wrap'"),
    ((1, 1, 3, 3, 3), (1, 2, 2, 2, 3), {}, 16, UnsupportedError, "rank 5 at opset 16"),
    ((1, 1, 2, 2, 2, 2), (1, 1, 1, 1, 1, 4), {}, 20, UnsupportedError, "1 to 3 spatial dims"),
    ((1, 1, 3, 3), (1, 2, 2, 3), {}, 20, ModelError, "last dim is 3"),
    ((1, 1, 3, 3), (1, 2, 2), {}, 20, ModelError, "grid has rank 3"),
    ((1, 1, 0, 3), (1, 2, 2, 2), {}, 20, UnsupportedError, "empty spatial dim"),
])
def test_grid_sample_refuses_invalid_nodes(registry, x_shape, grid_shape, attrs, opset, error, message):
    feeds = {"x": np.zeros(x_shape, F32), "grid": np.zeros(grid_shape, F32)}
    with pytest.raises(error, match=message):
        check_node("GridSample", feeds, attrs, opset=opset, registry=registry)


def test_grid_sample_interpolates_only_float_data(registry):
    feeds = {"x": np.zeros((1, 1, 3, 3), np.int32), "grid": np.zeros((1, 2, 2, 2), F32)}
    with pytest.raises(UnsupportedError, match="input 0 of dtype int32"):
        check_node("GridSample", feeds, {"mode": "linear"}, opset=20, registry=registry)


# ---------------------------------------------------------------------- RoiAlign


def roi_case(rng, dtype=F32, n_rois=5, low=-2.0, high=9.0):
    """X (2, 3, 6, 7) and rois partly outside it, some with x1 > x2 (malformed)."""
    return {"x": _normal(rng, (2, 3, 6, 7), dtype), "rois": rng.uniform(low, high, (n_rois, 4)).astype(dtype),
            "batch_indices": rng.integers(0, 2, (n_rois,)).astype(np.int64)}


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio, scale", [(0, 1.0), (2, 0.5), (0, 0.37), (1, 2.0)])
def test_roi_align_float32(registry, rng, mode, ctm, sampling_ratio, scale):
    feeds = roi_case(rng)
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "sampling_ratio": sampling_ratio,
             "spatial_scale": scale, "output_height": 3, "output_width": 2}
    check_node("RoiAlign", feeds, attrs, opset=16, **TOL[F32])
    ours, theirs = _ours_and_onnx(registry, "RoiAlign", feeds, attrs, 16)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [F16, F64])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_float16_float64(rng, dtype, mode):
    check_node("RoiAlign", roi_case(rng, dtype), {"mode": mode, "output_height": 2, "output_width": 3}, opset=16,
               **TOL[dtype])


def test_roi_align_opset10_is_output_half_pixel(rng):
    feeds = roi_case(rng, low=0.0, high=6.0)
    attrs = {"output_height": 2, "output_width": 2, "sampling_ratio": 2}
    at_10 = check_node("RoiAlign", feeds, attrs, opset=10)[0]
    explicit = check_node("RoiAlign", feeds, {**attrs, "coordinate_transformation_mode": "output_half_pixel"},
                          opset=16)[0]
    half = check_node("RoiAlign", feeds, attrs, opset=16)[0]
    np.testing.assert_array_equal(at_10, explicit)
    assert not np.allclose(at_10, half)


def test_roi_align_malformed_rois(rng):
    """x1 > x2: zeros with half_pixel (no sample), a 1x1 box with output_half_pixel."""
    feeds = roi_case(rng, n_rois=2)
    feeds["rois"] = np.array([[4, 1, 2, 3], [1, 5, 3, 2]], F32)
    half = check_node("RoiAlign", feeds, {"output_height": 2, "output_width": 2}, opset=16)[0]
    np.testing.assert_array_equal(half, 0)
    out = check_node("RoiAlign", feeds, {"output_height": 2, "output_width": 2,
                                         "coordinate_transformation_mode": "output_half_pixel"}, opset=16)[0]
    assert np.abs(out).sum() > 0


@pytest.mark.parametrize("feeds_change, attrs, opset, error, message", [
    ({}, {"coordinate_transformation_mode": "half_pixel"}, 10, UnsupportedError, "at opset 10"),
    ({}, {"coordinate_transformation_mode": "asymmetric"}, 16, UnsupportedError, "asymmetric"),
    ({}, {"mode": "sum"}, 16, UnsupportedError, "mode='sum'"),
    ({"batch_indices": np.zeros(5, np.int32)}, {}, 16, UnsupportedError, "input 2 of dtype int32"),
    ({"rois": np.zeros((5, 4), F64)}, {}, 16, ModelError, "share one type"),
    ({"rois": np.zeros((5, 5), F32)}, {}, 16, ModelError, r"\(num_rois, 4\)"),
    ({}, {"output_height": 0}, 16, ModelError, "output_height=0"),
    ({}, {"sampling_ratio": -1}, 16, ModelError, "sampling_ratio=-1"),
])
def test_roi_align_refuses_invalid_nodes(registry, rng, feeds_change, attrs, opset, error, message):
    feeds = {**roi_case(rng), **feeds_change}
    with pytest.raises(error, match=message):
        check_node("RoiAlign", feeds, attrs, opset=opset, registry=registry)


def test_roi_align_reference_refuses_a_batch_index_outside(registry, rng):
    feeds = roi_case(rng)
    feeds["batch_indices"][1] = 2
    graph = import_model(single_node_model("RoiAlign", feeds, {}, opset=16), registry=registry)
    with pytest.raises(PlugrtError, match="batch index 2 of roi 1"):
        ReferenceExecutor(graph, registry).run(feeds)


# ---------------------------------------------------------------------- Col2Im

#: (image_shape, block_shape, attrs): ONNX's node cases' geometries, then odd ones.
COL2IM = [
    ((5, 5), (1, 5), {}),
    ((5, 5), (1, 5), {"pads": [0, 1, 0, 1]}),
    ((5, 5), (1, 5), {"strides": [2, 2]}),
    ((6, 6), (2, 2), {"dilations": [1, 5]}),
    ((3, 4, 5), (1, 1, 5), {}),
    ((6, 5), (3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ((4,), (3,), {"strides": [2], "pads": [2, 1]}),
    ((3, 4, 5), (2, 2, 3), {"strides": [2, 1, 1], "pads": [0, 1, 1, 1, 0, 2], "dilations": [1, 2, 1]}),
    ((7, 7), (3, 3), {"strides": [2, 2], "dilations": [3, 3]}),
]


def col2im_feeds(rng, image, block, attrs, dtype=F32, batch=2, channels=3):
    r = len(image)
    geometry = [attrs.get("dilations", [1] * r), attrs.get("pads", [0] * (2 * r)), attrs.get("strides", [1] * r)]
    length = math.prod(block_counts(list(image), list(block), *geometry))
    shape = (batch, channels * math.prod(block), length)
    data = _normal(rng, shape, dtype) * 3 if np.dtype(dtype).kind == "f" else rng.integers(-50, 50, shape)
    return {"x": data.astype(dtype), "image": np.array(image, np.int64), "block": np.array(block, np.int64)}


@pytest.mark.parametrize("image, block, attrs", COL2IM)
def test_col2im_float32(registry, rng, image, block, attrs):
    feeds = col2im_feeds(rng, image, block, attrs)
    want = check_node("Col2Im", feeds, attrs, constants={"image", "block"}, opset=18)[0]
    ours, theirs = _ours_and_onnx(registry, "Col2Im", feeds, attrs, 18)
    np.testing.assert_array_equal(ours, theirs)  # the same sums in the same order
    assert want.shape == (2, 3, *image)


@pytest.mark.parametrize("dtype", [F16, F64, np.int8, np.int32, np.int64, np.uint64])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's int8 sums wrap
def test_col2im_types(rng, dtype):
    image, block, attrs = COL2IM[5]
    feeds = col2im_feeds(rng, image, block, attrs, dtype)
    tol = dict(rtol=1e-3, atol=1e-2) if dtype == F16 else {}
    check_node("Col2Im", feeds, attrs, constants={"image", "block"}, opset=18, **tol)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_col2im_int8_wraps_as_the_reference(rng):
    feeds = col2im_feeds(rng, (3, 3), (2, 2), {}, np.int8, batch=1, channels=1)
    feeds["x"][:] = 100
    want = check_node("Col2Im", feeds, {}, constants={"image", "block"}, opset=18)[0]
    assert want[0, 0, 1, 1] == np.int8(-112)  # 4 * 100 wrapped


def test_col2im_shapes_at_run_time(registry, rng):
    """The reference takes runtime shapes; the engine needs them at build time."""
    feeds = col2im_feeds(rng, (4, 5), (2, 2), {})
    graph = import_model(single_node_model("Col2Im", feeds, {}, opset=18), registry=registry)
    assert graph.info(graph.outputs[0]).shape == (2, "test_col2im_d1", "test_col2im_d2", "test_col2im_d3")
    with pytest.raises(UnsupportedError, match="computed at run time"):
        _tactic_names(registry, "Col2Im", feeds, {}, constants={"block"}, opset=18)


@pytest.mark.parametrize("shape, image, block, message", [
    ((1, 6, 9), (4, 5), (2, 2), "no multiple of prod"),
    ((1, 8, 9), (4, 5), (2, 2), "input dim 2 is 9"),
    ((1, 4, 1), (1, 1), (2, 2), r"\[0, 0\] block positions"),
])
def test_col2im_refuses_inconsistent_shapes(registry, shape, image, block, message):
    feeds = {"x": np.zeros(shape, F32), "image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    with pytest.raises(ShapeError, match=message):
        check_node("Col2Im", feeds, {}, constants={"image", "block"}, opset=18, registry=registry)


def test_col2im_refuses_bad_attributes(registry, rng):
    feeds = col2im_feeds(rng, (4, 5), (2, 2), {})
    with pytest.raises(PlugrtError, match="dilations, pads and strides need 2, 4 and 2"):
        check_node("Col2Im", feeds, {"strides": [1]}, constants={"image", "block"}, opset=18, registry=registry)


# ---------------------------------------------------------------------- kit, GPU typing


def test_sampling_ops_pass_the_conformance_kit(registry):
    report = check_plugin("builtin-spatial", registry=registry, ops=["GridSample", "RoiAlign", "Col2Im"])
    assert report.ops() == ["Col2Im", "GridSample", "RoiAlign"]
    assert len(report.results) > 3 * 12


def test_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile the variants for sm_90 (no GPU needed)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.spatial.grid_sample import grid_sample_kernel
        from plugrt_builtin_ops.spatial.roi_align import roi_align_kernel
        from plugrt_builtin_ops.spatial.col2im import col2im_kernel
        G = arr(np.int64)
        modes, paddings = ("nearest", "linear", "cubic"), ("zeros", "border", "reflection")
        variants = [("float32", "float32", m, p, 2, (i + j) % 2 == 1) for i, m in enumerate(modes)
                    for j, p in enumerate(paddings)]
        variants += [("float32", "float32", "linear", "border", 1, False), ("float32", "float32", "cubic", "zeros", 3, True)]
        variants += [(dt, dt, m, paddings[i], 2, i == 1) for dt in ("float16", "float64") for i, m in enumerate(modes)]
        variants += [("float32", "float64", "linear", "reflection", 2, True), ("int32", "float32", "nearest", "zeros", 2, False),
                     ("bool", "float16", "nearest", "reflection", 3, True)]
        for xd, gd, mode, padding, rank, align in variants:
            kernel = grid_sample_kernel(np.dtype(xd).str, np.dtype(gd).str, rank, mode, padding, align)
            check(f"GridSample {xd}/{gd} {mode} {padding} rank {rank} align {align}", kernel,
                  [arr(xd), arr(xd), arr(gd), arr(xd), I64, I64, I64, I64, G], "float64" not in (xd, gd))
        for dt in ("float16", "float32", "float64"):
            ct = "float64" if dt == "float64" else "float32"
            for is_max, half in ((False, True), (True, False)):
                check(f"RoiAlign {dt} max={is_max} half_pixel={half}", roi_align_kernel(np.dtype(dt).str, is_max, half),
                      [arr(dt), arr(dt), arr(dt), G] + [I64] * 8 + [scalar(ct)], dt != "float64")
        for dt in ("float16", "float32", "float64", "int8", "int32", "uint64"):
            check(f"Col2Im {dt}", col2im_kernel(np.dtype(dt).str), [arr(dt), arr(dt), I64, G], dt in ("float16", "float32"))
    """)
    assert not failures, "\n".join(failures)
