"""Matrix-vector products (``gemv_kdot``, ``gemv_columns``): every such MatMul and Gemm
against the plugin's reference, float32 and float16, batched, with Gemm's C, alpha and
beta; repeated runs give the same bits; other products are not offered them."""

from __future__ import annotations

import numpy as np
import pytest
from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.testing import check_node, node_tactics, run_tactic, single_node_model

GEMV = ["gemv_kdot", "gemv_columns"]


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("op_type, shapes, attrs, dtype", [
    ("MatMul", {"a": (1, 70), "b": (70, 45)}, {}, np.float32),              # a classifier head, B [K, N]
    ("MatMul", {"a": (37, 64), "b": (64, 1)}, {}, np.float32),              # N = 1
    ("MatMul", {"a": (2, 1, 40), "b": (2, 40, 33)}, {}, np.float32),        # batched
    ("MatMul", {"a": (40,), "b": (40, 9)}, {}, np.float16),                 # 1-D A, float16
    ("Gemm", {"a": (1, 96), "b": (20, 96), "c": (20,)}, {"transB": 1, "alpha": 0.5, "beta": 2.0}, np.float32),
    ("Gemm", {"a": (96, 1), "b": (96, 12)}, {"transA": 1}, np.float16),    # A column-major
])
def test_gemv_tactics_match_the_reference(rng, op_type, shapes, attrs, dtype):
    feeds = {name: rand(rng, shape, dtype) for name, shape in shapes.items()}
    graph = import_model(single_node_model(op_type, feeds, attrs), registry=default_registry())
    assert set(GEMV) <= {t.name for t in node_tactics(graph, default_registry())}
    tol = 2e-3 if dtype == np.float16 else 1e-5
    check_node(op_type, feeds, attrs, tactics=GEMV, rtol=tol, atol=tol)


def test_gemv_is_offered_first_for_matrix_vector_products_only(rng):
    registry = default_registry()

    def names(shapes):
        feeds = {name: rand(rng, shape) for name, shape in shapes.items()}
        graph = import_model(single_node_model("MatMul", feeds), registry=registry)
        return [t.name for t in node_tactics(graph, registry)]

    assert names({"a": (1, 64), "b": (64, 10)})[:2] == GEMV
    assert not set(GEMV) & set(names({"a": (8, 64), "b": (64, 10)}))
    assert not set(GEMV) & set(names({"a": (1, 8), "b": (8, 10)}))  # K too short to share


def test_gemv_results_repeat_bit_for_bit(rng):
    feeds = {"a": rand(rng, (1, 200)), "b": rand(rng, (200, 40))}
    registry = default_registry()
    graph = import_model(single_node_model("MatMul", feeds), registry=registry)
    for tactic in node_tactics(graph, registry):
        if tactic.name in GEMV:
            first = run_tactic(graph, tactic, feeds)[0]
            assert np.array_equal(first, run_tactic(graph, tactic, feeds)[0]), tactic.name
