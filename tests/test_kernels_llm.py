"""Kernels of the ops transformer exports fuse into (RotaryEmbedding, Swish, RMSNormalization,
LayerNormalization and Gelu's tanh form): node checks against the references, the
conformance kit over the ops' examples, and sm_90 typing of the new kernels."""

from __future__ import annotations

import numpy as np
import pytest

from plugrt.testing import check_node, check_plugin
from plugrt_builtin_ops.elementwise.rotary import geometry
from plugrt_builtin_ops.elementwise.rotary_ops import DOMAIN

F16, F32, F64 = np.float16, np.float32, np.float64
TOL = {F16: dict(rtol=3e-3, atol=3e-3), F32: dict(rtol=1e-5, atol=1e-6), F64: dict(rtol=1e-12, atol=1e-12)}


def rope_feeds(rng, x_shape, table_shape, dtype=F32):
    return {"x": rng.standard_normal(x_shape).astype(dtype),
            "cos": rng.uniform(-1, 1, table_shape).astype(dtype), "sin": rng.uniform(-1, 1, table_shape).astype(dtype)}


# ---------------------------------------------------------------- RotaryEmbedding

@pytest.mark.parametrize("x_shape, table_shape", [((2, 3, 4, 8), (2, 1, 4, 8)), ((2, 3, 4, 8), (1, 1, 4, 8)),
                                                  ((2, 3, 4, 8), (4, 8)), ((3, 6), (3, 6)), ((6,), (6,)),
                                                  ((2, 5, 4), (2, 5, 1)), ((1, 2, 1, 2), (1, 1, 1, 2))])
def test_rotary_embedding_broadcasts(rng, x_shape, table_shape):
    check_node("RotaryEmbedding", rope_feeds(rng, x_shape, table_shape), domain=DOMAIN, opset=1, **TOL[F32])


@pytest.mark.parametrize("dtype", [F16, F64])
def test_rotary_embedding_dtypes(rng, dtype):
    check_node("RotaryEmbedding", rope_feeds(rng, (1, 2, 3, 8), (1, 1, 3, 8), dtype), domain=DOMAIN, opset=1,
               **TOL[dtype])


def test_rotary_embedding_constant_tables_and_empty(rng):
    check_node("RotaryEmbedding", rope_feeds(rng, (2, 2, 3, 4), (3, 4)), domain=DOMAIN, opset=1,
               constants={"cos", "sin"}, **TOL[F32])
    check_node("RotaryEmbedding", rope_feeds(rng, (0, 2, 3, 4), (1, 1, 3, 4)), domain=DOMAIN, opset=1)


def test_rotary_embedding_refuses_odd_and_growing_shapes(rng):
    with pytest.raises(Exception, match="even"):
        check_node("RotaryEmbedding", rope_feeds(rng, (2, 5), (2, 5)), domain=DOMAIN, opset=1)
    with pytest.raises(Exception, match="does not broadcast"):
        check_node("RotaryEmbedding", rope_feeds(rng, (1, 4), (2, 4)), domain=DOMAIN, opset=1)


def test_rotary_geometry_merges_dims_broadcast_alike():
    table, ndim, cos_last, sin_last = geometry((2, 3, 4, 8), (1, 1, 4, 8), (1, 1, 4, 8))
    assert ndim == 2 and table.tolist() == [[6, 4], [0, 8], [0, 8]] and (cos_last, sin_last) == (1, 1)
    table, ndim, _, _ = geometry((2, 3, 4, 8), (2, 1, 4, 8), (2, 1, 4, 8))
    assert ndim == 3 and table[1].tolist() == [32, 0, 8]
    assert geometry((2, 5, 4), (2, 5, 1), (2, 5, 1))[2:] == (0, 0)


# ---------------------------------------------------------------- the conformance kit

@pytest.mark.parametrize("plugin, op", [("builtin-elementwise", f"{DOMAIN}::RotaryEmbedding"),
                                        ("builtin-activation", "Swish"), ("builtin-activation", "Gelu"),
                                        ("builtin-normalization", "RMSNormalization"),
                                        ("builtin-normalization", "LayerNormalization")])
def test_ops_pass_the_conformance_kit(registry, plugin, op):
    report = check_plugin(plugin, registry=registry, ops=[op])
    assert report.ops() == [op]


# ---------------------------------------------------------------- GPU typing

def test_rotary_kernel_and_swish_compile_for_the_gpu():
    """The rotary pair kernel for float16/32/64 data, and Swish's device function inside a
    kernel, typed for sm_90; float32 and float16 data stay free of float64 arithmetic."""
    from cuda_typing import compile_kernels

    failures = compile_kernels("""
        from numba import cuda, float32
        from plugrt_builtin_ops.activation.device_functions import device_function
        from plugrt_builtin_ops.elementwise import rotary

        T = arr(np.int64, 2)
        for dt in ("float16", "float32", "float64"):
            kernel = rotary.rotary_kernel(rotary.accumulator(dt).name)
            check(f"rotary {dt}", kernel, [arr(dt)] * 4 + [I64, I64, I64, T, I64, I64], dt != "float64")

        for dt in ("float16", "float32"):
            for params in ((1.0,), (1.702,)):
                swish = device_function("Swish", np.dtype(dt), params)

                @cuda.jit
                def apply(y, x):
                    y[0] = swish(float32(x[0]))

                check(f"swish {dt} {params}", apply, [arr(dt), arr(dt)], True)
    """)
    assert not failures, "\n".join(failures)
