"""The Hopper ``wgmma`` INT8 tactic of MatMulInteger (s8/u8 operands, int32 accumulation).

8-bit operands travel as float32 views (four K-neighbours a word), so the copies, the
swizzle and the descriptors are the TF32 kernel's; each ``wgmma`` is k32. In the simulator
one warpgroup over 8 or 16 columns runs with the MMA done by integer multiply-adds on the
same swizzled words (each split into its four bytes): the copies, ragged edges, the ring,
split K, a weight held transposed, zero points corrected at the store and a fused
requantizing epilogue are checked against NumPy's int64 product there, on fresh random
inputs. The real kernels (inline PTX) are typed for sm_90; on a GPU the production tiles
are compared with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from plugrt.device import simulated
from plugrt.engine import Builder, BuilderConfig
from plugrt.kernels import no_epilogue
from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.testing import run_tactic, single_node_model
from plugrt_builtin_ops.matmul import plan as matmul_plan
from plugrt_builtin_ops.matmul import tactics as matmul_tactics
from plugrt_builtin_ops.matmul import wgmma, wgmma_int8, wgmma_intrinsics
from plugrt_builtin_ops.matmul.integer_store import Int8Operands
from plugrt_builtin_ops.matmul.store import HeldOperand
from test_kernels_gemm_wgmma import PRODUCTION, TINY

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # int32 wrapping in the simulator
I8, U8 = np.int8, np.uint8


@pytest.fixture(autouse=True)
def tiny_configs(monkeypatch):
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", TINY)


def ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def oracle(a, b, za=None, zb=None) -> np.ndarray:
    """``(a - za) @ (b - zb)`` in int64, wrapped to int32 (``za`` per row: a column vector)."""
    a, b = a.astype(np.int64), b.astype(np.int64)
    if za is not None:
        a = a - np.asarray(za, np.int64)
    if zb is not None:
        b = b - np.asarray(zb, np.int64)
    return np.matmul(a, b).astype(np.int32)


def offered(feeds, constants=("b",)):
    """The node's INT8 wgmma tactics as MatMulInteger offers them (``constants``: inputs
    made initializers, as a weight is), and all its tactics."""
    model = single_node_model("MatMulInteger", feeds, {}, constants, opset=10)
    graph = import_model(model, registry=default_registry())
    node = graph.nodes[0]
    op = default_registry().op(node)
    tactics = op.tactics(node, [graph.info(n) if n else None for n in node.inputs],
                         [graph.info(n) for n in node.outputs])
    return graph, [t for t in tactics if t.name.startswith("wgmma")], tactics


def run_all(graph, tactics, feeds, constants, want, corrected):
    run_feeds = {k: v for k, v in feeds.items() if k not in constants and v is not None}
    assert tactics
    for tactic in tactics:
        assert tactic.params["zero_points"] == ("corrected" if corrected else "none"), tactic.params
        got = run_tactic(graph, tactic, run_feeds)[0]
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want, err_msg=tactic.name)


CASES = [
    # ragged M and N, one partial K tile (48 of 128), B a weight held transposed
    ((I8, I8), (70, 48), (48, 12)),
    # uint8 A: u8.s8; whole 64-row tiles, K 160 = one whole tile and a partial one
    ((U8, I8), (64, 160), (160, 16)),
    # A's batch folded into M, two whole K tiles around the ring
    ((U8, U8), (2, 64, 256), (256, 8)),
    ((I8, U8), (96, 32), (32, 24)),
]


@pytest.mark.parametrize("dtypes, a_shape, b_shape", CASES)
def test_wgmma_int8_matches_int64(rng, dtypes, a_shape, b_shape):
    feeds = {"a": ints(rng, dtypes[0], a_shape), "b": ints(rng, dtypes[1], b_shape)}
    graph, tactics, _ = offered(feeds)
    types = ".".join(wgmma_int8.PTX_TYPES[np.dtype(d)] for d in dtypes)
    assert all(t.params["operands"] == types and t.params["held_b"] for t in tactics)
    run_all(graph, tactics, feeds, ("b",), oracle(feeds["a"], feeds["b"]), corrected=False)


def test_zero_points_known_zero_need_no_correction(rng):
    feeds = {"a": ints(rng, U8, (64, 32)), "b": ints(rng, I8, (32, 16)), "za": np.zeros((), U8),
             "zb": np.zeros(16, I8)}
    graph, tactics, _ = offered(feeds, ("b", "za", "zb"))
    run_all(graph, tactics, feeds, ("b", "za", "zb"), oracle(feeds["a"], feeds["b"]), corrected=False)


@pytest.mark.parametrize("a_zero, b_zero, constants", [
    ("scalar", "scalar", ("b",)),             # both at run time: A's row sums and B's column sums
    ("scalar", "column", ("b", "za", "zb")),  # asymmetric uint8 activations, per-column weight zero points
    ("row", None, ("b",)),                    # per-row A zero points, B's column sums precomputed
    (None, "column", ("b",)),                 # only B's: A's row sums
])
def test_zero_points_corrected_at_the_store(rng, a_zero, b_zero, constants):
    m, k, n = 70, 80, 16
    a, b = ints(rng, U8, (m, k)), ints(rng, I8, (k, n))
    za = {"scalar": ints(rng, U8, ()), "row": ints(rng, U8, (m,)), None: None}[a_zero]
    zb = {"scalar": ints(rng, I8, ()), "column": ints(rng, I8, (n,)), None: None}[b_zero]
    feeds = {"a": a, "b": b, "za": za, "zb": zb}
    graph, tactics, _ = offered(feeds, constants)
    want = oracle(a, b, None if za is None else (za.reshape(-1, 1) if a_zero == "row" else za), zb)
    run_all(graph, tactics, feeds, constants, want, corrected=True)


def test_batched_per_row_zero_points(rng):
    """A ``[2, 32, 64]`` with per-row zero points ``[32]``: the batch is not folded, so row
    sums and zero points are read per batch item."""
    a, b, za = ints(rng, U8, (2, 32, 64)), ints(rng, I8, (64, 8)), ints(rng, U8, (32,))
    feeds = {"a": a, "b": b, "za": za}
    graph, tactics, _ = offered(feeds)
    run_all(graph, tactics, feeds, ("b",), oracle(a, b, za.reshape(-1, 1)), corrected=True)


def _plan(a, b, held_b=True):
    meta, offs = matmul_plan.product_plan(a.shape, b.shape)
    if held_b:
        meta[matmul_plan.SBK], meta[matmul_plan.SBN] = 1, a.shape[-1]
    return meta, offs


@pytest.mark.parametrize("splits, corrected", [(2, False), (3, True)])
def test_split_k(rng, splits, corrected):
    """K 384 = three tiles of 128 values split 2+1 or 1+1+1: int32 partial sums in the
    workspace, added up (and corrected) by the final reduction."""
    a, b = ints(rng, U8, (64, 384)), ints(rng, I8, (384, 8))
    held = HeldOperand(b, I8, *b.shape)
    meta, offs = _plan(a, b)
    operands = Int8Operands("u8.s8", corrected)
    col_sums = held.host.astype(np.int64).sum(axis=1).astype(np.int32) if corrected else None
    feeds = {"a": a, "b": b, "za": U8(131)} if corrected else {"a": a, "b": b}
    tactic = wgmma_int8.int8_tactic(TINY[0], meta, offs, operands, held, col_sums, splits, no_epilogue(len(feeds)))
    assert tactic.params["splits"] == splits and tactic.workspace_bytes > 0
    graph = import_model(single_node_model("MatMulInteger", feeds, {}, ("b",), opset=10), registry=default_registry())
    got = run_tactic(graph, tactic, {k: v for k, v in feeds.items() if k != "b"})[0]
    np.testing.assert_array_equal(got, oracle(a, b, feeds.get("za")), err_msg=f"splits {splits}")


@pytest.mark.parametrize("bn", [24, 144])
def test_store_of_tiles_threads_do_not_divide(rng, bn):
    """The store keeps each thread on its columns: 24 columns over 128 threads (5 rows at
    once, 8 threads idle) and 144 (more columns than threads), ragged N, zero points."""
    a, b = ints(rng, U8, (64, 32)), ints(rng, I8, (32, bn - 3))
    meta, offs = matmul_plan.product_plan(a.shape, b.shape, zb=np.array([0, 1]))  # B's zero points per column
    meta[matmul_plan.SBK], meta[matmul_plan.SBN] = 1, 32
    held = HeldOperand(b, I8, *b.shape)
    col_sums = held.host.astype(np.int64).sum(axis=1).astype(np.int32)
    feeds = {"a": a, "b": b, "za": U8(7), "zb": ints(rng, I8, (bn - 3,))}
    tactic = wgmma_int8.int8_tactic(wgmma.WgmmaConfig(1, bn, 3), meta, offs, Int8Operands("u8.s8", True), held,
                                    col_sums, 1, no_epilogue(4))
    graph = import_model(single_node_model("MatMulInteger", feeds, {}, ("b",), opset=10), registry=default_registry())
    got = run_tactic(graph, tactic, {k: v for k, v in feeds.items() if k != "b"})[0]
    np.testing.assert_array_equal(got, oracle(a, b, feeds["za"], feeds["zb"]))


def test_b_k_contiguous_at_run_time(rng):
    """B read as ``[N, K]`` (not held): copied like A; zero points corrected with B's
    column sums added up by the row-sum kernel."""
    a, bt = ints(rng, I8, (64, 64)), ints(rng, I8, (16, 64))
    b = bt.T  # the logical [K, N] operand
    meta, offs = _plan(a, b)
    tactics = wgmma_int8.wgmma_int8_tactics(I8, I8, meta, offs, epilogue=no_epilogue(4), symmetric=False)
    assert tactics and not any(t.params["held_b"] for t in tactics)
    feeds = {"a": a, "b": b, "za": I8(-3), "zb": I8(5)}
    graph = import_model(single_node_model("MatMulInteger", feeds, {}, (), opset=10), registry=default_registry())
    run_feeds = dict(feeds, b=bt)  # the tactic reads B's K-contiguous bytes
    for tactic in tactics:
        got = run_tactic(graph, tactic, run_feeds)[0]
        np.testing.assert_array_equal(got, oracle(a, b, I8(-3), I8(5)), err_msg=tactic.name)


def test_products_that_do_not_suit_are_not_offered(rng):
    _, none, tactics = offered({"a": ints(rng, I8, (64, 24)), "b": ints(rng, I8, (24, 16))})  # K 24: not 16-byte rows
    assert not none and tactics
    _, none, _ = offered({"a": ints(rng, I8, (64, 32)), "b": ints(rng, I8, (32, 16))}, ())  # B [K, N] at run time
    assert not none
    _, none, _ = offered({"a": ints(rng, I8, (2, 64, 32)), "b": ints(rng, I8, (2, 32, 16))})  # a batched weight
    assert not none
    meta, offs = matmul_plan.product_plan((64, 32), (32, 16), za=np.array([0, 1]))  # zero points along K
    assert not wgmma_int8.wgmma_int8_tactics(I8, I8, meta, offs, epilogue=no_epilogue(3), symmetric=False,
                                             b_value=np.ones((32, 16), I8))
    assert wgmma_int8.wgmma_int8_tactics(I8, I8, meta, offs, epilogue=no_epilogue(3), symmetric=True,
                                         b_value=np.ones((32, 16), I8))
    meta, offs = matmul_plan.product_plan((64, 32), (32, 16))
    assert not wgmma_int8.wgmma_int8_tactics(np.int16, I8, meta, offs, epilogue=no_epilogue(2), symmetric=True,
                                             b_value=np.ones((32, 16), I8))


def test_misaligned_a_falls_back(rng):
    """An A array 4 bytes off a 16-byte boundary: the fallback (tiled) tactic runs."""
    from numba import cuda
    from plugrt.launcher import PreparedLaunch

    a, b = ints(rng, I8, (64, 32)), ints(rng, I8, (32, 8))
    graph, tactics, every = offered({"a": a, "b": b})
    tactic = tactics[0]
    room = cuda.device_array(a.size + 4, I8)
    room[4:].copy_to_device(a.ravel())
    out = cuda.device_array((64, 8), np.int32)
    launches = tactic.launches([room[4:].reshape(a.shape), cuda.to_device(b)], [out], None)
    assert launches and all("wgmma" not in getattr(launch.kernel, "__name__", "") for launch in launches)
    for launch in launches:
        PreparedLaunch(launch)(0)
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), oracle(a, b))


def test_order_on_a_gpu(monkeypatch):
    """On Hopper the production INT8 tiles come right after the first tiled tactic (the
    plain one the tuner verifies the others against), ahead of the other SIMT ones."""
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", PRODUCTION)
    monkeypatch.setattr(matmul_tactics, "simulated", lambda: False)
    meta, offs = matmul_plan.product_plan((4096, 4096), (4096, 4096))
    tactics = matmul_tactics.product_tactics(I8, I8, np.int32, meta, offs, epilogue=no_epilogue(2), zero_points=True,
                                             b_value=np.ones((4096, 4096), I8))
    names = [t.name for t in tactics]
    assert names[0].startswith("tiled") and names[-1] == "direct", names
    assert names[1:3] == ["wgmma_s8s8_128x256x128_s4", "wgmma_s8s8_128x128x128_s5"], names
    assert tactics[1].params == {"bm": 128, "bn": 256, "bk": 128, "wgs": 2, "stages": 4, "splits": 1, "held_b": True,
                                 "operands": "s8.s8", "zero_points": "none"}


def test_integer_ptx():
    assert "wgmma.mma_async.sync.aligned.m64n256k32.s32.u8.s8 {" in wgmma_intrinsics.wgmma_ptx(256, int8="u8.s8")
    assert wgmma_intrinsics.wgmma_ptx(8, int8="s8.s8").endswith("da, db, p; }")
    with pytest.raises(ValueError):
        wgmma_intrinsics.wgmma_ptx(40, int8="s8.s8")  # m64n40k32 exists for floats only
    assert [n for n in range(8, 257, 8) if wgmma_intrinsics.int8_columns_ok(n)] == [8, 16, 24] + list(range(32, 257, 16))


# ----------------------------------------------------------------------------- fused through the Builder


def _requantized_model(rng, m, k, n):
    """MatMulInteger (int8 x int8 weight) -> Cast(float) -> Mul(per-column scale) ->
    QuantizeLinear(int8)."""
    inits = [numpy_helper.from_array(ints(rng, I8, (k, n)), "w"),
             numpy_helper.from_array(rng.uniform(2e-3, 6e-3, n).astype(np.float32), "scale"),
             numpy_helper.from_array(np.array(0.05, np.float32), "ys"), numpy_helper.from_array(np.array(3, I8), "yz")]
    nodes = [helper.make_node("MatMulInteger", ["x", "w"], ["acc"], name="matmul"),
             helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["f", "scale"], ["s"], name="rescale"),
             helper.make_node("QuantizeLinear", ["s", "ys", "yz"], ["y"], name="quantize")]
    graph = helper.make_graph(nodes, "requantized", [helper.make_tensor_value_info("x", TensorProto.INT8, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.INT8, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_fused_requantizing_epilogue_through_the_builder(rng, registry):
    """MatMulInteger+Cast+Mul+QuantizeLinear as one layer on the INT8 wgmma tactic (chosen
    by a measure that favours it, after the tuner verified it against the plain tactic),
    storing int8, against onnxruntime on fresh inputs."""
    from plugrt.onnx.backend import prepare

    model = _requantized_model(rng, 70, 64, 16)
    engine = Builder(registry, measure=lambda run: 0.5 if run.tactic.name.startswith("wgmma") else 1.0).build_engine(
        model, BuilderConfig(optimization_level=5))
    layers = engine.inspect()["layers"]
    assert [layer["op"] for layer in layers] == ["MatMulInteger+Cast+Mul+QuantizeLinear"], layers
    assert layers[0]["tactic"].startswith("wgmma_s8s8_"), layers[0]["tactic"]
    context = engine.create_execution_context()
    for _ in range(2):
        feeds = {"x": ints(rng, I8, (70, 64))}
        want = prepare(model, "CPU").run(feeds)[0]
        assert len(np.unique(want)) > 20  # the chain is not all clamped
        got = context.execute(feeds)["y"]
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got, want)


def test_qlinear_matmul_runs_on_the_int8_tactic(rng):
    """QLinearMatMul is MatMulInteger's tactics with a requantizing store: on the INT8
    tactic, with uint8 activations and their run-time zero point corrected at the store."""
    from plugrt.testing import check_node, node_tactics

    f32 = np.float32
    feeds = {"a": ints(rng, U8, (64, 32)), "as": f32(0.05), "az": U8(130), "b": ints(rng, I8, (32, 16)),
             "bs": rng.uniform(0.01, 0.03, 16).astype(f32), "bz": np.zeros(16, I8), "ys": f32(0.3), "yz": U8(4)}
    constants = {"b", "bs", "bz"}
    graph = import_model(single_node_model("QLinearMatMul", feeds, {}, constants, opset=21), registry=default_registry())
    assert any(t.name.startswith("wgmma_u8s8") for t in node_tactics(graph, default_registry()))
    check_node("QLinearMatMul", feeds, constants=constants, opset=21)  # every tactic, exactly


# ----------------------------------------------------------------------------- sm_90 typing


def test_wgmma_int8_kernels_compile_for_the_gpu():
    """sm_90 typing of the production INT8 kernels (the inline-PTX k32 intrinsics with int32
    accumulators): s8.s8 and u8.s8, whole and split, symmetric and corrected, storing int32
    or an epilogue's int8; the split reduction and the row sums."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32, int32
        from plugrt_builtin_ops.matmul import wgmma as W
        from plugrt_builtin_ops.matmul.integer_store import (Int8Operands, integer_split_reduce_kernel,
                                                              row_sums_kernel)

        @cuda.jit(device=True)
        def keep(v, i, ops):
            return v

        @cuda.jit(device=True)
        def requantize(v, i, ops):
            return int32(min(max(float32(v) * ops[1][i % 16], float32(-128)), float32(127)))

        i8, u8, i32, f32, i64 = arr(np.int8), arr(np.uint8), arr(np.int32), arr(np.float32), arr(np.int64)
        for types_, za in (("s8.s8", i8), ("u8.s8", u8)):
            zp = types.Tuple((za, i8, i32, i32, i64))
            for corrected in (False, True):
                ops = Int8Operands(types_, corrected)
                for index, config in enumerate(W.WGMMA_CONFIGS):  # each MMA shape; both stores on the first
                    for split in (False, True) if index == 0 and not corrected else (corrected,):
                        args = [i32, f32, f32, zp, i32, i64, i64, types.float32, types.float32, I64, I64,
                                types.Tuple((i64,))]
                        check(f"{config.name} {types_} {corrected} {split}",
                              W.wgmma_kernel(config, True, True, True, split, keep, False, int8=ops), args)
                config = W.WGMMA_CONFIGS[0]
                args = [i8, f32, f32, zp, i32, i64, i64, types.float32, types.float32, I64, I64,
                        types.Tuple((i64, f32))]
                check(f"{config.name} {types_} {corrected} requantize",
                      W.wgmma_kernel(config, True, True, False, False, requantize, False, int8=ops), args)
                check(f"split reduce {types_} {corrected}", integer_split_reduce_kernel(keep, corrected),
                      [i32, i32, zp, i64, I64, types.Tuple((i64,))])
            check(f"row sums {types_}", row_sums_kernel(), [i32, za, i64, I64, I64, I64, I64, I64])
    """)
    assert not failures, "\\n".join(failures)


# ----------------------------------------------------------------------------- GPU only


@pytest.mark.skipif(simulated(), reason="wgmma needs a Hopper GPU")
@pytest.mark.parametrize("dtypes, a_shape, b_shape, zero_points", [
    ((I8, I8), (300, 192), (192, 520), False),     # ragged, B held transposed
    ((U8, I8), (4, 128, 768), (768, 256), True),   # batch folded into M, zero points corrected
    ((I8, I8), (64, 4096), (4096, 128), False),    # few tiles: split K
])
def test_wgmma_int8_on_the_gpu(rng, monkeypatch, dtypes, a_shape, b_shape, zero_points):
    """Production tiles: the tensor cores against NumPy's int64 product."""
    monkeypatch.setattr(wgmma, "WGMMA_CONFIGS", PRODUCTION)
    a, b = ints(rng, dtypes[0], a_shape), ints(rng, dtypes[1], b_shape)
    feeds = {"a": a, "b": b}
    if zero_points:
        feeds.update(za=ints(rng, dtypes[0], ()), zb=ints(rng, dtypes[1], (b_shape[-1],)))
    graph, tactics, _ = offered(feeds)
    want = oracle(a, b, feeds.get("za"), feeds.get("zb"))
    run_all(graph, tactics, feeds, ("b",), want, corrected=zero_points)
