"""The float32 GEMM family of MatMul and Gemm: SIMT SGEMM (with split-K) and TF32 tensor cores.

In the simulator the tactics run with the smallest valid configurations (4 threads per
SIMT block, one warp per TF32 block), which still exercise multi-tile grids, ragged edges,
double buffering over several K tiles, split-K and the staged epilogue; one test runs the
production configurations on one small product. The TF32 tactic's simulator sibling (the
same kernel with the warp MMA done by scalar FMAs on TF32-rounded operands) is checked
within a TF32 tolerance; on a GPU the tensor-core kernel runs and is compared with it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from plugrt.device import simulated
from plugrt import kernels
from plugrt.kernels import Epilogue, no_epilogue
from plugrt.onnx.importer import import_model
from plugrt.reference import ReferenceExecutor
from plugrt.registry import default_registry
from plugrt.testing import run_tactic, single_node_model
from plugrt_builtin_ops.matmul import mma_sync, simt, store, tf32, wgmma
from plugrt_builtin_ops.matmul import plan as matmul_plan, tactics as matmul_tactics
from plugrt_builtin_ops.matmul.simt import SimtConfig
from plugrt_builtin_ops.matmul.tf32 import Tf32Config

from test_kernels_epilogue import _node, _reference, _run, residual_relu, residual_relu_numpy

F32 = np.float32
#: SIMT: 8x8 tile in 4x4 strips (4 threads); 8x4 tile in 4x2 strips (4 threads, 2-wide strips).
TINY_SIMT = (SimtConfig(8, 8, 4, 4, 4), SimtConfig(8, 4, 4, 4, 2))
#: TF32: one warp, one m16n8k8 tile.
TINY_TF32 = (Tf32Config(1, 1, 1, 1, 8),)
PRODUCTION_SIMT = simt.SIMT_CONFIGS
PRODUCTION_TF32 = tf32.TF32_CONFIGS
PRODUCTION_WGMMA = wgmma.WGMMA_CONFIGS
FP32_TOL = 2e-5
TF32_TOL = 5e-3


@pytest.fixture(autouse=True)
def tiny_configs(monkeypatch):
    monkeypatch.setattr(simt, "SIMT_CONFIGS", TINY_SIMT)
    monkeypatch.setattr(tf32, "TF32_CONFIGS", TINY_TF32)
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", ())  # tests/test_kernels_gemm_wgmma.py
    monkeypatch.setattr(matmul_tactics, "TILE_CONFIGS", ((4, 4, 2, 2, 2),))


def rand(rng, shape):
    return rng.standard_normal(shape).astype(F32)


def is_new(tactic) -> bool:
    return tactic.name.startswith(("simt", "tf32"))


def assert_close(got, want, tactic, label=""):
    """fp32 tolerance, or TF32's relative to max |want| for ``math="tf32"`` tactics."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-6)
    tol = TF32_TOL if tactic.math == "tf32" else FP32_TOL
    err = float(np.max(np.abs(got - want), initial=0.0))
    assert err <= tol * scale, f"{label} tactic {tactic.name} {dict(tactic.params)}: max error {err:.3g} " \
                               f"> {tol:g} * {scale:.3g}"


def check_new_tactics(op_type, feeds, attrs=None, constants=(), expect=None):
    """Run the node's SIMT and TF32 tactics against its reference; returns their names."""
    registry = default_registry()
    graph = import_model(single_node_model(op_type, feeds, attrs, constants), registry=registry)
    runtime = {k: v for k, v in feeds.items() if v is not None and k not in constants}
    want = ReferenceExecutor(graph, registry).run(runtime)[graph.outputs[0]]
    node = graph.nodes[0]
    op = registry.op(node)
    tactics = [t for t in op.tactics(node, [graph.info(n) if n else None for n in node.inputs],
                                     [graph.info(n) for n in node.outputs]) if is_new(t)]
    for tactic in tactics:
        got = run_tactic(graph, tactic, runtime)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert_close(got, want, tactic, f"{op_type} {[np.shape(v) for v in feeds.values()]}")
    names = [t.name for t in tactics]
    if expect is not None:
        assert names == expect
    return names


# ----------------------------------------------------------------------------- MatMul


@pytest.mark.parametrize("a_shape, b_shape", [
    ((16, 8), (8, 16)),             # multiples of every tile: the unguarded kernels
    ((13, 11), (11, 10)),           # ragged M, N and K
    ((2, 8, 12), (2, 12, 8)),       # batched
    ((2, 1, 9, 5), (3, 5, 6)),      # broadcast batch dims
    ((3, 5, 4), (4, 6)),            # A's batch folded into M
    ((8, 40), (40, 5)),             # several K tiles (double buffering)
])
def test_matmul(rng, a_shape, b_shape):
    names = check_new_tactics("MatMul", {"a": rand(rng, a_shape), "b": rand(rng, b_shape)})
    assert "simt8x8x4_4x4" in names and "tf32_16x8x8_w1x1" in names


@pytest.mark.parametrize("c_shape", [None, (10,), (9, 1), (9, 10)])
@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_transposes(rng, trans, c_shape):
    ta, tb = trans
    m, k, n = 9, 9, 10
    feeds = {"a": rand(rng, (k, m) if ta else (m, k)), "b": rand(rng, (n, k) if tb else (k, n))}
    if c_shape is not None:
        feeds["c"] = rand(rng, c_shape)
    names = check_new_tactics("Gemm", feeds, {"alpha": 0.75, "beta": -1.5, "transA": ta, "transB": tb})
    assert len(names) == 3


# ----------------------------------------------------------------------------- split-K and the epilogue


def _forced(config_kind, splits):
    """The node's SIMT / TF32 tactics at the tiny configuration with K split as given."""
    def make(op, node, ins, outs, epilogue):
        if node.op_type == "Gemm":
            meta, offs = matmul_plan.gemm_plan(ins[0].shape, ins[1].shape, ins[2].shape if len(ins) > 2 else None,
                                                  bool(node.attrs["transA"]), bool(node.attrs["transB"]),
                                                  node.attrs["alpha"], node.attrs["beta"], False)
            kw = dict(alpha=node.attrs["alpha"], beta=node.attrs["beta"], c_index=2)
        else:
            meta, offs = matmul_plan.product_plan(ins[0].shape, ins[1].shape)
            kw = {}
        if config_kind == "simt":
            return [simt.simt_tactic(TINY_SIMT[0], meta, offs, epilogue=epilogue, splits=s, **kw) for s in splits]
        return [tf32.tf32_tactic(TINY_TF32[0], meta, offs, epilogue=epilogue, splits=s, **kw) for s in splits]
    return make


@pytest.mark.parametrize("kind", ["simt", "tf32"])
@pytest.mark.parametrize("op_type, feeds, attrs", [
    ("MatMul", {"a": ((2, 9, 20),), "b": ((20, 11),)}, {}),
    ("Gemm", {"a": ((20, 8),), "b": ((16, 20),), "c": ((16,),)}, {"transA": 1, "transB": 1, "alpha": 0.5}),
])
def test_epilogue_once_with_and_without_split(rng, kind, op_type, feeds, attrs):
    """The epilogue (residual + relu, counting its calls) runs once per element, in the
    final reduction when K is split; partial sums live in the workspace."""
    feeds = {k: rand(rng, v[0]) for k, v in feeds.items()}
    graph, node, op, ins, outs = _node(op_type, feeds, attrs)
    shape = tuple(int(d) for d in outs[0].shape)
    residual = rand(rng, shape)
    epilogue = Epilogue(residual_relu, len(node.inputs), label="Add+Relu+Mul")
    want = residual_relu_numpy(_reference(graph, feeds).astype(np.float64), residual.astype(np.float64))
    tactics = _forced(kind, (1, 3))(op, node, ins, outs, epilogue)
    tactics += [t for t in op.tactics(node, ins, outs, epilogue=epilogue) if t.name.startswith(kind)]
    assert tactics[1].params["splits"] == 3 and tactics[1].workspace_bytes > 0 and "splitk3" in tactics[1].name
    for tactic in tactics:
        got, counts = _run(graph, tactic, feeds, [residual])
        np.testing.assert_array_equal(counts, 1, err_msg=f"{tactic.name}: epilogue calls per element")
        assert_close(got, want, tactic, op_type)


def test_split_k_offered_for_skinny_products(rng, monkeypatch):
    """Few output tiles and a long K: split-K tactics come first, sized by the heuristic."""
    monkeypatch.setattr(simt, "MIN_KTILES_PER_SPLIT", 2)
    names = check_new_tactics("MatMul", {"a": rand(rng, (8, 48)), "b": rand(rng, (48, 8))})
    assert names[0].startswith("tf32_16x8x8_w1x1_splitk")
    assert [n for n in names if n.startswith("simt")][0].startswith("simt8x8x4_4x4_splitk")
    assert store.split_chunk(48, 4, 5) == (4, 12)  # K tiles spread evenly, none empty


# ----------------------------------------------------------------------------- the cp.async pipeline

PIPELINED = (Tf32Config(1, 1, 1, 1, 8, stages=2), Tf32Config(1, 1, 1, 1, 8, stages=3))


def _plan(op_type, feeds, attrs):
    if op_type == "Gemm":
        return matmul_plan.gemm_plan(feeds["a"].shape, feeds["b"].shape, None, bool(attrs.get("transA")),
                                        bool(attrs.get("transB")), 1.0, 0.0, False)
    return matmul_plan.product_plan(feeds["a"].shape, feeds["b"].shape)


@pytest.mark.parametrize("config", PIPELINED, ids=lambda c: c.name)
@pytest.mark.parametrize("op_type, shapes, attrs, splits", [
    ("MatMul", {"a": (16, 40), "b": (40, 8)}, {}, 1),          # 5 K tiles around the ring
    ("MatMul", {"a": (16, 40), "b": (40, 8)}, {}, 3),          # split K: 2, 2 and 1 tiles
    ("MatMul", {"a": (2, 16, 16), "b": (2, 16, 16)}, {}, 1),   # batched
    ("Gemm", {"a": (24, 32), "b": (16, 24)}, {"transA": 1, "transB": 1}, 1),  # A M-contiguous, B K-contiguous
])
def test_tf32_pipelined_matches_the_reference(rng, config, op_type, shapes, attrs, splits):
    """cp.async ring of 2 or 3 stages (emulated copies in the simulator): whole tiles in
    either operand layout, batches and split K."""
    feeds = {k: rand(rng, v) for k, v in shapes.items()}
    meta, offs = _plan(op_type, feeds, attrs)
    assert tf32.pipelined_fits(config, meta, offs)
    graph = import_model(single_node_model(op_type, feeds, attrs), registry=default_registry())
    tactic = tf32.tf32_tactic(config, meta, offs, epilogue=no_epilogue(2), splits=splits)
    assert tactic.params["stages"] == config.stages and tactic.params["splits"] == splits
    want = ReferenceExecutor(graph, default_registry()).run(feeds)[graph.outputs[0]]
    assert_close(run_tactic(graph, tactic, feeds)[0], want, tactic, op_type)


def test_tf32_pipelined_offered_only_for_whole_aligned_tiles(rng):
    config = PIPELINED[0]
    fits = [tf32.pipelined_fits(config, *matmul_plan.product_plan(a, b))
            for a, b in (((16, 16), (16, 8)), ((13, 16), (16, 8)), ((16, 12), (12, 8)), ((16, 16), (16, 10)))]
    assert fits == [True, False, False, False]
    with pytest.raises(ValueError, match="16-byte"):
        tf32.tf32_tactic(config, *matmul_plan.product_plan((13, 16), (16, 8)), epilogue=no_epilogue(2))


def test_tf32_pipelined_falls_back_on_misaligned_operands(rng):
    """Operand arrays 4 bytes off a 16-byte boundary: the same tile staged through registers."""
    from numba import cuda

    from plugrt.launcher import PreparedLaunch

    a, b = rand(rng, (16, 16)), rand(rng, (16, 8))
    meta, offs = matmul_plan.product_plan(a.shape, b.shape)
    tactic = tf32.tf32_tactic(PIPELINED[0], meta, offs, epilogue=no_epilogue(2))
    pipelined = tactic.launches([cuda.to_device(a), cuda.to_device(b)], [cuda.device_array((16, 8), F32)], None)
    ins = []
    for host in (a, b):
        room = cuda.device_array(host.size + 1, F32)
        room[1:].copy_to_device(host.ravel())
        ins.append(room[1:].reshape(host.shape))
    out = cuda.device_array((16, 8), F32)
    launches = tactic.launches(ins, [out], None)
    assert launches[0].kernel is not pipelined[0].kernel
    for launch in launches:
        PreparedLaunch(launch)(0)
    cuda.synchronize()
    assert_close(out.copy_to_host(), a.astype(np.float64) @ b, tactic)


# ----------------------------------------------------------------------------- production configurations


def test_production_configurations_on_one_small_product(rng, monkeypatch):
    """128x128 (256 threads) SIMT and TF32 blocks, one ragged tile, two K tiles."""
    monkeypatch.setattr(simt, "SIMT_CONFIGS", (SimtConfig(128, 128, 8, 8, 8),))
    monkeypatch.setattr(tf32, "TF32_CONFIGS", (Tf32Config(2, 4, 4, 4, 16),))
    names = check_new_tactics("MatMul", {"a": rand(rng, (100, 20)), "b": rand(rng, (20, 72))})
    assert names == ["tf32_128x128x16_w2x4", "simt128x128x8_8x8"]


# ----------------------------------------------------------------------------- supports and ranking


def _tactics(op_type, shapes, dtype=F32, attrs=None):
    from plugrt.ir.graph import Node
    from plugrt.plugin import TensorInfo

    op = default_registry().find_op("", op_type, 17)
    node_attrs = {a.name: a.default for a in op.attributes}
    node_attrs.update(attrs or {})
    node = Node("n", op_type, "", tuple(f"x{i}" for i in range(len(shapes))), ("y",), node_attrs, opset=17)
    ins = [TensorInfo(dtype, s) for s in shapes]
    return op.tactics(node, ins, op.infer(node, ins))


def test_production_tactics_params_and_order(monkeypatch):
    monkeypatch.setattr(simt, "SIMT_CONFIGS", PRODUCTION_SIMT)
    monkeypatch.setattr(tf32, "TF32_CONFIGS", PRODUCTION_TF32)
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", PRODUCTION_WGMMA[:1])
    tactics = [t for t in _tactics("MatMul", [(4096, 4096), (4096, 4096)]) if t.name.startswith("wgmma")]
    # (on a GPU, after the tiled ones, the tile's ragged twins: whole and split-K)
    twins = ["wgmma_128x256x32_s4_ragged", "wgmma_128x256x32_s4_splitk_ragged"] if not simulated() else []
    assert [t.name for t in tactics] == (["wgmma_128x256x32_s4"] + twins if wgmma.hopper() else [])
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", ())
    tactics = [t for t in _tactics("MatMul", [(4096, 4096), (4096, 4096)]) if is_new(t)]
    assert [t.name for t in tactics] == ["tf32_256x128x32_w4x2_s3", "tf32_128x128x16_w2x4_s4", "tf32_128x128x16_w2x4",
                                         "simt128x128x8_8x4_occ1", "simt128x128x8_8x8_occ1", "simt128x64x8_8x8_occ1",
                                         "simt64x128x8_8x8_occ1"]
    assert [t.math for t in tactics] == ["tf32", "tf32", "tf32", "", "", "", ""]
    assert tactics[3].params == {"bm": 128, "bn": 128, "bk": 8, "tm": 8, "tn": 4, "occupancy": 1, "splits": 1}
    assert tactics[0].params == {"bm": 256, "bn": 128, "bk": 32, "wm": 4, "wn": 2, "mi": 4, "ni": 8, "stages": 3,
                                 "splits": 1}
    assert all(t.workspace_bytes == 0 for t in tactics)
    # Skinny: 256 x 256 outputs (4 tiles), K = 16384: split-K first, partial sums in the workspace.
    skinny = [t for t in _tactics("Gemm", [(256, 16384), (256, 16384)], attrs={"transB": 1}) if is_new(t)]
    assert skinny[0].name.startswith("tf32_256x128x32_w4x2_s3_splitk") and skinny[0].workspace_bytes > 0
    split = [t for t in skinny if t.name.startswith("simt128x128x8_8x4_occ1_splitk")][0]
    assert split.workspace_bytes == 4 * split.params["splits"] * 256 * 256
    # A product too small for any block tile gets the tiled and direct tactics only.
    assert not [t for t in _tactics("MatMul", [(3, 5), (5, 40)]) if is_new(t)]
    everything = [t.name for t in _tactics("MatMul", [(256, 256), (256, 256)])]
    if simulated():  # untimed there, the first wins: the exact, cheap tactics stay first
        assert everything[0].startswith("tiled") and everything[-1] == "direct"
    else:
        assert everything[0].startswith("tf32_128x128x"), everything  # TF32 first, maybe split


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32])
def test_float32_only(dtype):
    assert not [t for t in _tactics("MatMul", [(16, 16), (16, 16)], dtype=dtype) if is_new(t)]


def test_config_checks():
    with pytest.raises(ValueError, match="divide"):
        simt.simt_kernel(SimtConfig(8, 8, 4, 3, 4), True, False, False, False, no_epilogue(2).fn)
    with pytest.raises(ValueError, match="divide"):
        Tf32Config(1, 1, 1, 1, 4).check()


# ----------------------------------------------------------------------------- GPU only


@pytest.mark.skipif(simulated(), reason="tensor cores need a GPU")
def test_tensor_cores_match_the_emulated_sibling(rng):
    """On a GPU the real TF32 kernel against the scalar sibling, production tile, ragged edges."""
    from plugrt.testing import run_tactic as run

    a, b = rand(rng, (300, 200)), rand(rng, (200, 260))
    registry = default_registry()
    graph = import_model(single_node_model("MatMul", {"a": a, "b": b}), registry=registry)
    meta, offs = matmul_plan.product_plan(a.shape, b.shape)
    config = Tf32Config(2, 4, 4, 4, 16)
    out = {}
    for emulated in (False, True):
        tactic = tf32.tf32_tactic(config, meta, offs, epilogue=no_epilogue(2), emulated=emulated)
        out[emulated] = run(graph, tactic, {"a": a, "b": b})[0]
    scale = np.max(np.abs(a.astype(np.float64) @ b))
    assert np.max(np.abs(out[False] - out[True])) <= 1e-4 * scale
    assert np.max(np.abs(out[False] - a.astype(np.float64) @ b)) <= TF32_TOL * scale


@pytest.mark.skipif(simulated(), reason="tensor cores need a GPU")
@pytest.mark.parametrize("trans_b", [0, 1])
def test_pipelined_tensor_cores_match_the_emulated_sibling(rng, trans_b):
    """cp.async ring + ldmatrix (A K-contiguous; B K-contiguous with transB) on a GPU against
    the scalar sibling, production tile, several K tiles, split K too."""
    from plugrt.testing import run_tactic as run

    a, b = rand(rng, (256, 160)), rand(rng, (256, 160) if trans_b else (160, 128))
    feeds = {"a": a, "b": b}
    graph = import_model(single_node_model("Gemm", feeds, {"transB": trans_b}), registry=default_registry())
    meta, offs = matmul_plan.gemm_plan(a.shape, b.shape, None, False, bool(trans_b), 1.0, 0.0, False)
    want = a.astype(np.float64) @ (b.T if trans_b else b)
    scale = np.max(np.abs(want))
    for splits in (1, 2):
        out = {e: run(graph, tf32.tf32_tactic(PRODUCTION_TF32[0], meta, offs, epilogue=no_epilogue(2),
                                                   splits=splits, emulated=e), feeds)[0] for e in (False, True)}
        assert np.max(np.abs(out[False] - out[True])) <= 1e-4 * scale, f"splits {splits}"
        assert np.max(np.abs(out[False] - want)) <= TF32_TOL * scale


# ----------------------------------------------------------------------------- offline checks


def test_inline_ptx_assembles_for_sm_90(tmp_path):
    """The TF32 tactics' inline PTX (cvt.rna.tf32, mma.sync m16n8k8, cp.async) assembles with ptxas."""
    ptxas = shutil.which("ptxas") or ("/usr/local/bin/ptxas" if os.path.exists("/usr/local/bin/ptxas") else None)
    if ptxas is None:
        pytest.skip("ptxas not installed")
    cvt = kernels.CVT_TF32_PTX.replace("$0", "%r1").replace("$1", "%f1")
    mma = kernels.MMA_TF32_PTX
    names = ["%f10", "%f11", "%f12", "%f13", "%r1", "%r2", "%r3", "%r4", "%r5", "%r6", "%f1", "%f2", "%f3", "%f4"]
    for index in reversed(range(len(names))):
        mma = mma.replace(f"${index}", names[index])
    copy = mma_sync.CP_ASYNC_PTX.replace("$0", "%rd2").replace("$1", "%rd1")
    ldsm4 = mma_sync.LDMATRIX_X4_PTX.replace("$4", "%rd2")
    ldsm2 = mma_sync.LDMATRIX_X2_PTX.replace("$2", "%rd2")
    for index, name in enumerate(["%r1", "%r2", "%r3", "%r4"]):
        ldsm4 = ldsm4.replace(f"${index}", name)
        ldsm2 = ldsm2.replace(f"${index}", name)
    source = f"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry probe(.param .u64 out)
{{
    .reg .b32 %r<8>;
    .reg .f32 %f<16>;
    .reg .b64 %rd<3>;
    .shared .align 16 .b8 stage[16];
    ld.param.u64 %rd1, [out];
    cvta.shared.u64 %rd2, stage;
    {copy}
    cp.async.commit_group;
    cp.async.wait_group 0;
    bar.sync 0;
    {ldsm4}
    {ldsm2}
    mov.f32 %f1, 0f3F800000;
    mov.f32 %f2, 0f3F800000;
    mov.f32 %f3, 0f3F800000;
    mov.f32 %f4, 0f3F800000;
    {cvt}
    mov.b32 %r2, %r1;
    mov.b32 %r3, %r1;
    mov.b32 %r4, %r1;
    mov.b32 %r5, %r1;
    mov.b32 %r6, %r1;
    {mma}
    st.global.f32 [%rd1], %f10;
    ret;
}}
"""
    path = tmp_path / "tf32_probe.ptx"
    path.write_text(source)
    proc = subprocess.run([ptxas, "-arch=sm_90", str(path), "-o", str(tmp_path / "probe.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_gemm_kernels_compile_for_the_gpu():
    """Type the kernels with Numba's CUDA target for sm_90 (the simulator never types them):
    SIMT and TF32 (tensor-core intrinsics and the emulated sibling), even and guarded,
    split and not, with a tuple epilogue argument; no float64 arithmetic."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt_builtin_ops.matmul import simt as gs, store as st, tf32 as gt

        @cuda.jit(device=True)
        def epi(v, i, ops):
            cuda.atomic.add(ops[2], i, 1)
            return max(v + ops[1][i], float32(0)) * float32(2)

        f32, i64 = arr(np.float32), arr(np.int64)
        S = scalar(np.float32)
        args = [f32] * 5 + [i64, i64, S, S, I64, I64, types.Tuple((i64, f32, i64))]
        for even, split, a_kc in ((True, False, True), (False, True, False)):
            for config in gs.SIMT_CONFIGS:
                check(f"simt {config.name} even={even} split={split}",
                      gs.simt_kernel(config, a_kc, not a_kc, even, split, epi), args, True)
            for emulated in (False, True):
                check(f"tf32 even={even} split={split} emulated={emulated}",
                      gt.tf32_kernel(gt.Tf32Config(2, 4, 4, 4, 16), a_kc, True, even, split, epi, emulated), args, True)
                if even:
                    check(f"tf32 pipelined split={split} emulated={emulated}",
                          gt.tf32_kernel(gt.Tf32Config(2, 4, 4, 4, 32, 3), a_kc, not a_kc, True, split, epi, emulated),
                          args, True)
        check("split_reduce", st.split_reduce_kernel(epi), [f32, f32, f32, i64, S, S, I64,
                                                           types.Tuple((i64, f32, i64))], True)

        @cuda.jit(device=True)
        def vepi(v, i, ops):  # the vector form: eight values of one row
            return (v[0] + ops[1][i], v[1], v[2], v[3], v[4], v[5], v[6], max(v[7], float32(0)))

        h16 = arr(np.float16)
        for out in (f32, h16):
            vargs = [out] + [f32] * 4 + [i64, i64, S, S, I64, I64, types.Tuple((i64, f32, i64))]
            for split in (False, True):
                check(f"simt vector out={out} split={split}",
                      gs.simt_kernel(gs.SIMT_CONFIGS[0], True, False, False, split, epi, vepi), vargs, True)
                check(f"tf32 vector out={out} split={split}",
                      gt.tf32_kernel(gt.Tf32Config(2, 4, 4, 4, 16), True, True, True, split, epi, False, vepi),
                      vargs, True)
            check(f"split_reduce vector out={out}", st.split_reduce_kernel(vepi, True),
                  [out, f32, f32, i64, S, S, I64, types.Tuple((i64, f32, i64))], True)
    """)
    assert not failures, "\n".join(failures)


def _family(name: str) -> str | None:
    return next((p for p in ("wgmma_f16_",) + matmul_tactics.FAST_PREFIXES if name.startswith(p)), None)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_product_asked_for_one_tactic_makes_only_its_family(dtype):
    """``wanted`` (a new shape looking for a plan's tactic): the answer holds that tactic
    and no tactic of another tensor-core or SIMT family than its own."""
    meta, offs = matmul_plan.product_plan((256, 128), (128, 256))
    full = matmul_tactics.product_tactics(dtype, dtype, dtype, meta, offs, epilogue=no_epilogue(2))
    families = {_family(t.name) for t in full} - {None}
    assert len(families) >= 2 or dtype == np.float16, [t.name for t in full]
    for tactic in full:
        asked = matmul_tactics.product_tactics(dtype, dtype, dtype, meta, offs, epilogue=no_epilogue(2),
                                               wanted=tactic.identity())
        assert [t.identity() for t in asked].count(tactic.identity()) == 1
        assert {_family(t.name) for t in asked} - {None} <= {_family(tactic.name)} - {None}, tactic.name
        if tactic.name.startswith("wgmma_"):  # (and of the family, only its tile)
            tile = "_".join(tactic.name.split("_")[:4 if tactic.name.startswith("wgmma_f16_") else 3])
            assert all(t.name.startswith(tile) for t in asked if _family(t.name)), (tactic.name, [t.name for t in asked])
