"""plugrt.signal::STFTMagnitude: tactics against the NumPy reference, inference, errors,
workspace, engines, and an sm_90 compile of the kernels (the simulator never types them)."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import plugrt
import plugrt.testing
from plugrt import ModelError, PlugrtError, ShapeError, UnsupportedError
from plugrt.testing import check_node, node_tactics, single_node_model
from plugrt_contrib_signal import DOMAIN, PLUGRT_API, STFTMagnitude
from plugrt_contrib_signal.stft_kernels import twiddle_tables

OP = "STFTMagnitude"
TOL = {"rtol": 1e-4, "atol": 1e-4}
NODE = "test_stftmagnitude"  # the node name plugrt.testing.single_node_model gives


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id (reproducible, different per test)."""
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def signal(rng, batch, n):
    return rng.standard_normal((batch, n)).astype(np.float32)


def import_node(feeds, attrs):
    from plugrt.onnx.importer import import_model
    from plugrt.registry import default_registry

    model = single_node_model(OP, feeds, attrs, domain=DOMAIN, opset=1)
    return import_model(model, registry=default_registry())


def stft_numpy(x, length, hop, n_fft, window, center=False):
    """An independent STFT magnitude: explicit frames, explicit periodic windows, np.fft."""
    phase = 2 * np.pi * np.arange(length) / length
    w = {"hann": 0.5 - 0.5 * np.cos(phase), "hamming": 0.54 - 0.46 * np.cos(phase), "rect": np.ones(length)}[window]
    x = x.astype(np.float64)
    if center:
        x = np.pad(x, ((0, 0), (length // 2, length // 2)), mode="reflect")
    starts = range(0, x.shape[1] - length + 1, hop)
    frames = np.stack([x[:, s:s + length] * w for s in starts], axis=1)
    return np.abs(np.fft.rfft(frames, n=n_fft, axis=-1))


# --------------------------------------------------------------------------- registration


def test_registered_through_its_entry_point():
    from plugrt.registry import default_registry

    registry = default_registry()
    op = registry.find_op(DOMAIN, OP, 1)
    assert isinstance(op, STFTMagnitude)
    owner = registry.owner(op)
    assert owner.distribution == "plugrt-contrib-signal"
    assert owner.version == metadata.version("plugrt-contrib-signal")
    assert PLUGRT_API[0] <= plugrt.API_VERSION <= PLUGRT_API[1]


def test_package_uses_only_the_public_plugin_api():
    """No built-in op module, no core internals: only what a third party may import."""
    allowed = ("plugrt", "plugrt.plugin", "plugrt.kernels", "plugrt.tactic", "plugrt.testing")
    package = Path(__file__).resolve().parents[1] / "plugrt_contrib_signal"
    for path in package.glob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from") and words[1].startswith("plugrt"):
                module = words[1]
                assert module.startswith("plugrt_contrib_signal") or module in allowed, f"{path.name}: {line}"


# --------------------------------------------------------------------------- tactics


CASES = [
    ((2, 32), {"frame_length": 8, "hop_length": 4}),
    ((1, 24), {"frame_length": 8, "hop_length": 3, "n_fft": 12, "window": "hamming"}),
    ((2, 20), {"frame_length": 6, "hop_length": 5, "window": "rect", "center": 1}),
    ((3, 17), {"frame_length": 5, "n_fft": 7, "window": "hann", "center": 1}),
    ((1, 40), {"frame_length": 16}),  # default hop 4, n_fft 16
]


@pytest.mark.parametrize("shape,attrs", CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else
                         "-".join(f"{k}{v[k]}" for k in v))
def test_every_tactic_matches_the_reference(rng, shape, attrs):
    x = signal(rng, *shape)
    (ref,) = check_node(OP, {"x": x}, attrs, domain=DOMAIN, opset=1, **TOL)
    length = attrs["frame_length"]
    want = stft_numpy(x, length, attrs.get("hop_length", length // 4), attrs.get("n_fft", length),
                      attrs.get("window", "hann"), bool(attrs.get("center", 0)))
    np.testing.assert_allclose(ref, want, rtol=1e-6, atol=1e-6)


def test_pure_tone_peaks_at_its_bin():
    n_fft, bin_ = 16, 3
    x = np.cos(2 * np.pi * bin_ * np.arange(64) / n_fft).astype(np.float32)[None, :]
    (ref,) = check_node(OP, {"x": x}, {"frame_length": 16, "hop_length": 16, "window": "rect"}, domain=DOMAIN,
                        opset=1, **TOL)
    assert ref.shape == (1, 4, 9)
    np.testing.assert_allclose(ref[0, :, bin_], n_fft / 2, rtol=1e-6)
    assert np.all(np.delete(ref[0], bin_, axis=1) < 1e-4)


def test_tactics_and_their_workspace():
    graph = import_node({"x": np.zeros((2, 32), np.float32)}, {"frame_length": 8, "hop_length": 4})
    from plugrt.registry import default_registry

    tactics = node_tactics(graph, default_registry())
    assert [t.name for t in tactics] == ["shared", "direct"]
    for tactic in tactics:
        assert tactic.workspace_bytes == 4 * 2 * 7 * 8  # float32 [batch * frames, frame_length]
        json.dumps(tactic.identity())


def test_writes_nothing_past_its_workspace(rng):
    """Launch each tactic on a workspace with a guard band of sentinel bytes after it."""
    from numba import cuda

    from plugrt.registry import default_registry

    x = signal(rng, 2, 20)
    attrs = {"frame_length": 6, "hop_length": 5, "center": 1}
    graph = import_node({"x": x}, attrs)
    want = stft_numpy(x, 6, 5, 6, "hann", center=True)
    guard = 256
    for tactic in node_tactics(graph, default_registry()):
        host = np.full(tactic.workspace_bytes + guard, 0xA5, np.uint8)
        workspace = cuda.to_device(host)
        out = cuda.to_device(np.full(want.shape, np.nan, np.float32))
        for launch in tactic.launches([cuda.to_device(x)], [out], workspace):
            launch.kernel[launch.grid, launch.block, 0, launch.shared_bytes](*launch.args)
        np.testing.assert_allclose(out.copy_to_host(), want, err_msg=tactic.name, **TOL)
        after = workspace.copy_to_host()
        assert np.all(after[tactic.workspace_bytes:] == 0xA5), f"{tactic.name} wrote past its workspace"


def test_twiddle_tables_are_exact_to_float32():
    cos_t, sin_t = twiddle_tables(12)
    angle = 2 * np.pi * np.arange(12) / 12
    np.testing.assert_allclose(cos_t, np.cos(angle), atol=1e-7)
    np.testing.assert_allclose(sin_t, np.sin(angle), atol=1e-7)


# --------------------------------------------------------------------------- examples and the kit


def test_examples_pass_check_node(rng):
    for example in STFTMagnitude().examples():
        (info,) = example.inputs
        x = rng.standard_normal(info.shape).astype(info.dtype)
        check_node(OP, {"x": x}, example.attrs, domain=DOMAIN, opset=example.opset or 1,
                   rtol=example.rtol, atol=example.atol)


@pytest.mark.skipif(not hasattr(plugrt.testing, "check_plugin"),
                    reason="plugrt.testing.check_plugin (the conformance kit) is not in this plugrt yet")
def test_conformance_kit():
    report = plugrt.testing.check_plugin("plugrt-contrib-signal")
    assert report.ok


# --------------------------------------------------------------------------- inference


def symbolic_model(attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "N"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(OP, ["x"], ["y"], name="stft", domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], "stft", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=10)


def test_infer_keeps_symbolic_dims():
    from plugrt.onnx.importer import import_model

    graph = import_model(symbolic_model({"frame_length": 8, "n_fft": 10}))
    shape = graph.info("y").shape
    assert shape[0] == "B" and shape[2] == 6
    assert isinstance(shape[1], str) and "N" in shape[1]
    centered = import_model(symbolic_model({"frame_length": 8, "center": 1})).info("y").shape
    assert centered[1] != shape[1]  # different frame counts never share a symbol


def test_infer_static_frame_count():
    graph = import_node({"x": np.zeros((3, 50), np.float32)}, {"frame_length": 10, "hop_length": 7, "center": 1})
    assert graph.info("out0").shape == (3, 1 + (50 + 10 - 10) // 7, 6)


def test_serialize_is_json_with_resolved_defaults():
    graph = import_node({"x": np.zeros((1, 32), np.float32)}, {"frame_length": 8, "center": 1})
    data = STFTMagnitude().serialize(graph.nodes[0])
    assert json.loads(json.dumps(data)) == data
    assert data["hop_length"] == 2 and data["n_fft"] == 8 and data["padding"] == {"mode": "reflect", "samples": 4}


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("attrs,shape,dtype,error,words", [
    ({"frame_length": 8, "window": "blackman"}, (1, 32), np.float32, UnsupportedError, "window 'blackman'"),
    ({"frame_length": 0}, (1, 32), np.float32, ModelError, "frame_length=0"),
    ({"frame_length": 8, "hop_length": -1}, (1, 32), np.float32, ModelError, "hop_length=-1"),
    ({"frame_length": 8, "n_fft": 4}, (1, 32), np.float32, ModelError, "n_fft >= frame_length"),
    ({"frame_length": 8, "center": 2}, (1, 32), np.float32, ModelError, "center=2"),
    ({"frame_length": 64}, (1, 32), np.float32, ShapeError, "fewer than one frame"),
    ({"frame_length": 16, "center": 1}, (1, 8), np.float32, ShapeError, "center=0 or a longer signal"),
    ({"frame_length": 8}, (2, 1, 32), np.float32, UnsupportedError, "rank 3"),
    ({"frame_length": 8}, (1, 32), np.float64, UnsupportedError, "float64"),
], ids=["window", "frame_length", "hop", "n_fft", "center", "short", "short_centered", "rank", "dtype"])
def test_bad_nodes_are_refused_naming_the_node(attrs, shape, dtype, error, words):
    with pytest.raises(error) as caught:
        import_node({"x": np.zeros(shape, dtype)}, attrs)
    assert NODE in str(caught.value) and words in str(caught.value)
    assert isinstance(caught.value, PlugrtError)


def test_missing_frame_length_is_refused():
    with pytest.raises(ModelError, match="frame_length"):
        import_node({"x": np.zeros((1, 32), np.float32)}, {})


# --------------------------------------------------------------------------- engines


def test_engine_with_a_dynamic_signal_length(rng, tmp_path):
    """The workspace is sized at the profile's max shape; smaller signals reuse it."""
    from plugrt.engine import Builder, BuilderConfig, Engine, OptimizationProfile

    attrs = {"frame_length": 8, "hop_length": 4, "window": "hamming", "center": 1}
    config = BuilderConfig()
    profile = OptimizationProfile()
    profile.set_shape("x", (1, 8), (2, 16), (2, 24))
    config.add_optimization_profile(profile)
    engine = Builder().build_engine(symbolic_model(attrs), config)
    assert engine.workspace_bytes == 4 * 2 * (1 + 24 // 4) * 8
    path = tmp_path / "stft.plan"
    engine.save(str(path))
    context = Engine.load(str(path)).create_execution_context()
    for shape in ((2, 24), (1, 9)):
        x = signal(rng, *shape)
        got = context.execute({"x": x})["y"]
        np.testing.assert_allclose(got, stft_numpy(x, 8, 4, 8, "hamming", center=True), **TOL)


# --------------------------------------------------------------------------- sm_90


def test_kernels_compile_for_sm90():
    """The simulator does not type kernels; compile them for sm_90 (no GPU needed) with the
    repository's typing helper, checking that no float64 arithmetic slipped in."""
    helper_dir = Path(__file__).resolve().parents[3] / "tests"
    if not (helper_dir / "cuda_typing.py").exists():
        pytest.skip("tests/cuda_typing.py of the plugrt repository is not available")
    sys.path.insert(0, str(helper_dir))
    try:
        from cuda_typing import compile_kernels
    finally:
        sys.path.remove(str(helper_dir))
    failures = compile_kernels("""
        from plugrt_contrib_signal import stft_kernels as sk
        F = arr(np.float32)
        check("frame_kernel", sk.frame_kernel, [F, F, I64, I64, I64, I64, I64, I64, F], f64_free=True)
        for name in ("dft_direct_kernel", "dft_shared_kernel"):
            check(name, getattr(sk, name), [F, F, I64, I64, I64, I64, F, F], f64_free=True)
    """)
    assert not failures, "\n".join(failures)
