"""Conv's tactic library: every GEMM tile (with and without a K split), the 1x1 GEMM and
the depthwise tactics against the reference, with and without a fused epilogue, their
heuristic order at real layer shapes, and their kernels typed for sm_90.

The simulator runs the small :data:`plugrt_builtin_ops.conv.implicit_gemm.SIM_CONFIGS` through the plugin's
own tactic list; each GPU tile of :data:`plugrt_builtin_ops.conv.implicit_gemm.GPU_CONFIGS` runs once on a
tiny problem.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from plugrt.launcher import PreparedLaunch
from plugrt.kernels import Epilogue, jit, no_epilogue
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from plugrt.testing import single_node_model
from plugrt_builtin_ops.conv import depthwise, implicit_gemm
from plugrt_builtin_ops.conv.geometry import ConvGeometry

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {F16: (2e-2, 2e-2), F32: (1e-4, 1e-5), F64: (1e-10, 1e-12)}


@jit(device=True)
def residual_relu(v, i, ops):
    """``max(v + residual, 0)``, counting its calls per element."""
    cuda.atomic.add(ops[2], i, 1)
    return max(v + ops[1][i], 0.0)


def _node(rng, x_shape, w_shape, attrs, dtype=F32, bias=True):
    feeds = {"x": rng.standard_normal(x_shape).astype(dtype), "w": rng.standard_normal(w_shape).astype(dtype)}
    if bias:
        feeds["b"] = rng.standard_normal(w_shape[0]).astype(dtype)
    registry = default_registry()
    graph = import_model(single_node_model("Conv", feeds, attrs, {"w", "b"}), registry=registry)
    node = graph.nodes[0]
    ins = [graph.info(n) for n in node.inputs]
    outs = [graph.info(n) for n in node.outputs]
    want = ReferenceExecutor(graph, registry).run({"x": feeds["x"]})[graph.outputs[0]].astype(F64)
    return graph, node, registry.op(node), ins, outs, feeds, want


def _run(graph, tactic, feeds, extra=()):
    """The tactic's output (and the epilogue's call counts when ``extra`` is given)."""
    node = graph.nodes[0]
    env = dict(graph.initializers())
    env.update(feeds)
    ins = [cuda.to_device(np.ascontiguousarray(env[n])) for n in node.inputs]
    shape = tuple(int(d) for d in graph.info(node.outputs[0]).shape)
    counts = cuda.to_device(np.zeros(shape, np.int64))
    if extra:
        ins += [cuda.to_device(np.ascontiguousarray(a)) for a in extra] + [counts]
    out = cuda.device_array(shape, dtype=graph.info(node.outputs[0]).dtype)
    workspace = cuda.device_array(tactic.workspace_bytes, np.uint8) if tactic.workspace_bytes else None
    for launch in tactic.launches(ins, [out], workspace):
        PreparedLaunch(launch)(0)
    cuda.synchronize()
    return out.copy_to_host(), counts.copy_to_host()


def _check(rng, x_shape, w_shape, attrs, dtype=F32, bias=True, make=None):
    """Every tactic (of ``make(op, node, ins, outs, epilogue)``, else the plugin's) without
    an epilogue and with a residual+ReLU one; returns the names."""
    graph, node, op, ins, outs, feeds, want = _node(rng, x_shape, w_shape, attrs, dtype, bias)
    make = make or (lambda op, node, ins, outs, epilogue: op.tactics(node, ins, outs, epilogue=epilogue))
    rtol, atol = TOL[dtype]
    residual = rng.standard_normal(want.shape).astype(dtype)
    cases = [(None, (), want),
             (Epilogue(residual_relu, len(node.inputs), label="Add+Relu"), (residual,),
              np.maximum(want + residual.astype(F64), 0.0))]
    names = None
    for epilogue, extra, expected in cases:
        tactics = make(op, node, ins, outs, epilogue)
        assert tactics
        for tactic in tactics:
            got, counts = _run(graph, tactic, feeds, extra)
            label = f"{tactic.name} {dict(tactic.params)} epilogue={epilogue is not None}"
            assert got.dtype == np.dtype(dtype), label
            if tactic.math == "tf32":  # tensor cores (GPU only): TF32's error, relative to max |expected|
                scale = max(float(np.max(np.abs(expected))), 1e-6)
                assert float(np.max(np.abs(got.astype(F64) - expected))) <= 5e-3 * scale, label
            else:
                np.testing.assert_allclose(got.astype(F64), expected, rtol=rtol, atol=atol, err_msg=label)
            if extra:
                np.testing.assert_array_equal(counts, 1, err_msg=label)
        names = [t.name for t in tactics]
    return names


# ----------------------------------------------------------------------------- GEMM tiles


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 8, 5, 4), (12, 8, 3, 3), dict(pads=[1, 1, 1, 0])),                   # long K: split variants too
    ((1, 4, 6, 5), (10, 2, 2, 3), dict(group=2, strides=[2, 1], dilations=[1, 2], pads=[0, 1, 1, 1])),
    ((2, 6, 7), (9, 6, 3), dict(strides=[2], pads=[1, 2])),                    # 1-D
    ((2, 12, 3, 4), (10, 12, 1, 1), {}),                                       # 1x1: plain GEMM
    ((1, 8, 5, 6), (16, 4, 1, 1), dict(group=2, strides=[2, 3])),             # 1x1 strided, grouped
])
def test_gemm_tactics_of_the_plugin(rng, x_shape, w_shape, attrs):
    names = _check(rng, x_shape, w_shape, attrs)
    pointwise = w_shape[2:] == (1, 1)
    family = "gemm_1x1_" if pointwise else "implicit_gemm_"
    gemm = [n for n in names if n.startswith(("gemm_1x1_", "implicit_gemm_"))]
    assert gemm and all(n.startswith(family) for n in gemm), names
    assert len(set(names)) == len(names)
    assert "direct2d" in names and names[-1] == "direct"
    wide = w_shape[0] // attrs.get("group", 1) >= 8
    assert names[0].startswith(family) == wide, names  # few output channels per group: direct2d first


def test_split_variants_offered_when_k_is_long(rng):
    # K = 64 * 3 * 3: long enough to split at the GPU's tiles as well as the simulator's.
    graph, node, op, ins, outs, _, _ = _node(rng, (2, 64, 5, 4), (12, 64, 3, 3), dict(pads=[1, 1, 1, 0]))
    tactics = op.tactics(node, ins, outs)
    split = [t for t in tactics if t.name.endswith("_splitk")]
    assert split and all(t.params["splits"] > 1 and t.workspace_bytes > 0 for t in split)
    assert all(t.name[:-len("_splitk")] in {u.name for u in tactics} for t in split)


@pytest.mark.parametrize("config", implicit_gemm.GPU_CONFIGS, ids=lambda c: c.label)
def test_gpu_tiles_on_a_tiny_problem(rng, config):
    """Each real tile, implicit (split and not) and 1x1, with an epilogue, on one problem
    that leaves most of the tile empty."""
    def implicit(op, node, ins, outs, epilogue):
        geo = op._kernel_geometry(node, ins, outs)
        return [implicit_gemm.gemm_tactic(geo, F32, config, s, epilogue or no_epilogue(3)) for s in (1, 2)]

    def pointwise(op, node, ins, outs, epilogue):
        geo = op._kernel_geometry(node, ins, outs)
        return [implicit_gemm.gemm_tactic(geo, F32, config, 1, epilogue or no_epilogue(3), pointwise=True)]

    assert _check(rng, (1, 3, 4, 3), (5, 3, 3, 3), dict(pads=[1, 0, 1, 1]), make=implicit) == [
        f"implicit_gemm_{config.label}", f"implicit_gemm_{config.label}_splitk"]
    _check(rng, (1, 18, 3, 2), (5, 18, 1, 1), {}, make=pointwise)


@pytest.mark.parametrize("dtype", [F16, F64])
def test_gemm_dtypes(rng, dtype):
    names = _check(rng, (1, 8, 4, 4), (8, 8, 3, 3), dict(pads=[1, 1, 1, 1]), dtype=dtype)
    assert any(n.startswith("implicit_gemm_") for n in names) == (dtype != F64)


# ----------------------------------------------------------------------------- depthwise


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 3, 6, 9), (3, 1, 3, 3), dict(group=3, pads=[1, 1, 1, 1])),                      # MobileNet 3x3
    ((2, 2, 7, 9), (2, 1, 3, 3), dict(group=2, strides=[2, 2], pads=[1, 1, 0, 1])),
    ((1, 2, 5, 11), (6, 1, 2, 3), dict(group=2, dilations=[2, 2], pads=[1, 2, 0, 1])),   # multiplier 3
    ((1, 3, 10), (3, 1, 5), dict(group=3, strides=[2], pads=[2, 2])),                    # 1-D
    ((1, 2, 6, 6), (2, 1, 3, 3), dict(group=2, pads=[-1, 0, 1, -1])),                    # negative pads crop
])
def test_depthwise(rng, x_shape, w_shape, attrs):
    names = _check(rng, x_shape, w_shape, attrs)
    widths = [int(n[len("depthwise_w"):]) for n in names if n.startswith("depthwise_")]
    assert widths and widths[0] == max(widths) and 1 in widths, names
    if w_shape[0] // attrs["group"] < 8:
        assert names[0].startswith("depthwise_w"), names


@pytest.mark.parametrize("dtype", [F16, F64])
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_dtypes(rng, dtype, bias):
    _check(rng, (1, 2, 4, 5), (2, 1, 3, 3), dict(group=2, pads=[1, 1, 1, 1]), dtype=dtype, bias=bias,
           make=lambda op, node, ins, outs, epilogue: depthwise.depthwise_tactics(
               op._kernel_geometry(node, ins, outs), dtype, epilogue or no_epilogue(len(node.inputs))))


def test_depthwise_only_for_one_input_channel_per_group(rng):
    graph, node, op, ins, outs, _, _ = _node(rng, (1, 4, 5, 5), (4, 2, 3, 3), dict(group=2))
    assert not any(t.name.startswith("depthwise") for t in op.tactics(node, ins, outs))


# ----------------------------------------------------------------------------- order at real shapes


def _geo(n, c, m, hw, k, stride=1, pad=0, group=1):
    out = (hw + 2 * pad - k) // stride + 1
    return ConvGeometry(n, c, m, group, (hw, hw), (k, k), (out, out), (stride, stride), (1, 1), (pad, pad))


def _gpu_order(geo):
    return [t.name for t in implicit_gemm.gemm_tactics(geo, F32, no_epilogue(3), implicit_gemm.GPU_CONFIGS)]


def test_gpu_order_follows_the_shape():
    # batch-1 late ResNet layer: 8 output tiles, K = 4608: split K first
    late = _gpu_order(_geo(1, 512, 512, 7, 3, pad=1))
    assert late[0].endswith("_splitk") and any(not n.endswith("_splitk") for n in late)
    # batch-32 early layer: 64 channels, 100k pixels: a 64-row tile, wide along the pixels
    early = _gpu_order(_geo(32, 64, 64, 56, 3, pad=1))
    assert early[0] == "implicit_gemm_64x128x16_4x8"
    assert not any(n.startswith("implicit_gemm_128x") for n in early)  # 128 rows for 64 channels: not offered
    assert not any(n.endswith("_splitk") for n in early)
    # the stem: K = 3 * 7 * 7 = 147 is short, BK 8 wastes least
    assert _gpu_order(_geo(1, 3, 64, 224, 7, stride=2, pad=3))[0] == "implicit_gemm_64x64x8_4x4"
    # 1x1 bottleneck convolution: plain GEMM tiles only
    assert all(n.startswith("gemm_1x1_") for n in _gpu_order(_geo(1, 64, 256, 56, 1)))
    # few output channels: only the 32-row tile
    assert _gpu_order(_geo(1, 16, 24, 56, 1)) == ["gemm_1x1_32x64x16_2x4"]


def test_estimate_prefers_split_exactly_when_tiles_are_few():
    config = implicit_gemm.GPU_CONFIG
    late = _geo(1, 512, 512, 7, 3, pad=1)
    splits = implicit_gemm.choose_splits(late, config)
    assert implicit_gemm.estimated_cycles(late, config, splits) < implicit_gemm.estimated_cycles(late, config, 1)
    big = _geo(32, 256, 256, 28, 3, pad=1)
    assert implicit_gemm.choose_splits(big, config) == 1


def test_plugin_order_for_depthwise_and_float64(rng):
    graph, node, op, ins, outs, _, _ = _node(rng, (1, 4, 6, 6), (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1]))
    names = [t.name for t in op.tactics(node, ins, outs)]
    assert names[:3] == ["depthwise_w4", "depthwise_w1", "direct2d"] and names[-1] == "direct"
    graph, node, op, ins, outs, _, _ = _node(rng, (1, 4, 6, 6), (4, 1, 3, 3), dict(group=4), dtype=F64)
    assert [t.name for t in op.tactics(node, ins, outs)] == ["depthwise_w4", "depthwise_w1", "direct2d", "direct"]


# ----------------------------------------------------------------------------- GPU typing


def test_new_kernels_compile_for_the_gpu():
    """Every GPU tile (implicit and 1x1) and depthwise geometries, typed for sm_90;
    float16/float32 kernels free of float64 arithmetic."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt.kernels import no_epilogue
        from plugrt_builtin_ops.conv import depthwise as dk, geometry as cgeo, implicit_gemm as cg

        @cuda.jit(device=True)
        def epi(v, i, ops):
            cuda.atomic.add(ops[2], i, 1)
            return max(v + ops[1][i], float32(0))

        def operands(dt):
            return types.Tuple((arr(np.int64), arr(dt), arr(np.int64)))

        plain = no_epilogue(3).fn
        for dt in ("float16", "float32"):
            gemm = [arr(dt), arr(dt), arr(dt), arr(dt), arr(np.float32), arr(np.int64), arr(np.int64)]
            for index, c in enumerate(cg.GPU_CONFIGS):  # (the other tiles differ from the first in constants)
                for pointwise in (False, True) if index == 0 else (False,):
                    check(f"conv gemm {c.label} pointwise={pointwise} {dt}",
                          cg.gemm_kernel(c.bm, c.bn, c.bk, c.tm, c.tn, epi, pointwise), gemm + [operands(dt)], True)
            c = cg.GPU_CONFIG
            check(f"conv gemm 1x1 no epilogue {dt}", cg.gemm_kernel(c.bm, c.bn, c.bk, c.tm, c.tn, plain, True),
                  gemm + [types.Tuple((arr(np.int64),))], True)
        for dt in ("float16", "float32", "float64"):
            acc = cgeo.compute_type(dt)
            args = [arr(dt), arr(dt), arr(dt), arr(dt), I64, I64, arr(np.int64)]
            for window in ((3, 3, 1, 1, 1, 1), (3, 3, 2, 2, 1, 1), (5, 5, 1, 1, 2, 2), (1, 7, 1, 1, 1, 1)):
                for tw in dk.OUTPUTS_PER_THREAD if window[2] == 1 and window[0] == 3 else dk.OUTPUTS_PER_THREAD[-1:]:
                    check(f"depthwise {window} w{tw} {dt}", dk.depthwise_kernel(acc, *window, tw, epi),
                          args + [operands(dt)], dt != "float64")
            check(f"depthwise no epilogue {dt}", dk.depthwise_kernel(acc, 3, 3, 1, 1, 1, 1, 4, plain),
                  args + [types.Tuple((arr(np.int64),))], dt != "float64")
    """)
    assert not failures, "\n".join(failures)
