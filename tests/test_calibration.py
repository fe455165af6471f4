"""Calibration statistics, algorithms, cache and data (plugrt.quantization), against
independent oracles: NumPy's own reductions and percentiles, a straightforward float64
re-implementation of TensorRT's entropy search (pytorch-quantization's way: digitize,
scipy's entropy), and TensorRT's worked cache example."""

from __future__ import annotations

import io
import logging
import struct

import numpy as np
import pytest

from plugrt.errors import PlugrtError
from plugrt.quantization.cache import (CalibrationCache, decode_scale, encode_scale, model_digest, read_cache,
                                       write_cache)
from plugrt.quantization.calibrators import (ALGORITHMS, CACHE_NAMES, MIN_SCALE, RangeCollector, scale_of,
                                             weight_scale, weight_scales)
from plugrt.quantization.data import calibrate_progress, dataset_hash, load_calibration_data


@pytest.fixture
def rng():
    return np.random.default_rng()


def collect(batches, name="t", **options) -> RangeCollector:
    collector = RangeCollector(**options)
    for batch in batches:
        collector.update(name, batch)
    return collector


# ------------------------------------------------------------------------- statistics


def test_minmax_is_max_abs_over_batches_of_any_shape_and_float_dtype(rng):
    batches = [rng.standard_normal((4, 3, 5)).astype(np.float32), rng.standard_normal(17) * 3,
               (rng.standard_normal((2, 9)) - 2).astype(np.float16)]
    collector = collect(batches)
    every = np.concatenate([b.astype(np.float64).ravel() for b in batches])
    stats = collector.stats("t")
    assert collector.compute_amax("t", "minmax") == np.abs(every).max()
    assert (stats.min, stats.max, stats.count, stats.batches) == (every.min(), every.max(), every.size, 3)
    assert stats.histogram.sum() == every.size


def test_the_histogram_grows_by_bins_of_the_first_width(rng):
    first, later = rng.uniform(-1, 1, 5000), rng.uniform(-3, 3, 5000)
    collector = collect([first, later], num_bins=256)
    stats = collector.stats("t")
    width = np.abs(first).max() / 256
    assert stats.bin_width == width
    assert len(stats.histogram) == int(np.ceil(np.abs(later).max() / width)) > 256
    # each batch is binned against the edges of its time (the first's max sits in its last bin)
    expected, _ = np.histogram(np.abs(later), bins=stats.edges)
    expected[:256] += np.histogram(np.abs(first), bins=stats.edges[:257])[0]
    np.testing.assert_array_equal(stats.histogram, expected)
    assert collector.compute_amax("t", "minmax") == np.abs(later).max()


def test_a_huge_later_range_merges_bins_instead_of_growing_without_bound(rng):
    collector = collect([rng.standard_normal(1000) * 1e-3, rng.standard_normal(1000) * 1e3], num_bins=64,
                        max_bins=1024)
    stats = collector.stats("t")
    assert len(stats.histogram) <= 1024 and stats.histogram.sum() == 2000
    assert stats.edges[-1] >= stats.amax


def test_nan_and_inf_are_left_out_counted_and_warned_of(rng, caplog):
    x = rng.standard_normal(1000)
    dirty = x.copy()
    dirty[[3, 70, 500]] = [np.nan, np.inf, -np.inf]
    with caplog.at_level(logging.WARNING, "plugrt.quantization"):
        collector = collect([dirty])
    assert "'t' holds NaN or Inf (batch 1)" in caplog.text
    clean = np.delete(x, [3, 70, 500])
    stats = collector.stats("t")
    assert stats.nonfinite == 3 and collector.nonfinite() == {"t": 3}
    assert stats.count == clean.size and stats.histogram.sum() == clean.size
    assert collector.compute_amax("t", "minmax") == np.abs(clean).max()


def test_an_all_zero_tensor_has_range_zero_and_is_not_quantizable(rng):
    collector = RangeCollector()
    collector.update("zeros", np.zeros((2, 3), np.float32))
    collector.update("nan", np.full(4, np.nan))
    collector.update("x", rng.standard_normal(100))
    assert collector.zero_range() == ["zeros", "nan"]
    assert not collector.stats("zeros").quantizable and collector.stats("x").quantizable
    for algorithm in ALGORITHMS:
        assert collector.compute_amax("zeros", algorithm) == 0.0
        assert collector.ranges(algorithm)["nan"] == 0.0


def test_zeros_before_the_first_nonzero_batch_land_in_bin_zero(rng):
    collector = collect([np.zeros(50), rng.uniform(0.5, 1, 10)], num_bins=16)
    stats = collector.stats("t")
    assert stats.histogram[0] == 50 and stats.histogram.sum() == 60


def test_only_float_tensors_are_calibrated():
    with pytest.raises(PlugrtError, match="'ids'.*int64"):
        RangeCollector().update("ids", np.arange(4))
    with pytest.raises(PlugrtError, match="'nope'.*update"):
        RangeCollector().stats("nope")
    with pytest.raises(PlugrtError, match="unknown calibration algorithm 'kl'"):
        collect([np.ones(3)]).compute_amax("t", "kl")


# ------------------------------------------------------------------------- algorithms


def test_percentile_is_numpys_percentile_of_abs_within_one_bin(rng):
    x = rng.standard_normal((64, 500)) * 2
    collector = collect([x[:20], x[20:]])
    width = collector.stats("t").bin_width
    for percentile in (99.99, 99.0, 50.0, 100.0):
        expected = np.percentile(np.abs(x), percentile, method="inverted_cdf")  # the least value with >= p% <= it
        amax = collector.compute_amax("t", "percentile", percentile)
        assert expected <= amax <= expected + width
    assert collector.compute_amax("t", "percentile", 100.0) == np.abs(x).max()
    with pytest.raises(PlugrtError, match="outside"):
        collector.compute_amax("t", "percentile", 0.0)


def oracle_entropy_edge(histogram: np.ndarray, start: int = 128, levels: int = 128) -> int:
    """TensorRT's entropy search written out plainly (pytorch-quantization's steps): the
    cut-off bin index whose KL divergence is least, the last of equal minima."""
    scipy_stats = pytest.importorskip("scipy.stats")
    bins = histogram.astype(np.float64).copy()
    bins[0] = bins[1]
    divergences = []
    for i in range(start, len(bins) + 1):
        reference = bins[:i].copy()
        reference[-1] += bins[i:].sum()
        level = np.digitize(np.arange(i), np.linspace(0, i, levels + 1)) - 1
        candidate = np.zeros(i)
        for k in range(levels):
            members = (level == k) & (bins[:i] > 0)
            if members.any():
                candidate[members] = bins[:i][members].sum() / members.sum()
        if candidate.sum() == 0:
            divergences.append(np.inf)  # KL undefined: no candidate (plugrt's documented choice)
            continue
        divergences.append(scipy_stats.entropy(reference, candidate))
    divergences = np.array(divergences)
    return start + len(divergences) - 1 - int(np.argmin(divergences[::-1]))


@pytest.mark.parametrize("data", ["gaussian", "relu", "laplace", "image", "grown"])
def test_entropy_matches_a_plain_reimplementation_on_the_same_histogram(rng, data):
    if data == "gaussian":
        batches = [rng.standard_normal((32, 100)) for _ in range(3)]
    elif data == "relu":
        batches = [np.maximum(rng.standard_normal(4000), 0) for _ in range(2)]
    elif data == "laplace":
        batches = [rng.laplace(size=3000).astype(np.float32) for _ in range(2)]
    elif data == "image":  # few distinct values: a sparse histogram with empty bins
        batches = [rng.integers(0, 256, size=(4, 3, 8, 8)) / 255.0 for _ in range(2)]
    else:
        batches = [rng.standard_normal(3000), rng.standard_normal(3000) * 2]
    collector = collect(batches, num_bins=512)
    stats = collector.stats("t")
    expected = min(oracle_entropy_edge(stats.histogram) * stats.bin_width, stats.amax)
    assert collector.compute_amax("t", "entropy") == expected


@pytest.mark.parametrize("algorithm", ["entropy", "mse"])
def test_a_cut_off_in_a_grown_last_bin_is_capped_at_max_abs(rng, algorithm):
    # The second batch's max lands just past the first's range: the grown last bin's edge
    # (and centre) lie beyond every value seen, and a heavy last bin makes it the cut-off.
    top = 1.0 + rng.uniform(0.1, 0.4) / 2048
    collector = collect([rng.uniform(-1, 1, 100_000), np.full(20_000, top)])
    stats = collector.stats("t")
    assert len(stats.histogram) * stats.bin_width > top
    assert collector.compute_amax("t", algorithm) == stats.amax == top


def test_entropy_of_gaussian_data_clips_the_outliers_minmax_chases(rng):
    sigma = 1.7
    clean, spiked = RangeCollector(), RangeCollector()
    for _ in range(4):
        x = rng.standard_normal(250_000) * sigma
        clean.update("t", x)
        x[rng.integers(0, x.size, 3)] = rng.uniform(-20, 20, 3) * sigma  # a few outliers per batch
        spiked.update("t", x)
    assert 2.5 * sigma < clean.compute_amax("t", "entropy") <= clean.compute_amax("t", "minmax")
    assert 2.5 * sigma < spiked.compute_amax("t", "entropy") < 0.5 * spiked.compute_amax("t", "minmax")


def test_mse_is_the_least_error_candidate(rng):
    collector = collect([rng.standard_normal(20000)], num_bins=512)
    stats = collector.stats("t")
    centres = (np.arange(512) + 0.5) * stats.bin_width
    errors = []
    for amax in centres[128:]:
        quantized = np.clip(np.round(centres / amax * 127), -128, 127) * amax / 127
        errors.append(np.mean((quantized - centres) ** 2 * stats.histogram))
    amax = collector.compute_amax("t", "mse")
    assert amax == pytest.approx(centres[128 + int(np.argmin(errors))], rel=1e-12)
    assert 2.0 < amax < stats.amax


def test_switching_algorithms_reads_the_same_histogram(rng):
    collector = collect([rng.standard_normal(5000)])
    before = collector.stats("t").histogram.copy()
    ranges = {algorithm: collector.compute_amax("t", algorithm) for algorithm in ALGORITHMS}
    np.testing.assert_array_equal(collector.stats("t").histogram, before)  # entropy's zero-bin fix is on a copy
    assert ranges["minmax"] == max(ranges.values())
    assert set(CACHE_NAMES) == set(ALGORITHMS)


# ---------------------------------------------------------------------------- weights


def test_per_channel_weight_scales_against_float64(rng):
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w[5] = 0.0
    scales = weight_scales(w, axis=0)
    expected = np.abs(w.astype(np.float64)).reshape(8, -1).max(axis=1) / 127
    assert scales.dtype == np.float32 and scales.shape == (8,)
    np.testing.assert_allclose(np.delete(scales, 5), np.delete(expected, 5), rtol=1e-7)
    assert scales[5] == np.float32(MIN_SCALE) > 0 and np.isfinite(1 / scales).all()
    transposed = weight_scales(w, axis=1)  # ConvTranspose's output channels
    np.testing.assert_allclose(transposed, np.abs(w.astype(np.float64)).max(axis=(0, 2, 3)) / 127, rtol=1e-7)
    assert weight_scale(w) == pytest.approx(np.abs(w).max() / 127, rel=1e-7)
    assert weight_scale(np.zeros(4, np.float32)) > 0
    assert scale_of(254.0) == 2.0


def test_weight_scale_errors_name_the_weight():
    with pytest.raises(PlugrtError, match="'fc.weight'.*NaN"):
        weight_scales(np.array([[1.0, np.nan]]), 0, name="fc.weight")
    with pytest.raises(PlugrtError, match="no channel axis 2"):
        weight_scales(np.ones((2, 2)), 2)


# ------------------------------------------------------------------------------ cache


def test_tensorrts_worked_example():
    assert encode_scale(0.0179033577 * 127) == "3c92aa10"
    assert decode_scale("3c92aa10") / 127 == pytest.approx(0.0179033577, rel=1e-8)
    assert struct.unpack(">f", bytes.fromhex("3c92aa10"))[0] * 127 == decode_scale("3c92aa10")


def test_cache_round_trip_keeps_the_scale_bits(tmp_path, rng):
    path = str(tmp_path / "calib.cache")
    ranges = {"input": 2.5, "(Unnamed Layer* 4) [Fully Connected]_output": float(rng.uniform(0.1, 50)),
              "a: b (c)": float(rng.uniform(0.1, 50)), "zero": 0.0}
    digest = model_digest(b"model bytes")
    write_cache(path, "entropy", digest, ranges)
    text = open(path).read()
    assert text.splitlines()[0] == f"plugrt-1-EntropyCalibration2 model={digest}"
    cache = read_cache(path, "entropy", digest)
    assert isinstance(cache, CalibrationCache) and not cache.from_tensorrt
    assert list(cache.ranges) == list(ranges)
    for name, amax in ranges.items():
        assert encode_scale(cache.ranges[name]) == encode_scale(amax)
        assert cache.ranges[name] == pytest.approx(amax, rel=1e-7)
    write_cache(path, "entropy", digest, cache.ranges)
    assert open(path).read() == text


def test_percentile_and_data_hash_are_in_the_header(tmp_path):
    path = str(tmp_path / "p.cache")
    write_cache(path, "percentile", "ab" * 8, {"x": 1.0}, percentile=99.9, data_hash="cd" * 8)
    assert open(path).readline() == f"plugrt-1-PercentileCalibration percentile=99.9 model={'ab' * 8} data={'cd' * 8}\n"
    assert read_cache(path, "percentile", "ab" * 8, percentile=99.9, data_hash="cd" * 8).ranges == {
        "x": float(np.float32(1 / 127)) * 127}
    with pytest.raises(PlugrtError, match="percentile 99.9, this build asks for 99.99"):
        read_cache(path, "percentile", "ab" * 8)
    with pytest.raises(PlugrtError, match="other batches"):
        read_cache(path, "percentile", "ab" * 8, percentile=99.9, data_hash="ef" * 8)


def test_cache_for_another_model_or_algorithm_is_refused(tmp_path):
    path = str(tmp_path / "calib.cache")
    write_cache(path, "minmax", "12345678" * 2, {"x": 1.0})
    with pytest.raises(PlugrtError, match=r"calib.cache.*another model.*delete it"):
        read_cache(path, "minmax", "87654321" * 2)
    with pytest.raises(PlugrtError, match=r"calib.cache.*holds MinMaxCalibration.*EntropyCalibration2.*delete it"):
        read_cache(path, "entropy", "12345678" * 2)


@pytest.mark.parametrize("line, problem", [
    ("x 3c92aa10", "line 3: 'x 3c92aa10' has no tensor name"),
    ("x: 3c92aa1", "line 3: '3c92aa1' is not 8 hex digits"),
    ("y: 7fc00000", "line 3: 7fc00000 is the scale nan"),
    ("a: 3c92aa10", "line 3: tensor 'a' again \\(first on line 2\\)"),
])
def test_malformed_cache_lines_are_named(tmp_path, line, problem):
    path = tmp_path / "bad.cache"
    path.write_text(f"plugrt-1-EntropyCalibration2 model={'0' * 16}\na: 3c92aa10\n{line}\n")
    with pytest.raises(PlugrtError, match=problem):
        read_cache(str(path), "entropy", "0" * 16)


@pytest.mark.parametrize("header, problem", [
    ("calibration table", "line 1: .*not a calibration cache header"),
    ("plugrt-2-EntropyCalibration2 model=00000000", "format version 2"),
    ("plugrt-1-EntropyCalibration2", "no model= field"),
    ("plugrt-1-EntropyCalibration2 model=00000000 seed=3", "unknown field 'seed'"),
    ("plugrt-1-PercentileCalibration model=00000000", "percentile= goes with"),
])
def test_malformed_headers_are_refused(tmp_path, header, problem):
    path = tmp_path / "bad.cache"
    path.write_text(header + "\nx: 3c92aa10\n")
    with pytest.raises(PlugrtError, match=problem):
        read_cache(str(path), "entropy", "0" * 8)


def test_tensorrt_caches_are_read_when_allowed(tmp_path):
    path = tmp_path / "trt.cache"
    path.write_text("TRT-8510-EntropyCalibration2\r\ndata: 3c008912\r\n"
                    "(Unnamed Layer* 4) [Fully Connected]_output: 3c92aa10\r\nprob: 3c083ffd\r\n")
    with pytest.raises(PlugrtError, match="TensorRT's.*names no model"):
        read_cache(str(path), "entropy", "0" * 16)
    cache = read_cache(str(path), "entropy", "0" * 16, allow_tensorrt=True)
    assert cache.from_tensorrt and cache.header.version == "8510"
    assert cache.ranges["(Unnamed Layer* 4) [Fully Connected]_output"] / 127 == pytest.approx(0.0179033577)
    assert list(cache.ranges) == ["data", "(Unnamed Layer* 4) [Fully Connected]_output", "prob"]
    with pytest.raises(PlugrtError, match="holds MinMaxCalibration"):
        path.write_text("TRT-8600-MinMaxCalibration\nx: 3c92aa10\n")
        read_cache(str(path), "entropy", "0" * 16, allow_tensorrt=True)


# ------------------------------------------------------------------------------- data


def test_batches_from_a_file_a_folder_and_python(tmp_path, rng):
    batches = [{"x": rng.standard_normal((2, 3)).astype(np.float32), "ids": np.arange(2)} for _ in range(3)]
    for number, batch in enumerate(batches):
        np.savez(tmp_path / f"batch{number:02d}.npz", **batch)
    (tmp_path / "README").write_text("not a batch")
    folder = load_calibration_data(str(tmp_path), ["x", "ids"])
    assert folder.total == 3
    loaded = list(folder)
    for got, want in zip(loaded, batches):
        np.testing.assert_array_equal(got["x"], want["x"])
    assert list(load_calibration_data(tmp_path / "batch01.npz", ["ids", "x"]))[0]["x"].shape == (2, 3)
    assert load_calibration_data(batches, ["x", "ids"]).total == 3
    generated = load_calibration_data((b for b in batches), ["x", "ids"])
    assert generated.total is None
    assert dataset_hash(generated) == dataset_hash(loaded) == dataset_hash(batches)
    changed = [dict(b) for b in batches]
    changed[2] = {"x": batches[2]["x"] + 1, "ids": batches[2]["ids"]}
    assert dataset_hash(changed) != dataset_hash(batches)


def test_a_batch_missing_an_input_is_named_with_its_keys(tmp_path):
    np.savez(tmp_path / "b0.npz", x=np.ones(2), mask=np.ones(2))
    with pytest.raises(PlugrtError, match=r"b0.npz' has no input 'ids' \(it has 'x', 'mask'\)"):
        load_calibration_data(str(tmp_path), ["x", "ids"])
    with pytest.raises(PlugrtError, match=r"b0.npz' has 'mask', which is no input of the model"):
        load_calibration_data(str(tmp_path / "b0.npz"), ["x"])
    with pytest.raises(PlugrtError, match="batch 2 has no input 'x'"):
        list(load_calibration_data([{"x": np.ones(1)}, {"y": np.ones(1)}], ["x"]))


def test_pickled_and_non_numeric_batches_are_refused(tmp_path):
    np.savez(tmp_path / "pickled.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(PlugrtError, match="pickled.npz.*'x' is a pickled object array"):
        list(load_calibration_data(str(tmp_path / "pickled.npz"), ["x"]))
    with pytest.raises(PlugrtError, match="batch 1: input 'x' is a <U1 array"):
        list(load_calibration_data([{"x": np.array(["a"])}], ["x"]))
    with pytest.raises(PlugrtError, match="batch 1 is a list"):
        list(load_calibration_data([[np.ones(1)]], ["x"]))
    with pytest.raises(PlugrtError, match="wrap one batch in a list"):
        load_calibration_data({"x": np.ones(1)}, ["x"])


def test_empty_missing_and_unreadable_sources(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlugrtError, match="folder .*empty' holds no .npz files \\(it has nothing\\)"):
        load_calibration_data(str(tmp_path / "empty"), ["x"])
    with pytest.raises(PlugrtError, match="does not exist"):
        load_calibration_data(str(tmp_path / "nope.npz"), ["x"])
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(PlugrtError, match="junk.npz' is not a readable .npz file"):
        load_calibration_data(str(tmp_path / "junk.npz"), ["x"])


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_follows_the_builders():
    shown = FakeTerminal()
    assert list(calibrate_progress(range(3), total=3, stream=shown)) == [0, 1, 2]
    assert "calibrating batch 3/3" in shown.getvalue() and shown.getvalue().endswith("\r")
    quiet = FakeTerminal()
    assert list(calibrate_progress(range(3), total=3, enabled=False, stream=quiet)) == [0, 1, 2]
    assert quiet.getvalue() == ""
    piped = io.StringIO()
    list(calibrate_progress(iter([1]), stream=piped))
    assert piped.getvalue() == ""  # not a terminal
