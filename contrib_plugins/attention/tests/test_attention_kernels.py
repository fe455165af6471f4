"""The fused kernel's tactics against the NumPy reference, and their compilation for sm_90."""

from __future__ import annotations

import math
import sys
from pathlib import Path

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
    plain = [n for n in names if n not in tf32]
    if tf32:
        want = check_node(OP_TYPE, feeds, attrs, rtol=tf32_tol, atol=tf32_tol, tactics=tf32, **kw)
    return check_node(OP_TYPE, feeds, attrs, rtol=rtol, atol=atol, tactics=plain, **kw) if plain or not tf32 else want


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


#: The GPU's tile configurations (vector loads or not: the same in the simulator), each its
#: own test so that the slow emulated ones spread over the workers.
GPU_TILES = tuple({(c.bq, c.bk, c.ty, c.tx): c for c in simt.GPU_CONFIGS}.values()) + tensor_cores.GPU_CONFIGS[:2]


@pytest.mark.parametrize("config", GPU_TILES, ids=lambda c: c.name)
def test_gpu_tiles_on_a_ragged_problem(monkeypatch, rng, config):
    """Each GPU tile configuration on one ragged problem (the simulator runs the scalar form
    of the vector loads and emulates the tensor cores; the kernel code and indexing are the
    same); the smallest SIMT tile and the first tensor-core tile causal too, in other head
    layouts (the 64x64 SIMT tiles cost minutes each in the simulator)."""
    monkeypatch.setattr(tactics, "candidates", lambda gpu_=None: (config,))
    feeds = {"q": randn(rng, 1, 1, 3, 5), "k": randn(rng, 1, 1, 6, 5), "v": randn(rng, 1, 1, 6, 6),
             "mask": randn(rng, 3, 6)}
    attention(feeds, {"scale": 0.7})
    if config.name in ("flash32x64_t4x16", tensor_cores.GPU_CONFIGS[0].name):
        attention({n: feeds[n] for n in "qkv"}, {"causal": 2, "layout": "bshd,bhsd,bhsd,bshd"})


@pytest.mark.parametrize("causal, sq, sk, masked", [(1, 9, 12, False), (1, 12, 5, True), (2, 9, 12, True),
                                                    (2, 3, 12, False), (2, 12, 5, True)], ids=lambda x: str(x))
def test_causal(causal, sq, sk, masked, rng):
    """Either alignment over ragged tiles, with and without a mask: key tiles wholly past a
    block's diagonal left out; rows that see no key (lower right, Sq > Sk) zeros (guarded)."""
    feeds = {"q": randn(rng, 2, 2, sq, 4), "k": randn(rng, 2, 2, sk, 4), "v": randn(rng, 2, 2, sk, 5)}
    if masked:
        feeds["mask"] = randn(rng, 2, 1, 1, sk)
    want = attention(feeds, {"causal": causal, "guard_nan": 1})[0]
    diag = sk - sq if causal == 2 else 0
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    scores = q @ np.swapaxes(k, -1, -2) / 2 + (feeds["mask"] if masked else 0)
    scores = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + diag, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        expected = np.nan_to_num((weights / weights.sum(-1, keepdims=True))) @ v
    np.testing.assert_allclose(want, expected, rtol=1e-5, atol=1e-6)


def test_causal_fill_replaces_the_scores_before_the_mask(rng):
    """``causal_fill`` is the exports' ``Where(causal, s, finfo.min) + mask``: a row whose
    visible keys are all masked by finfo.min averages V over every key at finfo.min."""
    low = np.finfo(np.float32).min
    feeds = {"q": randn(rng, 1, 1, 5, 4), "k": randn(rng, 1, 1, 5, 4), "v": randn(rng, 1, 1, 5, 4)}
    feeds["mask"] = np.array([low, low, 0, 0, 0], np.float32).reshape(1, 1, 1, 5)
    got = attention(feeds, {"causal": 1, "causal_fill": float(low)})[0]
    scores = (feeds["q"] @ np.swapaxes(feeds["k"], -1, -2) / 2).astype(np.float32)
    with np.errstate(over="ignore"):
        logits = np.where(np.tri(5, 5, dtype=bool), scores, low) + feeds["mask"]
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (weights / weights.sum(-1, keepdims=True)) @ feeds["v"], rtol=1e-5, atol=1e-6)
    # row 1 sees keys 0 and 1, both masked: every key scores finfo.min, the output is V's mean
    np.testing.assert_allclose(got[0, 0, 1], feeds["v"][0, 0].mean(0), rtol=1e-5, atol=1e-6)


def test_key_tiles_past_the_diagonal_are_not_read(rng):
    """Keys 64..71 are past the diagonal of every query row (Sq = 4) and start a key tile
    at every tile size offered (4 and 8 here, 32 and 64 on a GPU): with a -inf fill no
    tactic stages them, so NaN there changes nothing. (Keys inside a staged tile are read:
    their weight is 0, but 0 * NaN is NaN, as in PyTorch.)"""
    from plugrt.onnx.importer import import_model
    from plugrt.registry import default_registry
    from plugrt.testing import node_tactics, run_tactic, single_node_model

    feeds = {"q": randn(rng, 1, 2, 4, 4), "k": randn(rng, 1, 2, 72, 4), "v": randn(rng, 1, 2, 72, 4)}
    want = attention({n: x[:, :, :64] if n != "q" else x for n, x in feeds.items()}, {"causal": 1})[0]
    poisoned = {n: x.copy() for n, x in feeds.items()}
    poisoned["k"][:, :, 64:] = poisoned["v"][:, :, 64:] = np.nan
    registry = default_registry()
    graph = import_model(single_node_model(OP_TYPE, poisoned, {"causal": 1}, domain=DOMAIN, opset=1),
                         registry=registry)
    for tactic in node_tactics(graph, registry):
        tol = TF32_TOL if tactic.math == "tf32" else RTOL
        np.testing.assert_allclose(run_tactic(graph, tactic, poisoned)[0], want, rtol=tol, atol=tol,
                                   err_msg=tactic.name)


def test_grouped_kv_heads(rng):
    """K with 2 heads and V with 1 for Q's 4: query head h reads K head h // 2."""
    feeds = {"q": randn(rng, 2, 4, 5, 4), "k": randn(rng, 2, 2, 6, 4), "v": randn(rng, 1, 1, 6, 3)}
    got = attention(feeds, {"causal": 2})[0]
    repeated = dict(feeds, k=np.repeat(feeds["k"], 2, axis=1))
    np.testing.assert_allclose(got, attention(repeated, {"causal": 2})[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("layout", ["bsh,bsh,bsh,bsh", "bsh,bhsd,bshd,bshd", "bhsd,bsh,bsh,bsh"])
def test_head_layouts(layout, rng):
    """Each tensor in its layout, against the same problem in [B, H, S, D]."""
    b, h, sq, sk, d, kv = 2, 4, 5, 7, 4, 2
    plain = {"q": randn(rng, b, h, sq, d), "k": randn(rng, b, kv, sk, d), "v": randn(rng, b, kv, sk, d),
             "mask": randn(rng, b, 1, sq, sk)}
    want = attention(plain, {"causal": 1})[0]
    q_l, k_l, v_l, o_l = layout.split(",")

    def laid(x, tensor_layout):
        swapped = np.ascontiguousarray(np.swapaxes(x, 1, 2))
        return x if tensor_layout == "bhsd" else swapped if tensor_layout == "bshd" else \
            swapped.reshape(x.shape[0], x.shape[2], -1)

    feeds = {"q": laid(plain["q"], q_l), "k": laid(plain["k"], k_l), "v": laid(plain["v"], v_l), "mask": plain["mask"]}
    got = attention(feeds, {"causal": 1, "layout": layout, "num_heads": h, "kv_num_heads": kv})[0]
    np.testing.assert_allclose(got, laid(want, o_l), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("heads, kv_heads, d", [(2, 2, 8), (3, 1, 4)], ids=["aligned", "offsets_not_of_8"])
def test_packed_projection_read_in_place(heads, kv_heads, d, dtype, rng):
    """Q, K and V as column slices of one [B, S, nq + nk + nv] tensor (``packed``): every
    tactic reads them at their offsets, against float64 NumPy; the 16-byte alignment
    kernels need holds where the offsets are multiples of 8 elements."""
    b, s, nq, nk = 2, 5, heads * d, kv_heads * d
    x = randn(rng, b, s, nq + 2 * nk, dtype=dtype)
    attrs = {"layout": "bsh,bsh,bsh,bsh", "num_heads": heads, "kv_num_heads": kv_heads, "packed": [nq, nk, nk]}
    half = dtype == np.float16
    got = attention({"q": x, "k": x, "v": x}, attrs, **(dict(rtol=1e-2, atol=2e-3, tf32_tol=1e-2) if half else {}))[0]

    def heads_of(columns, count):
        return np.repeat(columns.astype(np.float64).reshape(b, s, count, d).swapaxes(1, 2), heads // count, axis=1)

    q, k, v = heads_of(x[..., :nq], heads), heads_of(x[..., nq:nq + nk], kv_heads), heads_of(x[..., nq + nk:], kv_heads)
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = ((weights / weights.sum(-1, keepdims=True)) @ v).swapaxes(1, 2).reshape(b, s, nq)
    np.testing.assert_allclose(got, want, rtol=1e-2 if half else 1e-5, atol=2e-3 if half else 1e-6)
    shapes = AttentionShapes.of(x.shape, x.shape, x.shape, layout=attrs["layout"], num_heads=heads,
                                kv_num_heads=kv_heads, packed=attrs["packed"])
    assert shapes.offsets == (0, nq, nq + nk) and shapes.q_strides == (s * x.shape[2], d, x.shape[2])
    assert shapes.aligned(8) == (nq % 8 == 0 and nk % 8 == 0 and d % 8 == 0)


def test_tactics_are_ordered_and_named():
    shapes = AttentionShapes.of((8, 12, 512, 64), (8, 12, 512, 64), (8, 12, 512, 64))
    configs = tactics.candidates(gpu=True)
    found = tactics.attention_tactics(shapes, np.float32, 0.125, configs)
    names = [t.name for t in found]
    assert names[0] == "flash64x64_t8x16_scalar"  # plain Numba: the tuner verifies the others against it
    assert [t.math for t in found[1:3]] == ["tf32", "tf32"]  # timed at the default level when TF32 is on
    assert [t.name for t in found if not t.math][:4] == [c.name for c in simt.GPU_CONFIGS[:4]]
    # Then each one's bounds-checked twin, the kernel every sequence length of a dynamic
    # profile runs (512 fills whole tiles: the tactics above leave the checks out).
    assert len(set(names)) == len(names) == 2 * len(configs)
    assert names[len(configs):] == [f"{name}_ragged" for name in names[:len(configs)]]
    assert all(any(t.params["even"]) for t in found[:len(configs)])
    assert not any(any(t.params["even"]) for t in found[len(configs):])
    for config in simt.GPU_CONFIGS:
        assert config.layout(64, 64).nbytes <= MAX_SHARED_BYTES
    for config in tensor_cores.GPU_CONFIGS:
        assert tensor_cores.Tf32Layout.of(config, 64, 64).nbytes <= MAX_SHARED_BYTES
    big = AttentionShapes.of((1, 1, 8, 512), (1, 1, 8, 512), (1, 1, 8, 512))
    assert len(tactics.attention_tactics(big, np.float32, 1.0, configs)) < 2 * len(configs)


def test_kernels_compile_for_sm90():
    """The simulator never types kernels: compile every GPU tactic's kernel with Numba's
    real CUDA target (to LLVM IR for sm_90, no GPU needed, tests/cuda_typing.py), float64-free:
    the scalar and vector shared loads and the tensor-core kernel, with and without a mask,
    bounds checks, the NaN guard, either causal alignment, a causal fill and key-tile skipping
    (launch bounds only reach ptxas)."""
    helper_dir = Path(__file__).resolve().parents[3] / "tests"
    if not (helper_dir / "cuda_typing.py").exists():
        pytest.skip("tests/cuda_typing.py of the plugrt repository is not available")
    sys.path.insert(0, str(helper_dir))
    try:
        from cuda_typing import compile_kernels
    finally:
        sys.path.remove(str(helper_dir))
    failures = compile_kernels("""
        from plugrt_contrib_attention import simt, tensor_cores

        low = float(np.finfo(np.float32).min)
        cases = [(simt.flash_kernel, simt.GPU_CONFIGS[0], "float32", 64, 64, True, False, True, 1, low, False),
                 (simt.flash_kernel, simt.GPU_CONFIGS[1], "float16", 40, 24, False, True, False, 2, -np.inf, True),
                 (simt.flash_kernel, simt.GPU_CONFIGS[2], "float32", 64, 64, True, True, False, 0, -np.inf, True),
                 (tensor_cores.tf32_kernel, tensor_cores.GPU_CONFIGS[0], "float32", 64, 64, True, False, True, 2,
                  low, False),
                 (tensor_cores.tf32_kernel, tensor_cores.GPU_CONFIGS[1], "float16", 40, 24, False, True, False, 1,
                  -np.inf, True),
                 (tensor_cores.tf32_kernel, tensor_cores.GPU_CONFIGS[2], "float32", 64, 64, False, True, False, 0,
                  -np.inf, True)]
        for make, config, dtype, d, dv, mask, even, guard, causal, fill, skip in cases:
            tensor = make is tensor_cores.tf32_kernel
            flags = (False,) if tensor else ()  # the tensor-core kernel's GPU form, not the emulation
            kernel = make(config, d, dv, dtype, mask, even, even, *flags, guard_nan=guard, causal=causal,
                          causal_fill=fill, skip_keys=skip)
            args = (arr(dtype),) * 5 + (I64,) * 22 + (types.float32,)
            label = kernel.__name__
            try:
                ir = compile_cuda(kernel.py_func, types.void, args, cc=(9, 0)).library.get_llvm_str()
            except Exception as error:
                RESULTS.append(label + ": " + type(error).__name__ + ": " + str(error)[:1500])
                continue
            if " double " in ir:
                RESULTS.append(label + ": float64 arithmetic")
            if not tensor and config.vector and "load <4 x float>" not in ir:
                RESULTS.append(label + ": no 16-byte shared loads")
            if tensor and "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" not in ir:
                RESULTS.append(label + ": no tensor-core mma")
    """, timeout=900)
    assert not failures, "\n".join(failures)
