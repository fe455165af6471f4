"""CUDA tactics of Pad, DepthToSpace, SpaceToDepth, Resize and Upsample against their NumPy
references (simulator without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import plugrt
from plugrt.testing import check_node

F32 = dict(rtol=2e-5, atol=2e-5)
TOL = {np.float16: dict(rtol=2e-3, atol=2e-3), np.float32: F32, np.float64: dict(rtol=1e-12, atol=1e-12)}


def _x(rng, shape, dtype=np.float32):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    return (rng.standard_normal(shape) + 0.2).astype(dtype)


# ------------------------------------------------------------------------------ Pad

PAD_SETS = [[1, 0, 2, 2, 1, 3], [0, -1, 2, 1, 0, -2], [-1, 1, 0, 0, 2, -1], [2, 3, 4, 1, 4, 6]]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16, np.float64, np.bool_])
def test_pad_modes(rng, mode, dtype):
    x = _x(rng, (2, 3, 4), dtype)
    for pads in PAD_SETS:  # the last is wider than the axes (np.pad repeats the pattern)
        feeds = {"x": x, "pads": np.array(pads, np.int64)}
        if mode == "constant":
            feeds["value"] = _x(rng, (), dtype)
        check_node("Pad", feeds, {"mode": mode}, constants={"pads", "value"})


def test_pad_runtime_and_omitted_constant_value(rng):
    x = _x(rng, (3, 4))
    pads = np.array([1, 2, 0, 1], np.int64)
    check_node("Pad", {"x": x, "pads": pads, "value": np.array(-3.5, np.float32)}, constants={"pads"})
    check_node("Pad", {"x": x, "pads": pads, "value": np.array([2.5], np.float32)}, constants={"pads"})
    check_node("Pad", {"x": x, "pads": pads}, constants={"pads"})


def test_pad_axes_opset18(rng):
    x = _x(rng, (2, 3, 4, 5))
    for mode in ("constant", "edge", "reflect", "wrap"):
        feeds = {"x": x, "pads": np.array([1, 2, -1, 1], np.int64), "value": np.array(-2.5, np.float32),
                 "axes": np.array([-1, 1], np.int64)}
        check_node("Pad", feeds, {"mode": mode}, constants={"pads", "value", "axes"}, opset=18)


def test_pad_attribute_forms(rng):
    x = _x(rng, (3, 5))
    for mode in ("constant", "reflect", "edge"):
        check_node("Pad", {"x": x}, {"mode": mode, "pads": [1, 2, 2, 0], "value": 1.5}, opset=10)
    check_node("Pad", {"x": x}, {"mode": "constant", "paddings": [0, 1, 2, 1], "value": -1.0}, opset=1)


def test_pad_rank1_single_element_and_empty(rng):
    check_node("Pad", {"x": _x(rng, (5,)), "pads": np.array([3, 7], np.int64)}, {"mode": "reflect"},
               constants={"pads"})
    check_node("Pad", {"x": _x(rng, (1, 3)), "pads": np.array([2, 0, 1, 0], np.int64)}, {"mode": "reflect"},
               constants={"pads"})
    check_node("Pad", {"x": np.zeros((0, 3), np.float32), "pads": np.array([1, 1, 1, 0], np.int64),
                       "value": np.array(4.0, np.float32)}, constants={"pads", "value"})


def test_pad_unknown_pads_unsupported(rng):
    with pytest.raises(plugrt.UnsupportedError, match="pads"):
        check_node("Pad", {"x": _x(rng, (2, 3)), "pads": np.array([1, 0, 0, 1], np.int64)})


# ------------------------------------------------------------ DepthToSpace and back


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("blocksize", [1, 2, 3])
def test_depth_to_space(rng, mode, blocksize):
    b = blocksize
    check_node("DepthToSpace", {"x": _x(rng, (2, 2 * b * b, 3, 2))}, {"blocksize": b, "mode": mode}, opset=13)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_])
def test_space_to_depth(rng, mode, dtype):
    check_node("SpaceToDepth", {"x": _x(rng, (1, 3, 4, 6), dtype)}, {"blocksize": 2, "mode": mode}, opset=21)
    check_node("DepthToSpace", {"x": _x(rng, (1, 8, 2, 3), dtype)}, {"blocksize": 2, "mode": mode}, opset=13)


# ------------------------------------------------------------------------- Resize


def _resize(x, attrs, scales=None, sizes=None, roi=None, opset=19, **tol):
    feeds = {"x": x, "roi": roi, "scales": scales, "sizes": sizes}
    if scales is None and sizes is None:
        raise ValueError("give scales or sizes")
    if sizes is not None and scales is None:
        feeds["scales"] = None
    return check_node("Resize", feeds, attrs, constants={"roi", "scales", "sizes"}, opset=opset, **(tol or F32))


def _f32(values):
    return np.array(values, np.float32)


CTMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("ctm", CTMS)
def test_resize_modes(rng, mode, ctm):
    x = _x(rng, (1, 2, 4, 5))
    for scales in ([1, 1, 1.5, 0.6], [1, 1, 0.5, 2.0]):
        _resize(x, {"mode": mode, "coordinate_transformation_mode": ctm}, scales=_f32(scales))
    _resize(x, {"mode": mode, "coordinate_transformation_mode": ctm}, sizes=np.array([1, 2, 7, 3], np.int64))


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_modes(rng, nearest_mode):
    x = _x(rng, (1, 1, 5, 6))
    for scales in ([1, 1, 2.0, 0.5], [1, 1, 1.6, 2.5]):
        for ctm in ("asymmetric", "half_pixel"):
            attrs = {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": ctm}
            _resize(x, attrs, scales=_f32(scales))


def test_resize_cubic_options(rng):
    x = _x(rng, (1, 2, 5, 4))
    for a, exclude in ((-0.5, 0), (-0.75, 1), (-0.6, 1)):
        attrs = {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude}
        _resize(x, attrs, scales=_f32([1, 1, 1.4, 0.75]))


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_tf_crop_and_resize(rng, mode):
    x = _x(rng, (1, 2, 5, 7))
    roi = _f32([0.4, -0.2, 0.9, 0.7])  # for axes (-1, 2) = (3, 2)
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
             "extrapolation_value": 10.0, "axes": [-1, 2]}
    _resize(x, attrs, sizes=np.array([4, 6], np.int64), roi=roi)
    roi = _f32([0, 0, -0.1, 0.2, 1, 1, 0.8, 1.3])
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -1.5}
    _resize(x, attrs, scales=_f32([1, 1, 1.4, 0.8]), roi=roi)


def test_resize_axes_keep_aspect_ratio(rng):
    x = _x(rng, (1, 2, 6, 8))
    for policy in ("stretch", "not_larger", "not_smaller"):
        for mode in ("nearest", "linear"):
            attrs = {"mode": mode, "keep_aspect_ratio_policy": policy, "axes": [3, -2]}
            _resize(x, attrs, sizes=np.array([4, 9], np.int64))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(rng, mode):
    x = _x(rng, (1, 1, 9, 11))
    for exclude in (0, 1):
        for scales in ([1, 1, 0.5, 0.3], [1, 1, 1.5, 0.45]):
            attrs = {"mode": mode, "antialias": 1, "exclude_outside": exclude}
            _resize(x, attrs, scales=_f32(scales))


def test_resize_ranks(rng):
    for mode in ("nearest", "linear", "cubic"):
        _resize(_x(rng, (1, 2, 3, 2, 4)), {"mode": mode}, scales=_f32([1, 1, 2, 1.5, 0.75]))
        _resize(_x(rng, (7,)), {"mode": mode}, scales=_f32([1.7]))
        _resize(_x(rng, (3, 4)), {"mode": mode}, sizes=np.array([5, 2], np.int64))


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.uint8, np.int8, np.int32, np.int64])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_dtypes(rng, dtype, mode):
    x = _x(rng, (1, 2, 4, 5), dtype)
    if np.dtype(dtype).kind in "iu":
        x = rng.integers(0, 100, x.shape).astype(dtype)
        if dtype in (np.uint8, np.int8):  # cubic overshoot past the range saturates
            x.flat[::3] = np.iinfo(dtype).max
    _resize(x, {"mode": mode}, scales=_f32([1, 1, 1.5, 0.8]), **TOL.get(dtype, dict(rtol=0, atol=0)))


def test_resize_bool_nearest(rng):
    _resize(_x(rng, (2, 3, 4), np.bool_), {"mode": "nearest"}, scales=_f32([1, 1.5, 0.75]))


def test_resize_old_opsets_and_upsample(rng):
    x = _x(rng, (1, 2, 4, 5))
    for mode in ("nearest", "linear"):
        for scales in ([1, 1, 2, 3], [1, 1, 0.5, 0.75], [1, 1, 1.5, 2.5]):
            check_node("Resize", {"x": x, "scales": _f32(scales)}, {"mode": mode}, constants={"scales"}, opset=10,
                       **F32)
            check_node("Upsample", {"x": x, "scales": _f32(scales)}, {"mode": mode}, constants={"scales"}, opset=9,
                       **F32)
            check_node("Upsample", {"x": x}, {"mode": mode, "scales": [float(s) for s in scales]}, opset=7,
                       **F32)
    empty = np.zeros(0, np.float32)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}
    check_node("Resize", {"x": x, "roi": empty, "scales": empty, "sizes": np.array([1, 2, 9, 3], np.int64)},
               attrs, constants={"roi", "scales", "sizes"}, opset=11)


def test_resize_empty_input_and_output(rng):
    _resize(np.zeros((0, 2, 3, 3), np.float32), {"mode": "linear"}, scales=_f32([1, 1, 2, 2]))
    _resize(_x(rng, (1, 2, 3, 3)), {"mode": "nearest"}, sizes=np.array([1, 2, 0, 3], np.int64))


def test_resize_unknown_scales_unsupported(rng):
    with pytest.raises(plugrt.UnsupportedError, match="scales"):
        check_node("Resize", {"x": _x(rng, (1, 1, 2, 2)), "roi": None, "scales": _f32([1, 1, 2, 2])},
                   {"mode": "linear"})


def test_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile every variant for sm_90 (no GPU needed)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.common.scalars import compute_type
        from plugrt_builtin_ops.spatial import pad as sk, permute as pk, resize as rk
        G = arr(np.int64, 2)
        T = arr(np.int64)
        for dt in ("float16", "bool", "int64"):
            for mode in sk.PAD_MODES:
                check(f"Pad {mode} {dt}", sk.pad_kernel(mode), [arr(dt), arr(dt), arr(dt), I64, I64, G], True)
            check(f"permute {dt}", pk.permute_kernel(), [arr(dt), arr(dt), I64, I64, T, T], True)
            check(f"nearest {dt}", rk.nearest_kernel(), [arr(dt), arr(dt), arr(dt), I64, I64, G, T], True)
        for dt in ("float16", "float32", "float64", "int8", "uint8", "int64", "uint64"):
            d = np.dtype(dt)
            c = scalar(np.float64 if d.kind in "iu" else compute_type(dt)[1])
            check(f"weighted {dt}", rk.weighted_kernel(d.str), [arr(dt), arr(dt), c, I64, I64, G, T, arr(c), I64, c, c],
                  d.kind == "f" and d != np.float64)
    """)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int32])
@pytest.mark.parametrize("lead, channels, pads, fill", [((2, 3, 4), 3, [0, 0, 0, 0, 0, 0, 0, 5], None),
                                                        ((2, 3, 4), 3, [0, 0, 0, 2, 0, 0, 0, 3], 7),
                                                        ((2, 3, 4), 3, [0, 0, 0, 0, 0, 0, 0, 0], None),
                                                        ((2, 3, 4), 5, [0, 0, 0, 4, 0, 0, 0, 7], None),
                                                        ((2, 3, 5), 3, [0, 0, 0, 0, 0, 0, 0, 1], None),
                                                        ((1, 3, 2), 2, [0, 0, 0, 1, 0, 0, 0, 0], 2),
                                                        ((1, 1, 3), 3, [0, 0, 0, 0, 0, 0, 0, 1], None)])
def test_pad_of_the_last_axis_runs_the_row_kernel(rng, dtype, lead, channels, pads, fill):
    """A channels-last image's channels padded (3 -> 8, 5 -> 16; 3 -> 4, where a vector
    spans two rows), and a fill input: the ``rows`` tactic, by 16-byte vectors where the
    output is whole vectors of float16 or float32 (``rows_vec8``), checked with every
    other tactic against the reference."""
    from plugrt.onnx.importer import import_model
    from plugrt.registry import default_registry
    from plugrt.testing import node_tactics, single_node_model

    feeds = {"x": _x(rng, (*lead, channels), dtype), "pads": np.array(pads, np.int64)}
    if fill is not None:
        feeds["value"] = np.array(fill, dtype)
    check_node("Pad", feeds, constants={"pads"})
    graph = import_model(single_node_model("Pad", feeds, {}, constants={"pads"}), registry=default_registry())
    vectors = int(np.prod(lead)) * (channels + pads[3] + pads[7]) % 8 == 0 and dtype != np.int32
    assert [t.name for t in node_tactics(graph, default_registry())] == ["rows_vec8"] * vectors + ["rows", "direct"]


def test_the_row_pad_kernel_compiles_for_the_gpu():
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.spatial.pad import row_pad_kernel, row_pad_vector_kernel
        for dt in (np.float16, np.float32, np.int64, np.bool_):
            a = arr(dt)
            check(f"rows {dt}", row_pad_kernel(), [a, a, a, types.int64, types.int64, types.int64, types.int64])
        for dt in (np.float16, np.float32):
            a = arr(dt)
            check(f"rows_vec8 {dt}", row_pad_vector_kernel(), [a, a, a] + [types.int64] * 4, True)
    """)
    assert not failures, "\\n".join(failures)
