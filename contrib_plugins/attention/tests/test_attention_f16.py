"""The FP16 tensor-core tactics (float16 data) against float64 NumPy, their order among the
op's tactics, and their compilation for sm_90.

In the simulator the kernel runs its emulated warp steps (:mod:`plugrt_contrib_attention.warp_f16`):
every fragment register goes through the same lanes as on a GPU, so these tests check the
fragment bookkeeping (ldmatrix rows, the S accumulators reused as P's A fragments), with
FP16 operands and float32 accumulation as the tensor cores do.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from plugrt.onnx.importer import import_model
from plugrt.registry import default_registry
from plugrt.testing import node_tactics, run_tactic, single_node_model
from plugrt_contrib_attention import tactics, tensor_cores, tensor_cores_f16
from plugrt_contrib_attention.op import DOMAIN, OP_TYPE
from plugrt_contrib_attention.problem import MAX_SHARED_BYTES, AttentionShapes

#: FP16 products (P rounded to FP16, float32 sums) and a float16 output: about 1e-3 of the
#: output's scale; a misplaced fragment is off by the output's whole scale.
RTOL, ATOL = 1e-2, 2e-3


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float16)


def f16_outputs(feeds: dict, attrs: dict | None = None) -> dict:
    """Each FP16 tactic's output for a one-node model, by tactic name; a ragged twin only
    where its tile leaves bounds checks out (elsewhere it is the same kernel)."""
    registry = default_registry()
    graph = import_model(single_node_model(OP_TYPE, feeds, attrs or {}, domain=DOMAIN, opset=1), registry=registry)
    offered = [t for t in node_tactics(graph, registry) if t.name.startswith("f16_")]
    even = {t.name for t in offered if any(t.params["even"])}
    found = [t for t in offered if not t.name.endswith("_ragged") or t.name[:-len("_ragged")] in even]
    assert found, "no FP16 tactic offered"
    return {t.name: run_tactic(graph, t, feeds)[0].astype(np.float64) for t in found}


def reference(q, k, v, mask=None, scale=None, causal=0, fill=-np.inf, guard=False):
    """float64 attention of [B, H, S, D] tensors; K and V may have fewer heads (grouped)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    heads, sq, sk = q.shape[1], q.shape[2], k.shape[2]
    k, v = np.repeat(k, heads // k.shape[1], axis=1), np.repeat(v, heads // v.shape[1], axis=1)
    scores = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        diag = sk - sq if causal == 2 else 0
        scores = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + diag, scores, fill)
    if mask is not None:
        scores = scores + np.asarray(mask, np.float64)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        out = (weights / weights.sum(-1, keepdims=True)) @ v
    return np.nan_to_num(out) if guard else out


def assert_close(outputs: dict, want: np.ndarray) -> None:
    for name, got in outputs.items():
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=name)


# (B, H, Sq, Sk, D, Dv), in the simulator's 16-row, 16-key tiles: partial tiles on both
# axes, several key tiles, an exact fit, head sizes 16/24/32/64/80 (16-byte rows: the
# cp.async path, pad columns zeroed once) and odd ones (element copies).
SHAPES = [(1, 2, 5, 7, 16, 16), (2, 1, 20, 37, 64, 64), (1, 1, 16, 32, 32, 32), (1, 1, 17, 33, 80, 40),
          (1, 1, 7, 9, 24, 8), (1, 1, 9, 3, 5, 3), (1, 1, 3, 12, 6, 9)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64(shape, rng):
    b, h, sq, sk, d, dv = shape
    feeds = {"q": randn(rng, b, h, sq, d), "k": randn(rng, b, h, sk, d), "v": randn(rng, b, h, sk, dv)}
    assert_close(f16_outputs(feeds), reference(feeds["q"], feeds["k"], feeds["v"]))


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 21), (5, 21), (2, 2, 5, 21)], ids=lambda s: "x".join(map(str, s)))
def test_masks_and_scale(mask_shape, rng):
    """Additive masks broadcast every way, with -inf and float16's lowest as HF pads, a scale."""
    feeds = {"q": randn(rng, 2, 2, 5, 16), "k": randn(rng, 2, 2, 21, 16), "v": randn(rng, 2, 2, 21, 16)}
    mask = randn(rng, *mask_shape)
    mask[..., 3] = -np.inf
    mask[..., 17:] = np.finfo(np.float16).min  # a whole key tile masked but for one key
    mask[..., 19] = 0
    feeds["mask"] = mask
    want = reference(feeds["q"], feeds["k"], feeds["v"], mask, scale=0.3)
    assert_close(f16_outputs(feeds, {"scale": 0.3}), want)


@pytest.mark.filterwarnings("ignore:divide by zero")  # the simulator divides 1 by a row's zero sum (guarded)
@pytest.mark.parametrize("causal, sq, sk, masked", [(1, 9, 37, False), (1, 21, 9, True), (2, 9, 37, True),
                                                    (2, 21, 9, False)], ids=lambda x: str(x))
def test_causal(causal, sq, sk, masked, rng):
    """Either alignment over ragged tiles, with and without a mask: key tiles past a block's
    diagonal skipped; lower-right rows that see no key (Sq > Sk) give zeros (guarded)."""
    feeds = {"q": randn(rng, 2, 2, sq, 16), "k": randn(rng, 2, 2, sk, 16), "v": randn(rng, 2, 2, sk, 16)}
    if masked:
        feeds["mask"] = randn(rng, 2, 1, 1, sk)
    want = reference(feeds["q"], feeds["k"], feeds["v"], feeds.get("mask"), causal=causal, guard=True)
    assert_close(f16_outputs(feeds, {"causal": causal, "guard_nan": 1}), want)


def test_causal_fill_before_the_mask(rng):
    """``causal_fill`` (the exports' finfo.min) replaces the scores before the mask is added."""
    low = float(np.finfo(np.float16).min)
    feeds = {"q": randn(rng, 1, 1, 18, 16), "k": randn(rng, 1, 1, 18, 16), "v": randn(rng, 1, 1, 18, 16)}
    feeds["mask"] = np.where(np.arange(18) < 2, np.float16(low), np.float16(0)).reshape(1, 1, 1, 18)
    want = reference(feeds["q"], feeds["k"], feeds["v"], feeds["mask"], causal=1, fill=low)
    assert_close(f16_outputs(feeds, {"causal": 1, "causal_fill": low}), want)


def test_grouped_kv_heads(rng):
    """K with 2 heads and V with 1 for Q's 4 (query head h reads K head h // 2), causal."""
    feeds = {"q": randn(rng, 2, 4, 6, 16), "k": randn(rng, 2, 2, 19, 16), "v": randn(rng, 2, 1, 19, 32)}
    want = reference(feeds["q"], feeds["k"], feeds["v"], causal=2)
    assert_close(f16_outputs(feeds, {"causal": 2}), want)


def _laid(x, layout):
    swapped = np.ascontiguousarray(np.swapaxes(x, 1, 2))
    return x if layout == "bhsd" else swapped if layout == "bshd" else swapped.reshape(x.shape[0], x.shape[2], -1)


@pytest.mark.parametrize("layout", ["bsh,bsh,bsh,bsh", "bshd,bhsd,bsh,bshd"])
def test_head_layouts(layout, rng):
    """Each tensor in its layout (head splits of a projection), grouped K/V heads, a mask."""
    b, h, kv, sq, sk, d = 2, 4, 2, 5, 18, 16
    plain = {"q": randn(rng, b, h, sq, d), "k": randn(rng, b, kv, sk, d), "v": randn(rng, b, kv, sk, d)}
    mask = randn(rng, b, 1, sq, sk)
    q_l, k_l, v_l, o_l = layout.split(",")
    feeds = {"q": _laid(plain["q"], q_l), "k": _laid(plain["k"], k_l), "v": _laid(plain["v"], v_l), "mask": mask}
    attrs = {"layout": layout, "num_heads": h, "kv_num_heads": kv, "causal": 1}
    want = _laid(reference(plain["q"], plain["k"], plain["v"], mask, causal=1), o_l)
    assert_close(f16_outputs(feeds, attrs), want)


@pytest.mark.parametrize("nq_heads, kv_heads, d", [(2, 2, 16), (3, 1, 12)], ids=["aligned", "offsets_not_of_8"])
def test_packed_projection(nq_heads, kv_heads, d, rng):
    """Q, K and V as column slices of one [B, S, nq + nk + nv] projection (``packed``)."""
    b, s, nq, nk = 2, 7, nq_heads * d, kv_heads * d
    x = randn(rng, b, s, nq + 2 * nk)
    attrs = {"layout": "bsh,bsh,bsh,bsh", "num_heads": nq_heads, "kv_num_heads": kv_heads, "packed": [nq, nk, nk]}

    def heads_of(columns, count):
        return columns.reshape(b, s, count, d).swapaxes(1, 2)

    want = reference(heads_of(x[..., :nq], nq_heads), heads_of(x[..., nq:nq + nk], kv_heads),
                     heads_of(x[..., nq + nk:], kv_heads))
    assert_close(f16_outputs({"q": x, "k": x, "v": x}, attrs), want.swapaxes(1, 2).reshape(b, s, nq))


def test_unaligned_arrays_take_the_element_copies(rng):
    """Rows that could be copied 16 bytes at a time, in arrays that do not start on 16
    bytes: the launch takes the element-copy kernel, with the same results."""
    from numba import cuda

    shapes = AttentionShapes.plain(1, 1, 5, 9, 16, 16)
    config = tensor_cores_f16.SIM_CONFIGS[0]
    tactic = tensor_cores_f16.f16_tactic(config, shapes, np.float16, 0.25)
    q, k, v = randn(rng, 1, 1, 5, 16), randn(rng, 1, 1, 9, 16), randn(rng, 1, 1, 9, 16)
    want = reference(q, k, v, scale=0.25)[0, 0]
    for offset in (0, 1):
        ins = [cuda.to_device(np.concatenate([np.zeros(offset, np.float16), x.ravel()]))[offset:] for x in (q, k, v)]
        out = cuda.to_device(np.zeros(offset + 5 * 16, np.float16))[offset:]
        (launch,) = tactic.launches(ins, [out], None)
        assert ("_vector" in launch.kernel.py_func.__name__) == (offset == 0)
        launch.kernel[launch.grid, launch.block, 0, launch.shared_bytes](*launch.args)
        np.testing.assert_allclose(out.copy_to_host().reshape(5, 16), want, rtol=RTOL, atol=ATOL)


def test_gpu_tiles_on_a_ragged_problem(monkeypatch, rng):
    """The GPU's tile configurations (4 and 8 warps, 32- and 64-key tiles), emulated: one
    ragged problem, causal, with a mask."""
    monkeypatch.setattr(tactics, "f16_candidates", lambda gpu=None: tensor_cores_f16.GPU_CONFIGS)
    feeds = {"q": randn(rng, 1, 1, 3, 16), "k": randn(rng, 1, 1, 40, 16), "v": randn(rng, 1, 1, 40, 16),
             "mask": randn(rng, 3, 40)}
    outputs = f16_outputs(feeds, {"causal": 2, "scale": 0.7})
    assert sorted(outputs) == sorted(c.name for c in tensor_cores_f16.GPU_CONFIGS)
    assert_close(outputs, reference(feeds["q"], feeds["k"], feeds["v"], feeds["mask"], scale=0.7, causal=2))


def test_f16_tactics_are_timed_first_for_float16_on_a_gpu():
    """The default level's three: the plain SIMT kernel (the tuner's reference: no inline
    PTX), the first FP16 kernel, the first TF32 one; the other FP16 tiles next."""
    shapes = AttentionShapes.of((32, 12, 128, 64), (32, 12, 128, 64), (32, 12, 128, 64))
    configs = tactics.for_dtype(tactics.candidates(gpu=True), np.float16, gpu=True)
    found = tactics.attention_tactics(shapes, np.float16, 0.125, configs)
    first, second, third, fourth = found[:4]
    assert first.name == tactics.candidates(gpu=True)[0].name and first.math == ""
    assert [second.name, fourth.name] == [c.name for c in tensor_cores_f16.GPU_CONFIGS[:2]]
    assert third.name == tensor_cores.GPU_CONFIGS[0].name and third.math == "tf32"
    assert second.math == fourth.math == ""  # FP16 math on FP16 data: allowed without TF32
    assert {t.name for t in found} >= {c.name for c in tensor_cores_f16.GPU_CONFIGS}
    fp32 = tactics.attention_tactics(shapes, np.float32, 0.125, tactics.for_dtype(tactics.candidates(gpu=True),
                                                                                    np.float32, gpu=True))
    assert not any(t.name.startswith("f16_") for t in fp32)  # float32 keeps the TF32 and SIMT kernels
    for config in tensor_cores_f16.GPU_CONFIGS:
        assert tensor_cores_f16.F16Layout.of(config, 128, 128, False).nbytes <= MAX_SHARED_BYTES


def test_kernels_compile_for_sm90():
    """The GPU form (PTX warp steps) types for sm_90 without float64: the 16-byte-copy and
    element-copy kernels, masks (row-shared too), bounds, the NaN guard, causal alignments
    and fills, key skipping, Q fragments in registers and (head size 256) from shared memory."""
    helper_dir = Path(__file__).resolve().parents[3] / "tests"
    if not (helper_dir / "cuda_typing.py").exists():
        pytest.skip("tests/cuda_typing.py of the plugrt repository is not available")
    sys.path.insert(0, str(helper_dir))
    try:
        from cuda_typing import compile_kernels
    finally:
        sys.path.remove(str(helper_dir))
    failures = compile_kernels("""
        from plugrt_contrib_attention import tensor_cores_f16 as f16

        low = float(np.finfo(np.float16).min)
        configs = f16.GPU_CONFIGS
        cases = [(configs[0], 64, 64, True, False, True, False, 1, -np.inf, True, False),
                 (configs[0], 64, 64, True, True, True, False, 0, -np.inf, True, True),
                 (configs[1], 40, 24, False, True, False, True, 2, low, False, False),
                 (configs[2], 80, 80, True, False, True, True, 0, -np.inf, True, True),
                 (configs[0], 256, 256, False, True, True, False, 0, -np.inf, True, False)]
        for config, d, dv, mask, even, vector, guard, causal, fill, skip, rows in cases:
            kernel = f16.f16_kernel(config, d, dv, mask, even, even, vector, False, guard_nan=guard, causal=causal,
                                    causal_fill=fill, skip_keys=skip, mask_rows=rows)
            args = (arr("float16"),) * 5 + (I64,) * 22 + (types.float32,)
            label = kernel.__name__
            try:
                ir = compile_cuda(kernel.py_func, types.void, args, cc=(9, 0)).library.get_llvm_str()
            except Exception as error:
                RESULTS.append(label + ": " + type(error).__name__ + ": " + str(error)[:1500])
                continue
            if " double " in ir:
                RESULTS.append(label + ": float64 arithmetic")
            for needle in ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4.shared",
                           "ldmatrix.sync.aligned.m8n8.x4.trans.shared", "cvt.rn.f16x2.f32", "shfl.sync"):
                if needle not in ir:
                    RESULTS.append(label + ": no " + needle)
            if vector and "cp.async.cg.shared.global" not in ir:
                RESULTS.append(label + ": no cp.async")
    """, timeout=900)
    assert not failures, "\n".join(failures)
