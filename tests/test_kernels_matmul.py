"""CUDA tactics of MatMul, Gemm and MatMulInteger against their references (simulator on CI).

The tiled kernels run with tiny tiles here (a few Python threads per block), which still
exercises multi-tile grids, the tile loop over gridDim.x and guarded edge tiles; one test
runs the production tile shapes on a small product.
"""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.ir.graph import Node
from plugrt.plugin import TensorInfo
from plugrt.registry import default_registry
from plugrt.testing import check_node
from plugrt_builtin_ops.matmul import tactics as matmul_tactics

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {F16: (1e-2, 1e-2), F32: (1e-4, 1e-5), F64: (1e-10, 1e-12)}
#: (BM, BN, BK, TM, TN): 4 threads per block; and one whose tile loads leave threads idle.
TINY = (4, 4, 2, 2, 2)
ODD = (3, 4, 2, 1, 2)


@pytest.fixture(autouse=True)
def tiny_tiles(monkeypatch):
    monkeypatch.setattr(matmul_tactics, "TILE_CONFIGS", (TINY,))


def rand(rng, shape, dtype=F32):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -8), min(info.max, 8) + 1, size=shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


def check(op, feeds, attrs=None, dtype=F32, **kw):
    rtol, atol = TOL.get(dtype, (0, 0))
    return check_node(op, feeds, attrs, rtol=rtol, atol=atol, **kw)


# ----------------------------------------------------------------------------- MatMul

@pytest.mark.parametrize("a_shape,b_shape", [
    ((5, 3), (3, 7)), ((1, 6), (6, 1)), ((9, 5), (5, 10)),
    ((6,), (6,)), ((6,), (6, 5)), ((5, 6), (6,)), ((2, 3, 4), (4,)), ((4,), (2, 4, 3)),
    ((2, 1, 3, 4), (5, 4, 6)), ((3, 5, 4), (4, 2)), ((1, 5, 4), (3, 4, 2)), ((2, 3, 4), (1, 4, 5)),
    ((5, 4), (3, 4, 2)),
])
def test_matmul_shapes(rng, a_shape, b_shape):
    check("MatMul", {"a": rand(rng, a_shape), "b": rand(rng, b_shape)})


@pytest.mark.parametrize("dtype", [F16, F64, np.int32, np.int64, np.uint32, np.uint64])
def test_matmul_dtypes(rng, dtype):
    check("MatMul", {"a": rand(rng, (2, 3, 5), dtype), "b": rand(rng, (2, 5, 4), dtype)}, dtype=dtype)


def test_matmul_constant_weight(rng):
    check("MatMul", {"a": rand(rng, (2, 3, 6)), "w": rand(rng, (6, 5))}, constants={"w"})


@pytest.mark.parametrize("a_shape,b_shape", [((0, 3), (3, 4)), ((2, 0), (0, 3)), ((0, 2, 3), (3, 2))])
def test_matmul_empty(rng, a_shape, b_shape):
    check("MatMul", {"a": rand(rng, a_shape), "b": rand(rng, b_shape)})


def test_matmul_odd_tile_and_grid_loop(rng, monkeypatch):
    monkeypatch.setattr(matmul_tactics, "TILE_CONFIGS", (ODD,))
    check("MatMul", {"a": rand(rng, (2, 7, 5)), "b": rand(rng, (5, 9))})
    check("Gemm", {"a": rand(rng, (5, 7)), "b": rand(rng, (9, 5))}, {"transA": 1, "transB": 1})


def test_production_tiles(rng, monkeypatch):
    monkeypatch.setattr(matmul_tactics, "TILE_CONFIGS", matmul_tactics._DEFAULT_TILE_CONFIGS)
    check("MatMul", {"a": rand(rng, (3, 5)), "b": rand(rng, (5, 4))})


# ----------------------------------------------------------------------------- Gemm

@pytest.mark.parametrize("c_shape", [None, (), (5,), (3, 1), (3, 5), (1, 5)])
@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm(rng, trans, c_shape):
    ta, tb = trans
    m, k, n = 3, 7, 5
    feeds = {"a": rand(rng, (k, m) if ta else (m, k)), "b": rand(rng, (n, k) if tb else (k, n))}
    if c_shape is not None:
        feeds["c"] = rand(rng, c_shape)
    check("Gemm", feeds, {"alpha": 0.75, "beta": -1.5, "transA": ta, "transB": tb})


def test_gemm_beta_zero_ignores_c(rng):
    c = np.full((4,), np.nan, F32)
    check("Gemm", {"a": rand(rng, (3, 2)), "b": rand(rng, (2, 4)), "c": c}, {"beta": 0.0})


def test_gemm_omitted_c_constant_weight(rng):
    feeds = {"a": rand(rng, (5, 6)), "w": rand(rng, (4, 6)), "c": None}
    check("Gemm", feeds, {"transB": 1, "alpha": 2.0}, constants={"w"})


@pytest.mark.parametrize("dtype", [F16, F64])
def test_gemm_float_dtypes(rng, dtype):
    feeds = {"a": rand(rng, (4, 3), dtype), "b": rand(rng, (3, 6), dtype), "c": rand(rng, (6,), dtype)}
    check("Gemm", feeds, {"alpha": 0.5, "beta": 2.0}, dtype=dtype)


@pytest.mark.parametrize("dtype,alpha,beta", [
    (np.int32, 1.0, 1.0), (np.int64, 1.0, 1.0), (np.uint32, 1.0, 1.0), (np.int32, 2.5, 1.0), (np.int64, 1.0, -0.5),
])
def test_gemm_integer(rng, dtype, alpha, beta):
    feeds = {"a": rand(rng, (3, 4), dtype), "b": rand(rng, (6, 3), dtype), "c": rand(rng, (4, 1), dtype)}
    check("Gemm", feeds, {"transA": 1, "transB": 1, "alpha": alpha, "beta": beta}, dtype=dtype)


# ----------------------------------------------------------------------------- MatMulInteger

def int8s(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape, dtype=dtype)


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_matmul_integer(rng, a_dtype, b_dtype):
    feeds = {"a": int8s(rng, a_dtype, (2, 3, 5)), "b": int8s(rng, b_dtype, (5, 4)),
             "azp": np.array(rng.integers(1, 100), dtype=a_dtype), "bzp": int8s(rng, b_dtype, (4,))}
    check("MatMulInteger", feeds, opset=10)


@pytest.mark.parametrize("a_shape,b_shape,azp_shape,bzp_shape", [
    ((3, 5), (5, 4), (3,), None),          # per-row A zero point, no B zero point
    ((2, 3, 5), (2, 5, 4), (2, 3, 1), (2, 1, 4)),
    ((5,), (5, 4), None, (1, 4)),
    ((3, 5), (5,), (), ()),
    ((3, 5), (5, 2), None, None),
    ((2, 3, 5), (5, 4), (3,), (4,)),       # per-row zero point keeps A's batch unfolded
])
def test_matmul_integer_zero_point_shapes(rng, a_shape, b_shape, azp_shape, bzp_shape):
    feeds = {"a": int8s(rng, np.uint8, a_shape), "b": int8s(rng, np.int8, b_shape),
             "azp": None if azp_shape is None else int8s(rng, np.uint8, azp_shape),
             "bzp": None if bzp_shape is None else int8s(rng, np.int8, bzp_shape)}
    if bzp_shape is None:
        del feeds["bzp"]
    check("MatMulInteger", feeds, opset=10)


# ----------------------------------------------------------------------------- tactic list

def _tactics(op_type, shapes, dtype=F32, attrs=None):
    op = default_registry().find_op("", op_type, 17)
    node_attrs = {a.name: a.default for a in op.attributes}
    node_attrs.update(attrs or {})
    node = Node("n", op_type, "", tuple(f"x{i}" for i in range(len(shapes))), ("y",), node_attrs, opset=17)
    ins = [TensorInfo(dtype, s) for s in shapes]
    return op.tactics(node, ins, op.infer(node, ins))


def test_tactics_are_ranked_and_named(monkeypatch):
    monkeypatch.setattr(matmul_tactics, "TILE_CONFIGS", matmul_tactics._DEFAULT_TILE_CONFIGS)
    # The SIMT and TF32 families (tests/test_kernels_gemm_tactics.py) come first on a GPU;
    # among the tiled tactics the tile that fits the shape leads.
    big = [t.name for t in _tactics("MatMul", [(4, 512, 768), (768, 3072)])]
    tiled = [name for name in big if name.startswith(("tiled", "direct"))]
    assert tiled[0] == "tiled128x128x8_8x8" and big[-1] == "direct"
    assert any(name.startswith("simt") for name in big) and any(name.startswith("tf32") for name in big)
    small = [t.name for t in _tactics("MatMul", [(1, 128, 768), (768, 768)])]
    assert [name for name in small if name.startswith("tiled")][0] == "tiled32x32x16_2x2"
    gemv = _tactics("Gemm", [(1, 512), (1000, 512)], attrs={"transB": 1})
    assert [t.name for t in gemv[:3]] == ["gemv_kdot", "gemv_columns", "direct"]
    assert gemv[3].params == {"bm": 32, "bn": 32, "bk": 16, "tm": 2, "tn": 2}


def test_matmul_integer_refuses_zero_point_that_enlarges_operand():
    from plugrt.errors import UnsupportedError

    op = default_registry().find_op("", "MatMulInteger", 10)
    node = Node("n", "MatMulInteger", "", ("a", "b", "azp"), ("y",), {}, opset=10)
    ins = [TensorInfo(np.uint8, (3, 5)), TensorInfo(np.uint8, (5, 4)), TensorInfo(np.uint8, (2, 3, 1))]
    with pytest.raises(UnsupportedError, match="zero point"):
        op.tactics(node, ins, op.infer(node, ins))
