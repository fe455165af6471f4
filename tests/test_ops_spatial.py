"""Pad, DepthToSpace, SpaceToDepth, Resize and Upsample references against onnxruntime.

Resize cases avoid exact rounding ties of nearest modes under non-representable scales
(onnxruntime and the reference may settle a 1-ulp tie differently), and fractional
``scale * length`` with align_corners / tf_crop_and_resize, where onnxruntime uses the
integer output length and the ONNX reference (and its node cases) the fractional one.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import plugrt
from plugrt.onnx import backend


def _model(op, x_shape, dtype, consts=(), attrs=None, opset=19, runtime=()):
    """One-node model: input X, then constants (None = omitted input) or runtime inputs."""
    names, inits, graph_inputs = ["X"], [], []
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph_inputs.append(helper.make_tensor_value_info("X", et, list(x_shape)))
    for i, c in enumerate(consts):
        if c is None:
            names.append("")
        elif isinstance(c, str):  # a runtime input named c, fed by the test
            names.append(c)
            arr = dict(runtime)[c]
            graph_inputs.append(helper.make_tensor_value_info(
                c, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
        else:
            names.append(f"c{i}")
            inits.append(numpy_helper.from_array(np.asarray(c), f"c{i}"))
    node = helper.make_node(op, names, ["Y"], name="n0", **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("Y", et, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _run_both(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)[0]
    rep = backend.prepare(model, "CPU")
    got = rep.run(feeds)[0]
    return expected, got, rep


def _check(model, feeds, atol=1e-5):
    expected, got, rep = _run_both(model, feeds)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-5, atol=atol)
    return rep


def _scales(values):
    """Resize's optional inputs (roi, scales) for a scales-only node."""
    return [None, np.array(values, np.float32)]


def _normal(rng, shape, dtype=np.float32):
    return (rng.standard_normal(shape) + 0.1).astype(dtype)


# ------------------------------------------------------------------------------ Pad


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_pad_modes_with_negative_pads(rng, mode, dtype):
    x = (rng.integers(-50, 50, (3, 4, 5)) if dtype == np.int32 else _normal(rng, (3, 4, 5))).astype(dtype)
    pad_sets = [[1, 0, 2, 2, 1, 3], [0, -1, 2, 1, 0, -2], [-1, 1, 0, 0, 2, -1], [0, 0, -2, 0, 0, -1]]
    if mode != "reflect":
        pad_sets.append([2, 3, 4, 1, 4, 6])  # wider than the axis
    for pads in pad_sets:
        consts = [np.array(pads, np.int64)]
        if mode == "constant":
            consts.append(np.array(7, dtype))
        _check(_model("Pad", x.shape, dtype, consts, {"mode": mode}), {"X": x}, atol=0)


def test_pad_negative_axes_opset18(rng):
    x = _normal(rng, (2, 3, 4, 5))
    for mode in ("constant", "edge", "reflect"):
        consts = [np.array([1, 2, -1, 1], np.int64), np.array(-2.5, np.float32), np.array([-1, 1], np.int64)]
        _check(_model("Pad", x.shape, np.float32, consts, {"mode": mode}, opset=18), {"X": x}, atol=0)


def test_pad_attribute_form_opset10(rng):
    x = _normal(rng, (3, 5))
    for mode in ("constant", "reflect", "edge"):
        attrs = {"mode": mode, "pads": [1, 2, 2, 0], "value": 1.5}
        _check(_model("Pad", x.shape, np.float32, (), attrs, opset=10), {"X": x}, atol=0)


def test_pad_symbolic_and_runtime_pads(rng):
    x = _normal(rng, (2, 3, 5))
    model = _model("Pad", ("N", 3, 5), np.float32, [np.array([0, 1, 2, 0, -1, 3], np.int64)])
    rep = _check(model, {"X": x}, atol=0)
    assert rep.graph.values["Y"].info.shape[1:] == (3, 10)
    assert isinstance(rep.graph.values["Y"].info.shape[0], str)
    pads = np.array([1, 0, 2, 0, 2, 1], np.int64)
    model = _model("Pad", x.shape, np.float32, ["pads"], {"mode": "edge"}, runtime={"pads": pads})
    rep = _check(model, {"X": x, "pads": pads}, atol=0)
    assert rep.graph.values["Y"].info.rank == 3


def test_pad_bool_constant():
    x = np.array([[True, False], [False, True]])
    rep = backend.prepare(_model("Pad", x.shape, np.bool_, [np.array([1, 0, 0, 1], np.int64)]), "CPU")
    y = rep.run({"X": x})[0]
    assert y.dtype == np.bool_ and y.shape == (3, 3) and not y[0].any() and not y[:, 2].any()


# ------------------------------------------------------------------ DepthToSpace


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("blocksize", [2, 3])
def test_depth_to_space_and_back(rng, mode, blocksize):
    b = blocksize
    x = _normal(rng, (2, 2 * b * b, 3, 5))
    attrs = {"blocksize": b, "mode": mode}
    model = _model("DepthToSpace", ("N", 2 * b * b, 3, 5), np.float32, (), attrs, opset=13)
    rep = _check(model, {"X": x}, atol=0)
    assert rep.graph.values["Y"].info.shape[1:] == (2, 3 * b, 5 * b)
    y = rep.run({"X": x})[0]
    back = _model("SpaceToDepth", y.shape, np.float32, (), {"blocksize": b, "mode": mode}, opset=21)
    # onnxruntime knows SpaceToDepth's mode only from opset 28, so compare the round trip.
    restored = backend.prepare(back, "CPU").run({"X": y})[0]
    np.testing.assert_array_equal(restored, x)


def test_space_to_depth_vs_ort(rng):
    x = _normal(rng, (2, 3, 6, 9))
    model = _model("SpaceToDepth", ("N", 3, 6, 9), np.float32, (), {"blocksize": 3}, opset=13)
    rep = _check(model, {"X": x}, atol=0)
    assert rep.graph.values["Y"].info.shape[1:] == (27, 2, 3)


# ------------------------------------------------------------------------- Resize

CTMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
        "tf_crop_and_resize"]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("ctm", CTMS)
def test_resize_modes_vs_ort(rng, mode, ctm):
    x = _normal(rng, (2, 3, 4, 8))
    nearest_modes = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"] if mode == "nearest" else [None]
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 1.1], np.float32) if ctm == "tf_crop_and_resize" else None
    targets = [("scales", [1, 1, 0.5, 2.5]), ("scales", [1, 1, 1.75, 0.75]), ("sizes", [2, 3, 6, 4]),
               ("sizes", [2, 3, 1, 16])]
    for nearest_mode in nearest_modes:
        for kind, values in targets:
            attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "extrapolation_value": -3.0}
            if nearest_mode:
                attrs["nearest_mode"] = nearest_mode
            if kind == "scales":
                consts = [roi, np.array(values, np.float32)]
            else:
                consts = [roi, None, np.array(values, np.int64)]
            _check(_model("Resize", x.shape, np.float32, consts, attrs), {"X": x}, atol=2e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_odd_scales_vs_ort(rng, mode):
    x = _normal(rng, (1, 2, 7, 9))
    for ctm in ("half_pixel", "pytorch_half_pixel", "asymmetric"):
        for scales in ([1, 1, 0.63, 1.37], [1, 1, 2.9, 0.3]):
            attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
            _check(_model("Resize", x.shape, np.float32, _scales(scales), attrs), {"X": x}, 2e-5)


def test_resize_cubic_options_vs_ort(rng):
    x = _normal(rng, (1, 1, 6, 5))
    for a in (-0.5, -0.75):
        for exclude in (0, 1):
            attrs = {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude}
            for scales in ([1, 1, 0.5, 0.6], [1, 1, 2.5, 1.6]):
                _check(_model("Resize", x.shape, np.float32, _scales(scales), attrs), {"X": x}, 2e-5)


def test_resize_tf_crop_and_resize_axes_vs_ort(rng):
    x = _normal(rng, (2, 3, 5, 7))
    roi = np.array([0.4, -0.2, 0.9, 0.7], np.float32)  # for axes (-1, 2) = (3, 2)
    for mode in ("nearest", "linear", "cubic"):
        attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
                 "extrapolation_value": 10.0, "axes": [-1, 2]}
        model = _model("Resize", x.shape, np.float32, [roi, None, np.array([4, 9], np.int64)], attrs)
        _check(model, {"X": x}, 2e-5)


def test_resize_axes_keep_aspect_ratio_vs_ort(rng):
    x = _normal(rng, (1, 3, 6, 8))
    for policy in ("stretch", "not_larger", "not_smaller"):
        for mode in ("nearest", "linear"):
            # onnxruntime mishandles negative axes with not_larger / not_smaller (its own
            # shape inference agrees with the reference), so those use axes >= 0.
            axes = [3, -2] if policy == "stretch" else [3, 2]
            attrs = {"mode": mode, "keep_aspect_ratio_policy": policy, "axes": axes}
            model = _model("Resize", x.shape, np.float32, [None, None, np.array([4, 9], np.int64)], attrs)
            _check(model, {"X": x}, 2e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_vs_ort(rng, mode):
    x = _normal(rng, (1, 2, 9, 13))
    for exclude in (0, 1):
        for scales in ([1, 1, 0.5, 0.25], [1, 1, 0.6, 0.35], [1, 1, 1.5, 0.5]):
            attrs = {"mode": mode, "antialias": 1, "exclude_outside": exclude}
            _check(_model("Resize", x.shape, np.float32, _scales(scales), attrs), {"X": x}, 2e-5)


def test_resize_nd_and_dtypes_vs_ort(rng):
    x = _normal(rng, (1, 2, 3, 5, 7))
    for mode in ("nearest", "linear"):  # trilinear over three spatial axes
        model = _model("Resize", x.shape, np.float32, _scales([1, 1, 2, 1.5, 0.75]), {"mode": mode})
        _check(model, {"X": x}, 2e-5)
    for dtype in (np.uint8, np.int8, np.int32, np.float16):
        x = rng.integers(0, 100, (1, 2, 5, 7)).astype(dtype)
        for mode in ("nearest", "linear"):
            model = _model("Resize", x.shape, dtype, _scales([1, 1, 1.5, 0.75]), {"mode": mode})
            # integers: onnxruntime rounds halves away from zero, the reference to even (as ONNX's)
            _check(model, {"X": x}, atol=0 if mode == "nearest" else 1)


def test_resize_symbolic_and_runtime_inputs(rng):
    x = _normal(rng, (3, 2, 5, 7))
    model = _model("Resize", ("N", 2, 5, 7), np.float32, _scales([1, 1, 2, 3]), {"mode": "linear"})
    rep = _check(model, {"X": x}, 2e-5)
    assert rep.graph.values["Y"].info.shape[1:] == (2, 10, 21)
    assert isinstance(rep.graph.values["Y"].info.shape[0], str)
    sizes = np.array([3, 2, 4, 11], np.int64)
    attrs = {"mode": "nearest"}
    model = _model("Resize", x.shape, np.float32, [None, None, "sizes"], attrs, runtime={"sizes": sizes})
    rep = _check(model, {"X": x, "sizes": sizes}, 0)
    assert rep.graph.values["Y"].info.rank == 4


def test_resize_opset10_and_upsample_vs_ort(rng):
    x = _normal(rng, (1, 2, 5, 7))
    for mode in ("nearest", "linear"):
        for scales in ([1, 1, 2, 3], [1, 1, 0.5, 0.75], [1, 1, 1.5, 2.5], [1, 1, 0.6, 0.3]):
            scales = np.array(scales, np.float32)
            _check(_model("Resize", x.shape, np.float32, [scales], {"mode": mode}, opset=10), {"X": x}, 2e-5)
            if scales.min() >= 1:  # onnxruntime's Upsample refuses downsampling
                _check(_model("Upsample", x.shape, np.float32, [scales], {"mode": mode}, opset=9), {"X": x}, 2e-5)
                attrs = {"mode": mode, "scales": scales.tolist()}
                _check(_model("Upsample", x.shape, np.float32, (), attrs, opset=7), {"X": x}, 2e-5)


def test_declared_unsupported_raise_naming_the_node():
    model = _model("Resize", (1, 1, 2, 2), np.bool_, _scales([1, 1, 2, 2]), {"mode": "linear"})
    with pytest.raises(plugrt.UnsupportedError, match="n0"):
        backend.prepare(model, "CPU")
    model = _model("Pad", (2, 2), np.float32, [np.array([1, 1, 1, 1], np.int64)], {"mode": "symmetric"})
    with pytest.raises(plugrt.UnsupportedError, match="n0.*mode"):
        backend.prepare(model, "CPU")


def test_resize_opset11_empty_inputs_vs_ort(rng):
    x = _normal(rng, (1, 2, 5, 6))
    empty = np.zeros(0, np.float32)
    for ctm in ("tf_half_pixel_for_nn", "half_pixel", "asymmetric"):
        attrs = {"mode": "nearest", "coordinate_transformation_mode": ctm}
        model = _model("Resize", x.shape, np.float32, [empty, empty, np.array([1, 2, 10, 3], np.int64)], attrs, 11)
        _check(model, {"X": x}, 0)
        model = _model("Resize", x.shape, np.float32, [empty, np.array([1, 1, 2, 0.5], np.float32)], attrs, 11)
        _check(model, {"X": x}, 0)


def stn(align: int, three_d: bool = False):
    """A spatial transformer as ``F.affine_grid`` + ``F.grid_sample`` export it (opset 20):
    theta from a Gemm over the flattened input, ``size`` the input's shape (so known only
    at each batch), then GridSample; batch dynamic."""
    from onnx import TensorProto

    rng = np.random.default_rng(3)
    spatial = (3, 4, 5) if three_d else (4, 5)
    rank, features = len(spatial), 2 * int(np.prod(spatial))
    w = numpy_helper.from_array((rng.standard_normal((features, rank * (rank + 1))) * 0.05).astype(np.float32), "w")
    identity = np.eye(rank, rank + 1).reshape(-1).astype(np.float32)
    nodes = [helper.make_node("Flatten", ["x"], ["flat"]),
             helper.make_node("Gemm", ["flat", "w", "identity"], ["t"]),
             helper.make_node("Reshape", ["t", "theta_shape"], ["theta"]),
             helper.make_node("Shape", ["x"], ["size"]),
             helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align),
             helper.make_node("GridSample", ["x", "grid"], ["y"], align_corners=align)]
    consts = [w, numpy_helper.from_array(identity, "identity"),
              numpy_helper.from_array(np.array([-1, rank, rank + 1], np.int64), "theta_shape")]
    graph = helper.make_graph(nodes, "stn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, *spatial])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2, *spatial])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), spatial


@pytest.mark.parametrize("align,three_d", [(0, False), (1, False), (0, True)])
def test_affine_grid_spatial_transformer_over_a_dynamic_batch(rng, align, three_d):
    """AffineGrid as one kernel (ONNX's function body fails at batch 1: a Squeeze without
    axes), matching onnxruntime at batches 1 and 3 of one engine."""
    from plugrt.engine import Builder, BuilderConfig, OptimizationProfile

    model, spatial = stn(align, three_d)
    config = BuilderConfig(progress=False, tf32=False)
    config.add_optimization_profile(OptimizationProfile().set_shape("x", (1, 2, *spatial), (2, 2, *spatial),
                                                                    (3, 2, *spatial)))
    engine = Builder().build_engine(model, config)
    assert "AffineGrid" in [layer["op"] for layer in engine.inspect()["layers"]]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with engine.create_execution_context() as context:
        for batch in (1, 3):
            x = _normal(rng, (batch, 2, *spatial))
            np.testing.assert_allclose(context.execute({"x": x})["y"], session.run(None, {"x": x})[0],
                                       rtol=1e-4, atol=1e-5)


def test_affine_grid_kernels_type_for_sm90():
    """The simulator never types kernels: AffineGrid's, for each dtype and rank, compiled
    for sm_90 (no float64 in float32 and float16 code)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.spatial.affine_grid import affine_grid_kernel
        for dt in ("float16", "float32", "float64"):
            for rank in (2, 3):
                check(f"AffineGrid {dt} rank {rank}", affine_grid_kernel(np.dtype(dt).str, rank),
                      [arr(dt), arr(dt), I64, I64, I64, I64, I64], dt != "float64")
    """)
    assert not failures, "\\n".join(failures)
