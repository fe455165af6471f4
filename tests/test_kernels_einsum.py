"""Einsum: the ``direct`` tactic against the reference (simulator without a GPU) over many
equations and dtypes, the equation's parsing and refusals, the conformance kit, and the
kernels compiled for sm_90."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.errors import PlugrtError, ShapeError, UnsupportedError
from plugrt.onnx.importer import import_model
from plugrt.testing import check_node, check_plugin
from plugrt.testing.nodes import node_tactics, single_node_model
from plugrt_builtin_ops.matmul import tactics as matmul_tactics
from plugrt_builtin_ops.matmul.einsum import parse_equation

TOL = {np.float16: {"rtol": 1e-2, "atol": 1e-2}, np.float32: {"rtol": 1e-5, "atol": 1e-5},
       np.float64: {"rtol": 1e-12, "atol": 1e-12}, np.int32: {}, np.int64: {}}


@pytest.fixture(autouse=True)
def tiny_tiles(monkeypatch):
    """The GEMM tactics of plain matrix products with tiles of 4 threads (simulator time)."""
    monkeypatch.setattr(matmul_tactics, "TILE_CONFIGS", ((4, 4, 2, 2, 2),))


#: (equation, input shapes): tiny odd shapes.
EQUATIONS = [
    ("ij,jk->ik", [(3, 5), (5, 2)]),
    ("ij,jk", [(1, 3), (3, 1)]),
    ("bij,bjk->bik", [(2, 3, 5), (2, 5, 3)]),
    ("ij->ji", [(3, 5)]),
    ("ij", [(2, 3)]),
    ("ba", [(2, 3)]),
    ("ii", [(3, 3)]),
    ("ii->i", [(5, 5)]),
    ("iij->ji", [(2, 2, 3)]),
    ("i,j->ij", [(3,), (2,)]),
    ("i,i", [(5,)]*2),
    ("ij->", [(3, 5)]),
    ("ij->j", [(3, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (3, 4, 2)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("i...->...", [(3, 2, 2)]),
    ("...", [(2, 3)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("a,b,c,d->dcba", [(2,), (1,), (3,), (2,)]),
    ("ab, bc ,cd,de -> ae", [(2, 3), (3, 1), (1, 2), (2, 3)]),
    ("bA,Ab", [(2, 3), (3, 2)]),
    ("ij,ij->ij", [(1, 3), (2, 3)]),
    ("bhid,bhjd->bhij", [(1, 2, 3, 4), (1, 2, 2, 4)]),
    ("i,i->", [(0,), (0,)]),
    ("ij,jk->ik", [(2, 0), (0, 3)]),
    ("->", [()]),
    # plain (batched, transposed) matrix products: the GEMM tactics too
    ("ij,kj->ik", [(3, 5), (2, 5)]),
    ("ji,jk->ik", [(5, 3), (5, 2)]),
    ("bij,jk->bik", [(2, 3, 4), (4, 3)]),
    ("ik,bkj->bij", [(3, 4), (2, 4, 3)]),
    ("abij,bjk->abik", [(2, 3, 1, 4), (3, 4, 2)]),
    ("bkm,bnk->bmn", [(2, 3, 4), (1, 5, 3)]),
    ("mbk,kn->bmn", [(3, 2, 4), (4, 5)]),
]

#: Equations that are plain matrix products (the GEMM tactics serve them) and some that are not.
GEMM_FORMS = [("ij,jk->ik", True), ("ij,jk", True), ("ij,kj->ik", True), ("bkm,bnk->bmn", True),
              ("...ij,...jk->...ik", True), ("abij,bjk->abik", True), ("mbk,kn->bmn", True),
              ("ij,jk->ki", False), ("ii,ij->ij", False), ("ij,ij->ij", False), ("ij,jk->i", False),
              ("bij,bjk->ik", False), ("abij,ajk->abik", False), ("i,i", False), ("ijk,jkl->il", False)]


def _feeds(rng, shapes, dtype):
    feeds = {}
    for i, shape in enumerate(shapes):
        if np.dtype(dtype).kind == "f":
            feeds[f"x{i}"] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[f"x{i}"] = rng.integers(-4, 5, shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("equation, shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_einsum_float32(registry, rng, equation, shapes):
    feeds = _feeds(rng, shapes, np.float32)
    (got,) = check_node("Einsum", feeds, {"equation": equation}, registry=registry, **TOL[np.float32])
    np.testing.assert_allclose(got, np.einsum(equation, *feeds.values()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("equation, shapes", [EQUATIONS[i] for i in (0, 2, 6, 8, 13, 17)],
                         ids=[EQUATIONS[i][0] for i in (0, 2, 6, 8, 13, 17)])
def test_einsum_other_dtypes(registry, rng, equation, shapes, dtype):
    check_node("Einsum", _feeds(rng, shapes, dtype), {"equation": equation}, registry=registry, **TOL[dtype])


def test_einsum_float16_sums_in_float32(registry):
    x = np.full((1, 100), 1.0, np.float16)  # summed in float16, 100 * 1.000977 would give 100.0
    y = np.full((100, 1), 1.0 + 2**-10, np.float16)
    (got,) = check_node("Einsum", {"x0": x, "x1": y}, {"equation": "ij,jk->ik"}, registry=registry, rtol=0, atol=0)
    assert got.dtype == np.float16 and got[0, 0] == np.float16(100 * (1.0 + 2**-10)) == np.float16(100.125)


@pytest.mark.parametrize("equation, plain", GEMM_FORMS, ids=[e for e, _ in GEMM_FORMS])
def test_plain_matrix_products_get_the_gemm_tactics(registry, equation, plain):
    lhs = equation.split("->")[0].replace("...", "xy").split(",")
    feeds = {f"x{i}": np.ones([3] * len(term), np.float32) for i, term in enumerate(lhs)}
    graph = import_model(single_node_model("Einsum", feeds, {"equation": equation}, opset=17), registry=registry)
    names = [t.name for t in node_tactics(graph, registry)]
    assert names[-1] == "direct" and len(set(names)) == len(names)
    assert any(n.startswith("gemm_") for n in names) == plain, names


def test_implicit_output_is_alphabetical_after_the_ellipsis():
    assert parse_equation("kj,ji", [2, 2]).output == ("i", "k")
    assert parse_equation("bA", [2]).output == ("A", "b")
    assert parse_equation("...ij,jk", [3, 2]).output == (".0", "i", "k")
    assert parse_equation("ii", [2]).output == ()


MALFORMED = [
    ("ij,jk->ik", [(2, 3)], "2 operand terms for 1 inputs"),
    ("ij->ik", [(2, 3)], "appear in no operand"),
    ("ij->ii", [(2, 3)], "repeated"),
    ("ijk->i", [(2, 3)], "3 letters for an input of rank 2"),
    ("i->i", [(2, 3)], "1 letters for an input of rank 2"),
    ("i1->i", [(2, 3)], "characters ['1']"),
    ("i..j->ij", [(2, 3)], "characters ['.']"),
    ("...i...->i", [(2, 3)], "more than one ellipsis"),
    ("ij->j->i", [(2, 3)], "more than one '->'"),
    ("...ij->ij", [(4, 2, 3)], "needs '...'"),
    ("  ", [(2, 3)], "empty"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "letter 'j' has mismatched dims [3, 4]"),
    ("ii->i", [(2, 3)], "letter 'i' has mismatched dims [2, 3]"),
    ("...i,...i->...i", [(2, 3), (4, 3)], "ellipsis dim 0 has mismatched dims"),
]


@pytest.mark.parametrize("equation, shapes, message", MALFORMED, ids=[m for _, _, m in MALFORMED])
def test_malformed_equations_are_refused(registry, equation, shapes, message):
    feeds = {f"x{i}": np.ones(s, np.float32) for i, s in enumerate(shapes)}
    with pytest.raises(ShapeError) as info:
        check_node("Einsum", feeds, {"equation": equation}, registry=registry)
    assert message in str(info.value) and "Einsum" in str(info.value)


def test_mixed_dtypes_are_refused(registry):
    feeds = {"x0": np.ones((2, 3), np.float32), "x1": np.ones((3, 2), np.float64)}
    with pytest.raises(UnsupportedError, match="mixed input dtypes"):
        check_node("Einsum", feeds, {"equation": "ij,jk"}, registry=registry)


def test_more_than_four_operands_have_no_cuda_tactic(registry, rng):
    feeds = _feeds(rng, [(2,)] * 5, np.float32)
    with pytest.raises(UnsupportedError, match="5 operands.*1 to 4"):
        check_node("Einsum", feeds, {"equation": "a,a,a,a,a->a"}, registry=registry)


def test_the_equation_is_required(registry):
    with pytest.raises(PlugrtError, match="equation"):
        check_node("Einsum", {"x0": np.ones((2, 2), np.float32)}, {}, registry=registry)


def test_einsum_passes_the_conformance_kit(registry):
    report = check_plugin("builtin-matmul", registry=registry, ops=["Einsum"])
    assert report.ops() == ["Einsum"]
    assert len(report.results) > 1 + 10


def test_kernels_compile_for_the_gpu():
    """The simulator does not type kernels: compile every variant for sm_90 (no GPU needed)."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from plugrt_builtin_ops.matmul.einsum import einsum_kernel
        G = arr(np.int64)
        for dt in ("float16", "float32", "float64", "int32", "int64"):
            for n in range(1, 5):
                check(f"Einsum {n} operands {dt}", einsum_kernel(n, np.dtype(dt)),
                      [arr(dt)] * 5 + [G, G, G], dt in ("float16", "float32"))
    """)
    assert not failures, "\n".join(failures)
