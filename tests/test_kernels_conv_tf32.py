"""The TF32 tensor-core tactic of Conv against the reference.

In the simulator the warp step is the scalar emulation of ``mma.sync`` (same fragment
layout, operands rounded to TF32 the same way), at a one-warp tile; on a GPU the real
tensor cores run the production tile. Tolerance: TF32's, relative to max |reference|.
"""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.device import simulated
from plugrt.kernels import Epilogue
from plugrt_builtin_ops.conv import tf32 as conv_tf32
from plugrt_builtin_ops.matmul.tf32 import Tf32Config

from test_kernels_conv_tactics import F64, _node, _run, residual_relu

#: One warp: 16 output channels x 8 pixels, K step 8.
TINY = Tf32Config(1, 1, 1, 1, 8)
TF32_TOL = 5e-3
PRODUCTION = conv_tf32.GPU_CONFIGS


@pytest.fixture(autouse=True)
def tiny_tiles(monkeypatch):
    """The one-warp tile on either backend (on a GPU it runs the real mma.sync), so the
    small problems here fill a tile."""
    monkeypatch.setattr(conv_tf32, "SIM_CONFIGS", (TINY,))
    monkeypatch.setattr(conv_tf32, "GPU_CONFIGS", (TINY,))


def _close(got, want, label):
    scale = max(float(np.max(np.abs(want))), 1e-6)
    err = float(np.max(np.abs(got.astype(F64) - want)))
    assert err <= TF32_TOL * scale, f"{label}: max error {err:.3g} > {TF32_TOL} * {scale:.3g}"


@pytest.mark.parametrize("x_shape, w_shape, attrs, bias", [
    ((2, 4, 5, 5), (20, 4, 3, 3), dict(pads=[1, 1, 1, 1]), True),                   # ragged channel and pixel tiles
    ((1, 6, 6, 5), (32, 3, 2, 3), dict(group=2, strides=[2, 1], dilations=[1, 2], pads=[0, 1, 1, 1]), False),
    ((2, 5, 9), (16, 5, 3), dict(strides=[2], pads=[1, 2]), True),                   # 1-D
    ((2, 12, 3, 3), (16, 12, 1, 1), {}, True),                                       # 1x1: the pointwise form
])
def test_tf32_conv_matches_the_reference(rng, x_shape, w_shape, attrs, bias):
    graph, node, op, ins, outs, feeds, want = _node(rng, x_shape, w_shape, attrs, bias=bias)
    tactics = [t for t in op.tactics(node, ins, outs) if t.math == "tf32"]
    assert tactics and all(t.name.startswith("tf32_") for t in tactics)
    maths = [t.math for t in op.tactics(node, ins, outs)]
    assert maths == [""] * (len(maths) - len(tactics)) + ["tf32"] * len(tactics)  # last: the top tuner level times them
    for tactic in tactics:
        got, _ = _run(graph, tactic, feeds)
        _close(got, want, tactic.name)


@pytest.mark.parametrize("splits", [1, 3])
def test_tf32_conv_epilogue_once_with_and_without_split(rng, splits):
    """The fused residual + ReLU runs once per element: at the store, or in the split-K sum."""
    graph, node, op, ins, outs, feeds, want = _node(rng, (1, 8, 4, 4), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1]))
    residual = rng.standard_normal(want.shape).astype(np.float32)
    epilogue = Epilogue(residual_relu, len(node.inputs), label="Add+Relu")
    geo = op._kernel_geometry(node, ins, outs)
    tactic = conv_tf32.conv_tf32_tactic(geo, TINY, splits, epilogue)
    assert tactic.params["splits"] == splits and (tactic.workspace_bytes > 0) == (splits > 1)
    got, counts = _run(graph, tactic, feeds, (residual,))
    np.testing.assert_array_equal(counts, 1)
    _close(got, np.maximum(want + residual.astype(F64), 0.0), tactic.name)


def test_tf32_conv_offered_for_float32_problems_of_a_tile_or_more(rng):
    graph, node, op, ins, outs, _, _ = _node(rng, (1, 4, 4, 4), (16, 4, 3, 3), {}, dtype=np.float16)
    assert not [t for t in op.tactics(node, ins, outs) if t.math == "tf32"]
    graph, node, op, ins, outs, _, _ = _node(rng, (1, 4, 4, 4), (12, 4, 3, 3), {})  # 12 channels < 16 a tile
    assert not [t for t in op.tactics(node, ins, outs) if t.math == "tf32"]
    with pytest.raises(ValueError, match="stage evenly"):
        conv_tf32.check(Tf32Config(1, 1, 1, 8, 8))  # 64 pixels a tile: more than the block's 32 threads


def test_tf32_conv_kernels_compile_for_the_gpu():
    """sm_90 typing of the production tile (tensor cores and the emulated sibling), both forms."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt_builtin_ops.conv import tf32 as conv_tf32

        @cuda.jit(device=True)
        def epi(v, i, ops):
            return max(v + ops[1][i], float32(0))

        f32, i64 = arr(np.float32), arr(np.int64)
        args = [f32, f32, f32, f32, f32, i64, i64, types.Tuple((i64, f32))]
        for config in conv_tf32.GPU_CONFIGS:
            for pointwise in (False, True):
                for emulated in (False, True):
                    check(f"{config.name} pointwise={pointwise} emulated={emulated}",
                          conv_tf32.conv_tf32_kernel(config, epi, pointwise, emulated), args, True)
    """)
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(simulated(), reason="tensor cores need a GPU")
def test_tf32_conv_production_tile_on_the_gpu(rng, monkeypatch):
    monkeypatch.setattr(conv_tf32, "GPU_CONFIGS", PRODUCTION)
    graph, node, op, ins, outs, feeds, want = _node(rng, (2, 64, 14, 14), (128, 64, 3, 3), dict(pads=[1, 1, 1, 1]))
    geo = op._kernel_geometry(node, ins, outs)
    for splits in (1, 2):
        got, _ = _run(graph, conv_tf32.conv_tf32_tactic(geo, PRODUCTION[0], splits), feeds)
        _close(got, want, f"splits {splits}")
