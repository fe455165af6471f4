"""The Hopper ``wgmma`` TF32 tactic of MatMul and Gemm.

In the simulator the kernel runs with one warpgroup over 8 or 16 columns and the warpgroup
MMA done by scalar FMAs on the same swizzled shared tiles (operands truncated to TF32 as the
tensor cores read them): the copies (16-byte K chunks and 4-byte transposing ones), the
zero-filled edges, the ring of stages, split K, batches and the epilogue are checked
against the reference there. On a GPU the real ``wgmma`` kernels (production tiles) are
compared with float64 and with their emulated sibling, which checks the descriptors.
"""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.device import simulated
from plugrt.kernels import Epilogue, no_epilogue
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from plugrt.testing import run_tactic, single_node_model
from plugrt_builtin_ops.matmul import simt, tf32, wgmma
from plugrt_builtin_ops.matmul import plan as matmul_plan, tactics as matmul_tactics
from plugrt_builtin_ops.matmul.simt import SimtConfig
from plugrt_builtin_ops.matmul.tf32 import Tf32Config
from plugrt_builtin_ops.matmul.wgmma import WgmmaConfig

from test_kernels_epilogue import _node, _reference, _run, residual_relu, residual_relu_numpy

F32 = np.float32
TF32_TOL = 5e-3
#: One warpgroup over 8 columns, 3 stages (one tile ahead); over 16 columns, 4 stages.
TINY = (WgmmaConfig(1, 8, 3), WgmmaConfig(1, 16, 4))
PRODUCTION = wgmma.WGMMA_CONFIGS


@pytest.fixture(autouse=True)
def tiny_configs(monkeypatch):
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", TINY)
    monkeypatch.setattr(simt, "SIMT_CONFIGS", (SimtConfig(8, 8, 4, 4, 4),))
    monkeypatch.setattr(tf32, "TF32_CONFIGS", (Tf32Config(1, 1, 1, 1, 8),))


def rand(rng, shape):
    return rng.standard_normal(shape).astype(F32)


def plan(op_type, feeds, attrs):
    if op_type == "Gemm":
        c = feeds.get("c")
        return matmul_plan.gemm_plan(feeds["a"].shape, feeds["b"].shape, None if c is None else c.shape,
                                        bool(attrs.get("transA")), bool(attrs.get("transB")),
                                        attrs.get("alpha", 1.0), attrs.get("beta", 1.0), False)
    return matmul_plan.product_plan(feeds["a"].shape, feeds["b"].shape)


def close(got, want, label=""):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-6)
    err = float(np.max(np.abs(got - want)))
    assert err <= TF32_TOL * scale, f"{label}: max error {err:.3g} > {TF32_TOL} * {scale:.3g}"


def wgmma_tactics(op_type, feeds, attrs):
    """The node's wgmma tactics as the op offers them."""
    graph = import_model(single_node_model(op_type, feeds, attrs), registry=default_registry())
    node = graph.nodes[0]
    op = default_registry().op(node)
    tactics = op.tactics(node, [graph.info(n) for n in node.inputs], [graph.info(n) for n in node.outputs])
    return graph, [t for t in tactics if t.name.startswith("wgmma")]


CASES = [
    # ragged M, N and K (a partial last K tile): A by 16-byte chunks, B ([K, N]) by 4-byte transposing copies
    ("MatMul", {"a": (70, 44), "b": (44, 12)}, {}),
    # B K-contiguous (16-byte chunks both), C broadcast, alpha and beta
    ("Gemm", {"a": (64, 36), "b": (16, 36), "c": (16,)}, {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    # A M-contiguous: 4-byte copies for A too
    ("Gemm", {"a": (40, 64), "b": (40, 8)}, {"transA": 1}),
    # batched, several K tiles around the ring
    ("MatMul", {"a": (2, 64, 96), "b": (2, 96, 16)}, {}),
]


@pytest.mark.parametrize("op_type, shapes, attrs", CASES)
def test_wgmma_matches_the_reference(rng, op_type, shapes, attrs):
    feeds = {k: rand(rng, v) for k, v in shapes.items()}
    graph, tactics = wgmma_tactics(op_type, feeds, attrs)
    assert tactics and all(t.math == "tf32" for t in tactics)
    want = ReferenceExecutor(graph, default_registry()).run(feeds)[graph.outputs[0]]
    for tactic in tactics:
        close(run_tactic(graph, tactic, feeds)[0], want, f"{op_type} {tactic.name}")


@pytest.mark.parametrize("op_type, shapes, attrs", [
    ("MatMul", {"a": (128, 64), "b": (64, 8)}, {}),
    ("Gemm", {"a": (128, 64), "b": (8, 64)}, {"transB": 1}),
])
def test_whole_tiles_copy_in_blocks(rng, op_type, shapes, attrs):
    """Whole tiles and two warpgroups (8 warps): each thread's copies of a tile are one
    block of fixed offsets (16-byte chunks of A; 4-byte copies of B or 16-byte ones)."""
    feeds = {k: rand(rng, v) for k, v in shapes.items()}
    meta, offs = plan(op_type, feeds, attrs)
    tactic = wgmma.wgmma_tactic(WgmmaConfig(2, 8, 3), meta, offs, epilogue=no_epilogue(2))
    graph = import_model(single_node_model(op_type, feeds, attrs), registry=default_registry())
    want = ReferenceExecutor(graph, default_registry()).run(feeds)[graph.outputs[0]]
    close(run_tactic(graph, tactic, feeds)[0], want, op_type)


@pytest.mark.parametrize("splits", [2, 3])
def test_split_k(rng, splits):
    """K 96 = three tiles split 2+1 or 1+1+1; partial sums in the workspace."""
    feeds = {"a": rand(rng, (64, 96)), "b": rand(rng, (96, 8))}
    meta, offs = plan("MatMul", feeds, {})
    tactic = wgmma.wgmma_tactic(TINY[0], meta, offs, epilogue=no_epilogue(2), splits=splits)
    assert tactic.params["splits"] == splits and tactic.workspace_bytes > 0
    graph = import_model(single_node_model("MatMul", feeds), registry=default_registry())
    close(run_tactic(graph, tactic, feeds)[0], feeds["a"].astype(np.float64) @ feeds["b"], f"splits {splits}")


@pytest.mark.parametrize("m, k, splits", [(64, 96, 3), (70, 44, 1), (5, 64, 2)])
def test_the_split_twin_runs_the_same_kernels_at_every_size(rng, m, k, splits):
    """The split-K ragged twin (``NAME_splitk_ragged``): bounds-checked, the split kernel and
    its reduction at every size, one split included, with the residual epilogue applied once
    per element; its kernels are the same at every size (what a dynamic profile's other
    shapes run)."""
    kernels = set()
    for mm, kk, s in ((m, k, splits), (m + 3, k + 4, 1)):
        feeds = {"a": rand(rng, (mm, kk)), "b": rand(rng, (kk, 8))}
        graph, node, op, ins, outs = _node("MatMul", feeds, {})
        residual = rand(rng, (mm, 8))
        epilogue = Epilogue(residual_relu, len(node.inputs), label="Add+Relu+Mul")
        meta, offs = plan("MatMul", feeds, {})
        tactic = wgmma.wgmma_tactic(TINY[0], meta, offs, epilogue=epilogue, ragged=True, split_twin=True, splits=s)
        assert tactic.name == TINY[0].name + simt.SPLIT_RAGGED and tactic.params["splits"] == "any"
        assert tactic.workspace_bytes >= 4 * mm * 8
        got, counts = _run(graph, tactic, feeds, [residual])
        np.testing.assert_array_equal(counts, 1, err_msg=f"{tactic.name}: epilogue calls per element")
        want = residual_relu_numpy(_reference(graph, feeds).astype(np.float64), residual.astype(np.float64))
        close(got, want, f"{tactic.name} {mm}x{kk}, {s} split(s)")
        from numba import cuda

        ins = [cuda.to_device(feeds["a"]), cuda.to_device(feeds["b"]), cuda.to_device(residual),
               cuda.to_device(np.zeros((mm, 8), np.int64))]
        launches = tactic.launches(ins, [cuda.device_array((mm, 8), F32)],
                                   cuda.device_array(tactic.workspace_bytes, np.uint8))
        kernels.add(tuple(launch.kernel for launch in launches))
    assert len(kernels) == 1 and len(next(iter(kernels))) == 2


def test_epilogue_runs_once_per_element(rng):
    feeds = {"a": rand(rng, (64, 20)), "b": rand(rng, (20, 8))}
    graph, node, op, ins, outs = _node("MatMul", feeds, {})
    residual = rand(rng, (64, 8))
    epilogue = Epilogue(residual_relu, len(node.inputs), label="Add+Relu+Mul")
    want = residual_relu_numpy(_reference(graph, feeds).astype(np.float64), residual.astype(np.float64))
    meta, offs = plan("MatMul", feeds, {})
    for splits in (1, 2):
        tactic = wgmma.wgmma_tactic(TINY[0], meta, offs, epilogue=epilogue, splits=splits)
        got, counts = _run(graph, tactic, feeds, [residual])
        np.testing.assert_array_equal(counts, 1, err_msg=f"{tactic.name}: epilogue calls per element")
        close(got, want, tactic.name)


def test_layouts_that_do_not_suit_are_not_offered(rng):
    # K = 10 with A K-contiguous: 16-byte chunks would straddle rows
    assert wgmma.operand_layouts(*matmul_plan.product_plan((64, 10), (10, 8))) is None
    _, tactics = wgmma_tactics("MatMul", {"a": rand(rng, (64, 10)), "b": rand(rng, (10, 8))}, {})
    assert not tactics
    assert wgmma.operand_layouts(*matmul_plan.product_plan((64, 12), (12, 8))) == (True, False)
    # too small for the tile: the other families serve it
    _, tactics = wgmma_tactics("MatMul", {"a": rand(rng, (16, 12)), "b": rand(rng, (12, 8))}, {})
    assert all(t.name.endswith("_ragged") for t in tactics)  # only the twins (a GPU's), offered at every size
    assert simulated() or tactics
    with pytest.raises(ValueError, match="warpgroups"):
        WgmmaConfig(1, 12, 2).check()
    with pytest.raises(ValueError, match="stages"):
        WgmmaConfig(1, 8, 2).check()


def test_misaligned_operands_fall_back(rng):
    """A K-contiguous operand array 4 bytes off a 16-byte boundary: the fallback tactic runs."""
    from numba import cuda

    from plugrt.launcher import PreparedLaunch

    a, b = rand(rng, (64, 16)), rand(rng, (16, 8))
    meta, offs = matmul_plan.product_plan(a.shape, b.shape)
    fallback = simt.simt_tactic(simt.SIMT_CONFIGS[0], meta, offs, epilogue=no_epilogue(2))
    tactic = wgmma.wgmma_tactic(TINY[0], meta, offs, epilogue=no_epilogue(2), fallback=fallback)
    direct = tactic.launches([cuda.to_device(a), cuda.to_device(b)], [cuda.device_array((64, 8), F32)], None)
    ins = []
    for host in (a, b):
        room = cuda.device_array(host.size + 1, F32)
        room[1:].copy_to_device(host.ravel())
        ins.append(room[1:].reshape(host.shape))
    out = cuda.device_array((64, 8), F32)
    launches = tactic.launches(ins, [out], None)
    assert launches[0].kernel is not direct[0].kernel
    for launch in launches:
        PreparedLaunch(launch)(0)
    cuda.synchronize()
    close(out.copy_to_host(), a.astype(np.float64) @ b, "fallback")


def test_production_order_and_params(monkeypatch):
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", PRODUCTION)
    tactics = matmul_tactics.gemm_tactics(F32, F32, F32, *matmul_plan.product_plan((4096, 4096), (4096, 4096)),
                                          epilogue=no_epilogue(2))
    names = [t.name for t in tactics]
    assert names[:2] == ["wgmma_128x256x32_s4", "wgmma_128x128x32_s5"]
    assert names[2].startswith("tf32_")
    assert tactics[0].params == {"bm": 128, "bn": 256, "bk": 32, "wgs": 2, "stages": 4, "splits": 1, "even": True}
    # Last on a GPU, every tile's ragged twin: bounds-checked, the kernel a dynamic profile's other shapes run.
    if not simulated():
        assert names[-4:] == ["wgmma_128x256x32_s4_ragged", "wgmma_128x128x32_s5_ragged",
                              "wgmma_128x256x32_s4_splitk_ragged", "wgmma_128x128x32_s5_splitk_ragged"]
        assert not any(t.params["even"] for t in tactics[-4:])
    # shared memory fits the H200's 227 KiB per block
    assert all(4 * c.ring_floats() <= 227 * 1024 for c in PRODUCTION)


def test_wgmma_kernels_compile_for_the_gpu():
    """sm_90 typing of the production kernels (wgmma intrinsics) in every operand layout."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt_builtin_ops.matmul import wgmma as W

        @cuda.jit(device=True)
        def epi(v, i, ops):
            return max(v + ops[1][i], float32(0))

        f32, i64 = arr(np.float32), arr(np.int64)
        args = [f32, f32, f32, f32, f32, i64, i64, types.float32, types.float32, I64, I64, types.Tuple((i64, f32))]
        for config in W.WGMMA_CONFIGS:
            for a_kc, b_kc in ((True, False), (True, True), (False, False)):
                check(f"{config.name} {a_kc} {b_kc}", W.wgmma_kernel(config, a_kc, b_kc, True, False, epi, False),
                      args, True)
        check("emulated", W.wgmma_kernel(W.WgmmaConfig(1, 8, 3), True, False, False, True, epi, True), args, True)
    """)
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- GPU only


@pytest.mark.skipif(simulated(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("op_type, shapes, attrs", [
    ("MatMul", {"a": (300, 200), "b": (200, 520)}, {}),                 # ragged, B by 4-byte copies
    ("Gemm", {"a": (256, 160), "b": (256, 160)}, {"transB": 1}),        # B K-contiguous
    ("MatMul", {"a": (2, 128, 64), "b": (2, 64, 256)}, {}),             # batched
])
def test_wgmma_on_the_gpu(rng, monkeypatch, op_type, shapes, attrs):
    """Production tiles: the tensor cores against float64 and against the emulated sibling."""
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", PRODUCTION)
    feeds = {k: rand(rng, v) for k, v in shapes.items()}
    graph = import_model(single_node_model(op_type, feeds, attrs), registry=default_registry())
    want = ReferenceExecutor(graph, default_registry()).run(feeds)[graph.outputs[0]].astype(np.float64)
    meta, offs = plan(op_type, feeds, attrs)
    scale = float(np.max(np.abs(want)))
    for config in PRODUCTION:
        for splits in (1, 2):
            out = {e: run_tactic(graph, wgmma.wgmma_tactic(config, meta, offs, epilogue=no_epilogue(2),
                                                                 splits=splits, emulated=e), feeds)[0]
                   for e in (False, True)}
            label = f"{config.name} splits {splits}"
            assert np.max(np.abs(out[False] - out[True])) <= 1e-3 * scale, label
            close(out[False], want, label)
