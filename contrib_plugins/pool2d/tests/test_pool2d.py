"""plugrt-contrib-pool2d: a distribution that only contributes tactics to the built-in
MaxPool. Found by entry point, checked by the conformance kit against the owner's
reference, timed beside the owner's tactics, recorded in plans; and its kernel compiles
for sm_90 (the simulator never types kernels)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from plugrt.registry import Registry
from plugrt.testing import check_node, check_plugin, node_tactics, single_node_model

DIST = "plugrt-contrib-pool2d"
PLUGIN = "contrib-pool2d"


@pytest.fixture(scope="module")
def registry():
    return Registry.load()


@pytest.fixture
def rng(request):
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def test_found_by_entry_point_and_provides_tactics_only(registry):
    record = registry.plugins[PLUGIN]
    assert record.distribution == DIST and record.ops == []
    (provider,) = record.providers
    assert (provider.domain, provider.op_type) == ("", "MaxPool")
    assert record.as_json()["tactics"][0]["tactic_names"] == ["window2d_t256", "window2d_t128"]


def test_conformance_kit_checks_it_against_the_owner(registry):
    report = check_plugin(DIST, registry=registry)
    checked = {(r.op, r.check) for r in report.results}
    assert ("MaxPool", "tactics") in checked and ("MaxPool", "plan") in checked
    assert all(r.plugin == PLUGIN for r in report.results)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},          # ResNet's stem
    {"kernel_shape": [2, 3], "strides": [1, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER", "strides": [2, 1]},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "pads": [0, 1, 1, 0]},
])
def test_every_tactic_matches_the_owners_reference(registry, rng, attrs):
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    check_node("MaxPool", {"x": x}, attrs, opset=12, registry=registry)


def test_offered_only_where_it_applies(registry):
    from plugrt.onnx.importer import import_model

    def providers_of(shape, dtype, outputs=1):
        model = single_node_model("MaxPool", {"x": np.zeros(shape, dtype)}, {"kernel_shape": [2] * (len(shape) - 2)},
                                  n_outputs=outputs, opset=12)
        graph = import_model(model, registry=registry)
        return {t.provider for t in node_tactics(graph, registry)}

    assert providers_of((1, 2, 4, 4), np.float32) == {None, PLUGIN}
    assert providers_of((1, 2, 4), np.float32) == {None}           # 1-D pooling
    assert providers_of((1, 2, 4, 4), np.float16) == {None}        # float16
    assert providers_of((1, 2, 4, 4), np.float32, outputs=2) == {None}  # with Indices


def test_nan_propagates_like_the_reference(registry, rng):
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    x[0, 0, 1, 2] = np.nan
    check_node("MaxPool", {"x": x}, {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=12, registry=registry)


def test_kernel_compiles_for_sm90():
    helper_dir = Path(__file__).resolve().parents[3] / "tests"
    if not (helper_dir / "cuda_typing.py").exists():
        pytest.skip("tests/cuda_typing.py of the plugrt repository is not available")
    sys.path.insert(0, str(helper_dir))
    try:
        from cuda_typing import compile_kernels
    finally:
        sys.path.remove(str(helper_dir))
    failures = compile_kernels("""
        from plugrt_contrib_pool2d.max_pool import max_pool_kernel
        F = arr(np.float32)
        check("max_pool_2d", max_pool_kernel(3, 3, 2, 2, 1, 1, 1, 1), [F, F, I64, I64, I64, I64, I64], f64_free=True)
    """)
    assert not failures, "\n".join(failures)


def _plan_using_the_contribution(registry, tmp_path):
    """A MaxPool plan whose tactic the tuner took from this distribution (its measure says so)."""
    from plugrt.engine import Builder, BuilderConfig

    x = np.random.default_rng(7).standard_normal((1, 2, 6, 6)).astype(np.float32)
    model = single_node_model("MaxPool", {"x": x}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                              opset=12)
    ours_faster = lambda run: 1.0 if run.tactic.provider == PLUGIN else 2.0  # noqa: E731
    engine = Builder(registry, measure=ours_faster).build_engine(model, BuilderConfig(progress=False))
    path = tmp_path / "maxpool.plan"
    engine.save(str(path))
    return path, x


def test_a_plan_records_it_and_is_refused_where_it_is_missing(registry, tmp_path):
    from plugrt import PlanError
    from plugrt.engine import Engine

    path, x = _plan_using_the_contribution(registry, tmp_path)
    loaded = Engine.load(str(path), registry)
    (layer,) = loaded.inspect()["layers"]
    assert layer["tactic"].startswith("window2d_") and layer["tactic_provider"]["distribution"] == DIST
    got = loaded.create_execution_context().execute({"x": x})["out0"]
    want = np.max(np.lib.stride_tricks.sliding_window_view(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)],
                                                                  constant_values=-np.inf), (3, 3), axis=(2, 3))
                  [:, :, ::2, ::2], axis=(-2, -1))
    np.testing.assert_array_equal(got, want)
    without = Registry.load(allow=[name for name in registry.plugins if name.startswith("builtin-")])
    with pytest.raises(PlanError, match=f"contributed by plugin '{PLUGIN}'.*pip install {DIST}=="):
        Engine.load(str(path), without)


def test_a_planted_wrong_variant_fails_the_kit():
    from plugrt import hookimpl
    from plugrt.testing import ConformanceError
    from plugrt_contrib_pool2d import max_pool

    class OffByOne(max_pool.MaxPool2d):
        """Forgets the begin pads: every window starts one row and column late."""

        def tactics(self, node, inputs, outputs):
            x, y = inputs[0], outputs[0]
            if x.rank != 4 or x.dtype != np.float32 or len(outputs) != 1:
                return []
            window = {**max_pool.geometry(node.attrs, x.shape, y.shape), "pads": [0, 0]}
            return [max_pool.window_tactic(window, x.shape, y.shape, t) for t in max_pool.BLOCKS]

    class Planted:
        @hookimpl
        def plugrt_tactics(self):
            return [OffByOne()]

    registry = Registry.load(allow=[n for n in Registry.load().plugins if n.startswith("builtin-")])
    registry.register(Planted(), name="planted-pool2d", distribution="plugrt-planted-pool2d", version="0.1")
    with pytest.raises(ConformanceError, match="window2d_t256.*differs from the reference"):
        check_plugin("planted-pool2d", registry=registry, checks=["tactics"])
