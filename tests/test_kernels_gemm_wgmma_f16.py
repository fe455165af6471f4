"""The Hopper ``wgmma`` FP16 tactic of MatMul and Gemm (float32 accumulation).

FP16 operands travel as float32 views (two K-neighbours per word), so the copies, the
swizzle and the descriptors are the TF32 kernel's; each ``wgmma`` is k16. In the simulator
one warpgroup over 8 or 16 columns runs with the MMA done by scalar FMAs on the same
swizzled words (each split into its two halves): the copies, edges, ring, split K, a
MatMul weight held transposed and the epilogue are checked against float64 there. On a
GPU the production tiles are compared with float64.
"""

from __future__ import annotations

import numpy as np
import pytest
from plugrt.device import simulated
from plugrt.kernels import Epilogue, no_epilogue
from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.testing import run_tactic, single_node_model
from plugrt_builtin_ops.matmul import plan as matmul_plan
from plugrt_builtin_ops.matmul import tactics as matmul_tactics
from plugrt_builtin_ops.matmul import wgmma, wgmma_f16
from test_kernels_epilogue import _node, _run, residual_relu, residual_relu_numpy
from test_kernels_gemm_wgmma import PRODUCTION, TINY

F16 = np.float16
#: FP16 output rounding (2^-11) plus float32 accumulation, relative to the largest output.
F16_TOL = 2e-3


@pytest.fixture(autouse=True)
def tiny_configs(monkeypatch):
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", TINY)


def rand(rng, shape):
    return rng.standard_normal(shape).astype(F16)


def exact(feeds, op_type, attrs) -> np.ndarray:
    """The product in float64 of the FP16 inputs (what the tensor cores multiply exactly)."""
    a, b = feeds["a"].astype(np.float64), feeds["b"].astype(np.float64)
    if op_type == "MatMul":
        return a @ b
    b = b.T if attrs.get("transB") else b
    out = attrs.get("alpha", 1.0) * (a @ b)
    if "c" in feeds:
        out = out + attrs.get("beta", 1.0) * feeds["c"].astype(np.float64)
    return out


def close(got, want, label=""):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-6)
    err = float(np.max(np.abs(got - want)))
    assert err <= F16_TOL * scale, f"{label}: max error {err:.3g} > {F16_TOL} * {scale:.3g}"


def offered(op_type, feeds, attrs, constants=()):
    """The node's FP16 wgmma tactics as the op offers them (``constants``: inputs made
    initializers, as a weight is)."""
    model = single_node_model(op_type, feeds, attrs, constants)
    graph = import_model(model, registry=default_registry())
    node = graph.nodes[0]
    op = default_registry().op(node)
    tactics = op.tactics(node, [graph.info(n) for n in node.inputs], [graph.info(n) for n in node.outputs])
    return graph, [t for t in tactics if t.name.startswith("wgmma_f16")]


CASES = [
    # a MatMul weight [K, N]: held transposed; ragged M and N, a partial last K tile
    ("MatMul", {"a": (70, 72), "b": (72, 12)}, {}, ("b",)),
    # Gemm with B K-contiguous (transB), C broadcast, alpha and beta
    ("Gemm", {"a": (64, 40), "b": (16, 40), "c": (16,)}, {"transB": 1, "alpha": 0.5, "beta": 2.0}, ()),
    # A's batch folded into M, several K tiles around the ring
    ("MatMul", {"a": (2, 64, 192), "b": (192, 16)}, {}, ("b",)),
    # a Gemm weight [K, N] without transB: held transposed
    ("Gemm", {"a": (64, 64), "b": (64, 8)}, {}, ("b",)),
]


@pytest.mark.parametrize("op_type, shapes, attrs, constants", CASES)
def test_wgmma_f16_matches_float64(rng, op_type, shapes, attrs, constants):
    feeds = {k: rand(rng, v) for k, v in shapes.items()}
    graph, tactics = offered(op_type, feeds, attrs, constants)
    assert tactics and all(t.math == "" for t in tactics)
    assert all(t.params["held_b"] == ("b" in constants and not attrs.get("transB")) for t in tactics)
    run_feeds = {k: v for k, v in feeds.items() if k not in constants}
    for tactic in tactics:
        got = run_tactic(graph, tactic, run_feeds)[0]
        assert got.dtype == F16
        close(got, exact(feeds, op_type, attrs), f"{op_type} {tactic.name}")


@pytest.mark.parametrize("splits", [2, 3])
def test_split_k(rng, splits):
    """K 192 = three tiles of 64 halves split 2+1 or 1+1+1."""
    feeds = {"a": rand(rng, (64, 192)), "b": rand(rng, (8, 192))}
    meta, offs = matmul_plan.gemm_plan((64, 192), (8, 192), None, False, True, 1.0, 0.0, False)
    tactic = wgmma_f16._half_tactic(TINY[0], meta, offs, lambda a, b: (a.view(np.float32), b.view(np.float32)), False,
                                splits, no_epilogue(2), 1.0, 0.0, None, None, None)
    assert tactic.params["splits"] == splits and tactic.workspace_bytes > 0
    graph = import_model(single_node_model("Gemm", feeds, {"transB": 1}), registry=default_registry())
    close(run_tactic(graph, tactic, feeds)[0], exact(feeds, "Gemm", {"transB": 1}), f"splits {splits}")


def test_epilogue_runs_once_per_element(rng):
    feeds = {"a": rand(rng, (64, 64)), "b": rand(rng, (8, 64))}
    graph, node, *_ = _node("Gemm", feeds, {"transB": 1})
    residual = rand(rng, (64, 8))
    epilogue = Epilogue(residual_relu, len(node.inputs), label="Add+Relu+Mul")
    want = residual_relu_numpy(exact(feeds, "Gemm", {"transB": 1}), residual.astype(np.float64))
    meta, offs = matmul_plan.gemm_plan((64, 64), (8, 64), None, False, True, 1.0, 0.0, False)
    for tactic in wgmma_f16.wgmma_half_tactics(F16, F16, F16, meta, offs, epilogue=epilogue):
        got, counts = _run(graph, tactic, feeds, [residual])
        np.testing.assert_array_equal(counts, 1, err_msg=f"{tactic.name}: epilogue calls per element")
        close(got, want, tactic.name)


def test_a_held_weight_is_transposed_and_uploaded_once_for_every_shape(rng):
    """A new shape enumerates the tactics again (a dynamic profile's specialization): the
    weight they hold transposed is the same device array, not a fresh copy per shape."""
    from numba import cuda

    b = rand(rng, (72, 16))
    held = []
    for m in (70, 33):
        feeds = {"a": rand(rng, (m, 72)), "b": b}
        graph = import_model(single_node_model("MatMul", feeds, {}, ("b",)), registry=default_registry())
        tactic = wgmma_f16.wgmma_half_tactics(F16, F16, F16, *matmul_plan.product_plan((m, 72), (72, 16)),
                                              epilogue=no_epilogue(2), b_value=b)[0]
        out = cuda.to_device(np.zeros((m, 16), F16))
        ins = [cuda.to_device(feeds["a"]), cuda.to_device(b)]
        launches = tactic.launches(ins, [out], cuda.to_device(np.zeros(1, np.uint8)))
        held.append(launches[0].args[2])
        close(run_tactic(graph, tactic, {"a": feeds["a"]})[0], exact(feeds, "MatMul", {}), f"M {m}")
    assert _address(held[0]) == _address(held[1])


def _address(array) -> int:
    """Where a device array's data starts (the simulator's arrays wrap a host array)."""
    interface = getattr(array, "__cuda_array_interface__", None) if not simulated() else None
    return interface["data"][0] if interface else array._ary.__array_interface__["data"][0]


def test_products_that_do_not_suit_are_not_offered(rng):
    plan = matmul_plan.product_plan
    kw = {"epilogue": no_epilogue(2)}
    # K = 12: 16-byte chunks (8 halves) would straddle rows
    assert not wgmma_f16.wgmma_half_tactics(F16, F16, F16, *plan((64, 12), (12, 8)), b_value=np.ones((12, 8)), **kw)
    # B [K, N] that is no constant: nothing to hold transposed
    assert not wgmma_f16.wgmma_half_tactics(F16, F16, F16, *plan((64, 16), (16, 8)), **kw)
    # float32 operands are TF32's; float16 output of float32 operands is nobody's here
    assert not wgmma_f16.wgmma_half_tactics(np.float32, np.float32, np.float32, *plan((64, 16), (16, 8)), **kw)
    assert wgmma_f16.wgmma_half_tactics(F16, F16, F16, *plan((64, 16), (16, 8)), b_value=np.ones((16, 8)), **kw)


def test_misaligned_operands_fall_back(rng):
    """An A array 4 bytes off a 16-byte boundary: the fallback tactic runs."""
    from numba import cuda
    from plugrt.launcher import PreparedLaunch

    a, b = rand(rng, (64, 16)), rand(rng, (8, 16))
    meta, offs = matmul_plan.gemm_plan(a.shape, b.shape, None, False, True, 1.0, 0.0, False)
    graph = import_model(single_node_model("Gemm", {"a": a, "b": b}, {"transB": 1}), registry=default_registry())
    node = graph.nodes[0]
    tactics = default_registry().op(node).tactics(node, [graph.info(n) for n in node.inputs],
                                                  [graph.info(n) for n in node.outputs])
    fallback = next(t for t in tactics if t.name.startswith("tiled"))
    tactic = wgmma_f16.wgmma_half_tactics(F16, F16, F16, meta, offs, epilogue=no_epilogue(2), fallback=fallback)[0]
    room = cuda.device_array(a.size + 2, F16)
    room[2:].copy_to_device(a.ravel())
    out = cuda.device_array((64, 8), F16)
    launches = tactic.launches([room[2:].reshape(a.shape), cuda.to_device(b)], [out], None)
    assert all("wgmma" not in getattr(launch.kernel, "__name__", "") for launch in launches)
    for launch in launches:
        PreparedLaunch(launch)(0)
    cuda.synchronize()
    close(out.copy_to_host(), exact({"a": a, "b": b}, "Gemm", {"transB": 1}), "fallback")


def test_production_order(monkeypatch):
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", PRODUCTION)
    meta, offs = matmul_plan.product_plan((4096, 4096), (4096, 4096))
    tactics = matmul_tactics.gemm_tactics(F16, F16, F16, meta, offs, epilogue=no_epilogue(2),
                                          b_value=np.ones((4096, 4096), F16))
    assert [t.name for t in tactics[:2]] == ["wgmma_f16_128x256x64_s4", "wgmma_f16_128x128x64_s5"]
    assert tactics[0].params == {"bm": 128, "bn": 256, "bk": 64, "wgs": 2, "stages": 4, "splits": 1, "held_b": True,
                                 "even": True}
    if not simulated():  # last on a GPU, each tile's ragged twins: whole, then split-K
        assert [t.name for t in tactics[-4:]] == ["wgmma_f16_128x256x64_s4_ragged", "wgmma_f16_128x128x64_s5_ragged",
                                                  "wgmma_f16_128x256x64_s4_splitk_ragged",
                                                  "wgmma_f16_128x128x64_s5_splitk_ragged"]


def test_wgmma_f16_kernels_compile_for_the_gpu():
    """sm_90 typing of the production FP16 kernels (k16 wgmma intrinsics)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt_builtin_ops.matmul import wgmma as W

        @cuda.jit(device=True)
        def epi(v, i, ops):
            return max(v + float32(ops[1][i]), float32(0))

        f32, f16, i64 = arr(np.float32), arr(np.float16), arr(np.int64)
        args = [f16, f32, f32, f16, f32, i64, i64, types.float32, types.float32, I64, I64, types.Tuple((i64, f16))]
        for config in W.WGMMA_CONFIGS:
            for split in (False, True):
                check(f"{config.name} f16 {split}", W.wgmma_kernel(config, True, True, True, split, epi, False, True),
                      args, True)
    """)
    assert not failures, "\\n".join(failures)


# ----------------------------------------------------------------------------- GPU only


@pytest.mark.skipif(simulated(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("op_type, shapes, attrs, constants", [
    ("MatMul", {"a": (300, 200), "b": (200, 520)}, {}, ("b",)),          # ragged, B held transposed
    ("Gemm", {"a": (256, 160), "b": (256, 160)}, {"transB": 1}, ()),    # B K-contiguous
    ("MatMul", {"a": (4, 128, 768), "b": (768, 256)}, {}, ("b",)),       # batch folded into M
])
def test_wgmma_f16_on_the_gpu(rng, monkeypatch, op_type, shapes, attrs, constants):
    """Production tiles: the tensor cores against float64."""
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", PRODUCTION)
    feeds = {k: rand(rng, v) for k, v in shapes.items()}
    graph, tactics = offered(op_type, feeds, attrs, constants)
    assert tactics
    run_feeds = {k: v for k, v in feeds.items() if k not in constants}
    want = exact(feeds, op_type, attrs)
    for tactic in tactics:
        close(run_tactic(graph, tactic, run_feeds)[0], want, tactic.name)
