"""The fused kernel's tactics against the NumPy reference, and their compilation for sm_90."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from plugrt.testing import check_node
from plugrt_contrib_attention import simt, tactics, tensor_cores
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE
from plugrt_contrib_attention.problem import MAX_SHARED_BYTES, AttentionShapes

RTOL, ATOL = 1e-4, 1e-5
TF32_TOL = 5e-3  # TF32 products keep 10 mantissa bits


def attention(feeds, attrs=None, rtol=RTOL, atol=ATOL, tf32_tol=TF32_TOL):
    """Every tactic against the reference: fp32 ones at ``rtol``/``atol``, TF32 ones at
    ``tf32_tol``; returns the reference outputs."""
    names = [config.name for config in tactics.candidates()]
    tf32 = [name for name in names if name.startswith("tf32")]
    kw = dict(domain=DOMAIN, opset=1)
    check_node(OP_TYPE, feeds, attrs, rtol=tf32_tol, atol=tf32_tol, tactics=tf32, **kw)
    return check_node(OP_TYPE, feeds, attrs, rtol=rtol, atol=atol, tactics=[n for n in names if n not in tf32], **kw)


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# (B, H, Sq, Sk, D, Dv): tiles of 4 and 8 rows/keys in the simulator, so these cover a
# partial last tile (5, 7, 9), an exact fit (8), a single short tile (3) and odd head sizes.
SHAPES = [(1, 2, 5, 7, 4, 4), (2, 1, 8, 8, 8, 8), (1, 1, 9, 3, 5, 3), (1, 1, 3, 12, 6, 9)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tactics_match_reference(shape, rng):
    b, h, sq, sk, d, dv = shape
    feeds = {"q": randn(rng, b, h, sq, d), "k": randn(rng, b, h, sk, d), "v": randn(rng, b, h, sk, dv)}
    want = attention(feeds)[0]
    q64, k64, v64 = (feeds[n].astype(np.float64) for n in "qkv")
    scores = q64 @ np.swapaxes(k64, -1, -2) / math.sqrt(d)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(want, (weights / weights.sum(-1, keepdims=True)) @ v64, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 6), (5, 6), (2, 2, 5, 6)])
def test_additive_mask_and_scale(mask_shape, rng):
    feeds = {"q": randn(rng, 2, 2, 5, 4), "k": randn(rng, 2, 2, 6, 4), "v": randn(rng, 2, 2, 6, 4),
             "mask": randn(rng, *mask_shape)}
    attention(feeds, {"scale": 0.3})


def test_masked_keys_get_no_weight(rng):
    """A -inf (or very negative) mask drops keys; a fully masked tile before unmasked ones
    must not poison the running sums."""
    q, k, v = randn(rng, 1, 1, 4, 4), randn(rng, 1, 1, 10, 4), randn(rng, 1, 1, 10, 4)
    mask = np.zeros((1, 1, 1, 10), np.float32)
    mask[..., :5] = -np.inf
    mask[..., 8] = np.finfo(np.float32).min
    got = attention({"q": q, "k": k, "v": v, "mask": mask})[0]
    keep = [5, 6, 7, 9]
    plain = attention({"q": q, "k": k[:, :, keep], "v": v[:, :, keep]}, {"scale": 0.5})[0]
    np.testing.assert_allclose(got, plain, rtol=RTOL, atol=ATOL)


def test_rows_masked_everywhere_by_the_lowest_float(rng):
    """Padding rows masked with finfo.min on every key (as HuggingFace masks) average V,
    as the reference does, rather than turning into NaN."""
    q, k, v = randn(rng, 1, 1, 3, 4), randn(rng, 1, 1, 9, 4), randn(rng, 1, 1, 9, 4)
    mask = np.zeros((1, 1, 3, 9), np.float32)
    mask[:, :, 1] = np.finfo(np.float32).min
    got = attention({"q": q, "k": k, "v": v, "mask": mask})[0]
    assert np.all(np.isfinite(got))


def test_shared_keys_and_values_broadcast_over_heads(rng):
    feeds = {"q": randn(rng, 2, 3, 4, 4), "k": randn(rng, 2, 1, 5, 4), "v": randn(rng, 1, 1, 5, 4)}
    attention(feeds)


def test_float16(rng):
    feeds = {"q": randn(rng, 1, 2, 5, 8, dtype=np.float16), "k": randn(rng, 1, 2, 6, 8, dtype=np.float16),
             "v": randn(rng, 1, 2, 6, 8, dtype=np.float16)}
    attention(feeds, rtol=1e-2, atol=1e-3, tf32_tol=1e-2)


def test_gpu_tiles_on_a_ragged_problem(monkeypatch, rng):
    """The GPU's tile configurations, on one ragged problem (the simulator runs the scalar
    form of the vector loads and emulates the tensor cores; the kernel code and indexing
    are the same)."""
    geometries = {(c.bq, c.bk, c.ty, c.tx): c for c in simt.GPU_CONFIGS}  # vector or not: the same here
    gpu = tuple(geometries.values()) + tensor_cores.GPU_CONFIGS[:2]
    monkeypatch.setattr(tactics, "candidates", lambda gpu_=None: gpu)
    feeds = {"q": randn(rng, 1, 1, 3, 5), "k": randn(rng, 1, 1, 6, 5), "v": randn(rng, 1, 1, 6, 6),
             "mask": randn(rng, 3, 6)}
    attention(feeds, {"scale": 0.7})


def test_tactics_are_ordered_and_named():
    shapes = AttentionShapes.of((8, 12, 512, 64), (8, 12, 512, 64), (8, 12, 512, 64))
    configs = tactics.candidates(gpu=True)
    found = tactics.attention_tactics(shapes, np.float32, 0.125, configs)
    names = [t.name for t in found]
    assert names[0] == "flash64x64_t8x16_scalar"  # plain Numba: the tuner verifies the others against it
    assert [t.math for t in found[1:3]] == ["tf32", "tf32"]  # timed at the default level when TF32 is on
    assert [t.name for t in found if not t.math][:4] == [c.name for c in simt.GPU_CONFIGS[:4]]
    assert len(set(names)) == len(names) == len(configs)
    for config in simt.GPU_CONFIGS:
        assert config.layout(64, 64).nbytes <= MAX_SHARED_BYTES
    for config in tensor_cores.GPU_CONFIGS:
        assert tensor_cores.Tf32Layout.of(config, 64, 64).nbytes <= MAX_SHARED_BYTES
    big = AttentionShapes.of((1, 1, 8, 512), (1, 1, 8, 512), (1, 1, 8, 512))
    assert len(tactics.attention_tactics(big, np.float32, 1.0, configs)) < len(configs)


_TYPING = """
import os, types as pytypes
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
import numpy as np
from numba import from_dtype, types
from numba.cuda.compiler import compile_cuda
import numba.cuda.dispatcher as dispatcher
dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))
import plugrt
from plugrt_contrib_attention import simt, tensor_cores

def arr(dtype):
    return types.Array(from_dtype(np.dtype(dtype)), 1, "C")

failures = []
# the scalar and vector shared loads and the tensor-core kernel, each in float32 with a mask
# and bounds checks and in float16 without (launch bounds only reach ptxas)
# (the first two with the NaN guard of exports' SDPA)
cases = [(simt.flash_kernel, simt.GPU_CONFIGS[0], "float32", 64, 64, True, False, True),
         (simt.flash_kernel, simt.GPU_CONFIGS[1], "float16", 40, 24, False, True, False),
         (tensor_cores.tf32_kernel, tensor_cores.GPU_CONFIGS[0], "float32", 64, 64, True, False, True),
         (tensor_cores.tf32_kernel, tensor_cores.GPU_CONFIGS[1], "float16", 40, 24, False, True, False)]
for make, config, dtype, d, dv, mask, even, guard in cases:
    tensor = make is tensor_cores.tf32_kernel
    flags = (False,) if tensor else ()  # the tensor-core kernel's GPU form, not the emulation
    kernel = make(config, d, dv, dtype, mask, even, even, *flags, guard_nan=guard)
    args = (arr(dtype),) * 5 + (types.int64,) * 11 + (types.float32,)
    try:
        ir = compile_cuda(kernel.py_func, types.void, args, cc=(9, 0)).library.get_llvm_str()
        if " double " in ir:
            failures.append(f"{kernel.__name__}: float64 arithmetic")
        if not tensor and config.vector and "load <4 x float>" not in ir:
            failures.append(f"{kernel.__name__}: no 16-byte shared loads")
        if tensor and "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" not in ir:
            failures.append(f"{kernel.__name__}: no tensor-core mma")
    except Exception as error:
        failures.append(f"{kernel.__name__}: {type(error).__name__}: {str(error)[:1500]}")
print("FAILURES=" + repr(failures))
"""


def test_kernels_compile_for_sm90():
    """The simulator never types kernels: compile every GPU tactic's kernel with Numba's
    real CUDA target (to LLVM IR for sm_90, no GPU needed), float64-free."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_TYPING)], capture_output=True, text=True,
                          env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("FAILURES=")]
    if not lines:
        pytest.skip(f"Numba's CUDA target is not usable here: {done.stderr.strip().splitlines()[-1:]}")
    assert lines[0] == "FAILURES=[]", lines[0]
