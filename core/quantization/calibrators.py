"""Calibration statistics and the algorithms that turn them into INT8 ranges.

:class:`RangeCollector` keeps, per activation tensor, its min, max, element count and one
histogram of |x| (2048 bins by default), the way NVIDIA's pytorch-quantization
``HistogramCalibrator`` collects it: the first batch with a nonzero value fixes the bin
width (its max |x| / bins), and a later batch with a larger max appends bins of that width.
NaN and Inf are left out, counted, and warned of once per tensor. Every algorithm reads that one histogram, so the
algorithm can change without collecting again:

- ``entropy``: TensorRT's EntropyCalibration2 as pytorch-quantization computes it:
  cut-offs 128..bins (stride 1), the zero bin suppressed (``bins[0] = bins[1]``), the
  mass above a cut-off folded into its last bin, 128 quantized levels, KL divergence, the
  last of equal minima; amax is the bin edge at the cut-off;
- ``minmax``: max |x| (exact, not from the histogram);
- ``percentile``: the smallest bin edge with at least ``percentile`` % of |x| at or below
  it, at most max |x| (pytorch-quantization takes that bin's lower edge, one bin lower);
- ``mse``: the bin centre that minimizes the histogram's quantization error.

Ranges are symmetric: amax maps to 127 (``scale = amax / 127``); weights use [-127, 127]
and activations clamp to [-128, 127], as TensorRT does.

Where this departs from pytorch-quantization, on inputs it does not handle: a histogram
that would grow past ``max_bins`` merges neighbouring bins (the width grows by a whole
factor, so edges stay aligned); an entropy cut-off below which the histogram is empty is no
candidate (there KL is undefined); mse tries at most 2048 evenly strided candidates; entropy
and mse ranges are capped at max |x| (a cut-off in the last bin is otherwise its edge, up to a
bin width beyond every value seen).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from plugrt.errors import PlugrtError

log = logging.getLogger("plugrt.quantization")

#: The calibration algorithms, as ``compute_amax`` and the builder name them.
ALGORITHMS = ("entropy", "minmax", "percentile", "mse")
#: Each algorithm's name in a calibration cache's header (TensorRT's spelling where it has one).
CACHE_NAMES = {"entropy": "EntropyCalibration2", "minmax": "MinMaxCalibration",
               "percentile": "PercentileCalibration", "mse": "MseCalibration"}
DEFAULT_BINS = 2048
DEFAULT_PERCENTILE = 99.99
#: Entropy's first cut-off and the number of INT8 levels on one side of zero (1 << 7).
ENTROPY_START_BIN = 128
QUANTIZED_LEVELS = 128
#: Symmetric INT8: weights use [-127, 127], activations clamp to [-128, 127] (TensorRT's).
INT8_MAX = 127
WEIGHT_RANGE = (-127, 127)
ACTIVATION_RANGE = (-128, 127)
#: The least weight scale: an all-zero channel gets this instead of 0 (1/scale stays finite).
MIN_SCALE = 1e-12
#: Candidates the mse search tries at most; more bins than this stride the candidates.
MSE_CANDIDATES = 2048
#: Cut-offs the entropy search evaluates at once (bounds its memory on grown histograms).
_CHUNK = 4096


def scale_of(amax: float) -> float:
    """The INT8 scale of a symmetric range [-amax, amax]: ``amax / 127``."""
    return float(amax) / INT8_MAX


@dataclass
class TensorStats:
    """What calibration saw of one tensor. ``histogram`` counts |x| in bins of
    ``bin_width`` from 0 (``None`` until a batch held a nonzero finite value)."""

    name: str
    min: float = math.inf
    max: float = -math.inf
    count: int = 0
    nonfinite: int = 0
    batches: int = 0
    histogram: np.ndarray | None = None
    bin_width: float = 0.0
    _unbinned_zeros: int = field(default=0, repr=False)

    @property
    def amax(self) -> float:
        """max |x| over every finite value seen (0.0 when none was)."""
        if self.count == 0:
            return 0.0
        return max(abs(self.min), abs(self.max))

    @property
    def quantizable(self) -> bool:
        """False for a tensor whose range is 0 (all zeros, or no finite value): it has no
        INT8 scale and stays in floating point."""
        return self.amax > 0.0

    @property
    def edges(self) -> np.ndarray:
        """The histogram's bin edges, ``len(histogram) + 1`` of them."""
        if self.histogram is None:
            return np.zeros(1)
        return np.arange(len(self.histogram) + 1) * self.bin_width


class RangeCollector:
    """Per-tensor ranges and |x| histograms over calibration batches (see the module doc).

    :param num_bins: the histogram's bins at the first nonzero batch (2048, TensorRT's).
    :param max_bins: the most bins growth may reach before neighbouring bins merge.
    """

    def __init__(self, num_bins: int = DEFAULT_BINS, max_bins: int | None = None):
        if num_bins < 2:
            raise PlugrtError(f"a calibration histogram needs at least 2 bins, not {num_bins}; use the default 2048")
        self.num_bins = int(num_bins)
        self.max_bins = int(max_bins) if max_bins is not None else 64 * self.num_bins
        self._stats: dict[str, TensorStats] = {}

    def update(self, name: str, array) -> None:
        """Add one batch of tensor ``name`` (any float array, any shape)."""
        values = np.asarray(array)
        if values.dtype.kind != "f":
            raise PlugrtError(f"calibration tensor {name!r} has dtype {values.dtype}; only floating-point tensors "
                              "take INT8 ranges, so leave it out of calibration")
        stats = self._stats.setdefault(name, TensorStats(name))
        stats.batches += 1
        values = values.astype(np.float64, copy=False).ravel()
        finite = np.isfinite(values)
        if not finite.all():
            if not stats.nonfinite:
                log.warning("calibration tensor %r holds NaN or Inf (batch %d); those values are left out of its "
                            "range (RangeCollector.nonfinite() counts them)", name, stats.batches)
            stats.nonfinite += int(values.size - np.count_nonzero(finite))
            values = values[finite]
        if values.size == 0:
            return
        stats.count += int(values.size)
        stats.min = min(stats.min, float(values.min()))
        stats.max = max(stats.max, float(values.max()))
        self._add_to_histogram(stats, np.abs(values))

    def _add_to_histogram(self, stats: TensorStats, magnitudes: np.ndarray) -> None:
        top = float(magnitudes.max())
        if top == 0.0 and stats.histogram is None:
            stats._unbinned_zeros += int(magnitudes.size)  # no width yet: binned when one comes
            return
        if stats.histogram is None:
            stats.bin_width = top / self.num_bins
            stats.histogram = np.zeros(self.num_bins, dtype=np.int64)
            stats.histogram[0] = stats._unbinned_zeros
            stats._unbinned_zeros = 0
        if top > len(stats.histogram) * stats.bin_width:
            self._grow(stats, math.ceil(top / stats.bin_width))
        index = np.minimum((magnitudes / stats.bin_width).astype(np.int64), len(stats.histogram) - 1)
        stats.histogram += np.bincount(index, minlength=len(stats.histogram))

    def _grow(self, stats: TensorStats, bins: int) -> None:
        """Append bins of the same width up to ``bins``; past ``max_bins`` merge neighbours."""
        factor = 1
        while bins > self.max_bins * factor:
            factor *= 2
        histogram = stats.histogram
        if factor > 1:
            histogram = np.concatenate([histogram, np.zeros(-len(histogram) % factor, dtype=np.int64)])
            histogram = histogram.reshape(-1, factor).sum(axis=1)
            stats.bin_width *= factor
        wanted = -(-bins // factor)
        stats.histogram = np.concatenate([histogram, np.zeros(wanted - len(histogram), dtype=np.int64)])

    # ------------------------------------------------------------------ reading

    def names(self) -> list[str]:
        """The tensors seen, in the order they were first updated."""
        return list(self._stats)

    def __contains__(self, name: str) -> bool:
        return name in self._stats

    def stats(self, name: str) -> TensorStats:
        """What was collected for ``name``."""
        if name not in self._stats:
            raise PlugrtError(f"calibration collected nothing for tensor {name!r}; feed it with update() "
                              "for every calibration batch")
        return self._stats[name]

    def zero_range(self) -> list[str]:
        """Tensors whose range is 0 (all zeros or no finite value): not quantizable."""
        return [name for name, stats in self._stats.items() if not stats.quantizable]

    def nonfinite(self) -> dict[str, int]:
        """Tensors that held NaN or Inf, and how many such values were left out."""
        return {name: stats.nonfinite for name, stats in self._stats.items() if stats.nonfinite}

    def compute_amax(self, name: str, algorithm: str, percentile: float = DEFAULT_PERCENTILE) -> float:
        """The range (amax) of ``name`` by ``algorithm`` (one of :data:`ALGORITHMS`); 0.0
        for a tensor that is not quantizable."""
        return compute_amax(self.stats(name), algorithm, percentile)

    def ranges(self, algorithm: str, percentile: float = DEFAULT_PERCENTILE) -> dict[str, float]:
        """``{tensor: amax}`` for every tensor seen (0.0 where not quantizable)."""
        return {name: compute_amax(stats, algorithm, percentile) for name, stats in self._stats.items()}


def compute_amax(stats: TensorStats, algorithm: str, percentile: float = DEFAULT_PERCENTILE) -> float:
    """The range of one tensor's statistics by ``algorithm``; 0.0 when not quantizable."""
    if algorithm not in ALGORITHMS:
        raise PlugrtError(f"unknown calibration algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    if algorithm == "percentile" and not 0.0 < percentile <= 100.0:
        raise PlugrtError(f"calibration percentile {percentile} is outside (0, 100]; the usual one is 99.99")
    if not stats.quantizable:
        return 0.0
    if algorithm == "minmax":
        return stats.amax
    if algorithm == "percentile":
        return percentile_amax(stats.histogram, stats.bin_width, percentile, stats.amax)
    # A cut-off in the histogram's last bin is that bin's edge (or centre), up to a bin
    # width past the largest |x| seen: no range needs to reach beyond it.
    if algorithm == "mse":
        return min(mse_amax(stats.histogram, stats.bin_width), stats.amax)
    return min(entropy_amax(stats.histogram, stats.bin_width), stats.amax)


# ---------------------------------------------------------------------- algorithms


def percentile_amax(histogram: np.ndarray, bin_width: float, percentile: float, max_abs: float) -> float:
    """The smallest bin edge with at least ``percentile`` % of the counts at or below it,
    capped at ``max_abs``."""
    cumulative = np.cumsum(histogram)
    index = int(np.searchsorted(cumulative, percentile / 100.0 * cumulative[-1], side="left"))
    return min((min(index, len(histogram) - 1) + 1) * bin_width, max_abs)


def mse_amax(histogram: np.ndarray, bin_width: float, start_bin: int = ENTROPY_START_BIN) -> float:
    """The bin centre that, taken as amax, minimizes the squared INT8 quantization error of
    the bin centres weighted by their counts (the first of equal minima)."""
    counts = np.asarray(histogram, dtype=np.float64)
    centres = (np.arange(len(counts)) + 0.5) * bin_width
    first = min(start_bin, len(counts) - 1)
    stride = max(1, math.ceil((len(counts) - first) / MSE_CANDIDATES))
    candidates = np.arange(first, len(counts), stride)
    errors = []
    rows = max(1, (1 << 22) // len(counts))
    for start in range(0, len(candidates), rows):
        amax = centres[candidates[start:start + rows], None]
        scale = INT8_MAX / amax
        quantized = np.clip(np.round(centres[None, :] * scale), ACTIVATION_RANGE[0], ACTIVATION_RANGE[1]) / scale
        errors.append(((quantized - centres[None, :]) ** 2 * counts[None, :]).mean(axis=1))
    return float(centres[candidates[int(np.argmin(np.concatenate(errors)))]])


def entropy_amax(histogram: np.ndarray, bin_width: float, start_bin: int = ENTROPY_START_BIN,
                 levels: int = QUANTIZED_LEVELS) -> float:
    """TensorRT's entropy calibration on a histogram of |x|: the cut-off whose clipped
    distribution loses least information (KL divergence) when quantized to ``levels``
    levels; the last of equal minima; amax is the bin edge at the cut-off.

    The KL of every cut-off comes from prefix sums (O(levels) each); cut-offs within
    rounding of the minimum are then recomputed bin by bin, so ties break as a direct
    computation breaks them."""
    bins = np.asarray(histogram, dtype=np.float64).copy()
    bins[0] = bins[1]  # ReLU's spike at zero would dominate the divergence
    cutoffs = np.arange(min(start_bin, len(bins)), len(bins) + 1)
    divergence = np.concatenate([_kl_by_prefix_sums(bins, cutoffs[k:k + _CHUNK], levels)
                                 for k in range(0, len(cutoffs), _CHUNK)])
    best = float(divergence.min())
    if not math.isfinite(best):
        return float(len(bins) * bin_width)
    near = np.flatnonzero(divergence <= best + 1e-9 * max(1.0, abs(best)))
    exact = np.array([kl_divergence_at(bins, int(cutoffs[k]), levels) for k in near])
    chosen = near[len(exact) - 1 - int(np.argmin(exact[::-1]))]
    return float(cutoffs[chosen] * bin_width)


def kl_divergence_at(bins: np.ndarray, cutoff: int, levels: int = QUANTIZED_LEVELS) -> float:
    """KL(P || Q) for one cut-off, bin by bin: P is ``bins[:cutoff]`` with the rest folded
    into its last bin, Q the same bins quantized to ``levels`` levels (each level's count
    spread evenly over its nonzero bins). ``bins`` already has its zero bin suppressed."""
    kept = bins[:cutoff]
    reference = kept.copy()
    reference[-1] += bins[cutoff:].sum()
    level = (np.arange(cutoff) * levels) // cutoff
    nonzero = kept > 0
    level_sum = np.bincount(level, weights=kept, minlength=levels)
    level_nonzero = np.bincount(level, weights=nonzero, minlength=levels)
    candidate = np.where(nonzero, level_sum[level] / np.maximum(level_nonzero[level], 1), 0.0)
    if candidate.sum() == 0:
        return math.inf
    p = reference / reference.sum()
    q = candidate / candidate.sum()
    support = p > 0
    if np.any(q[support] == 0):
        return math.inf
    return float(np.sum(p[support] * np.log(p[support] / q[support])))


def _kl_by_prefix_sums(bins: np.ndarray, cutoffs: np.ndarray, levels: int) -> np.ndarray:
    """:func:`kl_divergence_at` for many cut-offs at once, expanded as
    ``KL = (sum p log p - sum p log q) / P - log P + log Q`` over prefix sums."""
    total = bins.sum()
    prefix = np.concatenate([[0.0], np.cumsum(bins)])
    prefix_nonzero = np.concatenate([[0], np.cumsum(bins > 0)])
    safe = np.where(bins > 0, bins, 1.0)
    prefix_xlogx = np.concatenate([[0.0], np.cumsum(bins * np.log(safe))])
    cut = cutoffs[:, None]
    bounds = (np.arange(levels + 1)[None, :] * cut + levels - 1) // levels  # level k: bins [bounds[k], bounds[k+1])
    level_sum = prefix[bounds[:, 1:]] - prefix[bounds[:, :-1]]
    level_nonzero = prefix_nonzero[bounds[:, 1:]] - prefix_nonzero[bounds[:, :-1]]
    average = level_sum / np.maximum(level_nonzero, 1)
    p_log_q = np.sum(level_sum * np.log(np.where(level_sum > 0, average, 1.0)), axis=1)
    tail = total - prefix[cutoffs]
    last = bins[cutoffs - 1]
    last_average = average[np.arange(len(cutoffs)), ((cutoffs - 1) * levels) // cutoffs]
    p_log_q += np.where(last > 0, tail * np.log(np.where(last > 0, last_average, 1.0)), 0.0)
    folded = last + tail
    p_log_p = prefix_xlogx[cutoffs - 1] + folded * np.log(np.where(folded > 0, folded, 1.0))
    kept = prefix[cutoffs]
    with np.errstate(divide="ignore"):
        divergence = (p_log_p - p_log_q) / total - np.log(total) + np.log(kept)
    undefined = (kept == 0) | ((last == 0) & (tail > 0))
    return np.where(undefined, np.inf, divergence)


# ---------------------------------------------------------------------------- weights


def weight_scales(weights, axis: int = 0, *, name: str = "weight") -> np.ndarray:
    """Symmetric per-channel INT8 scales (float32) along ``axis``: each channel's max |w|
    over all other axes / 127, at least :data:`MIN_SCALE` (an all-zero channel)."""
    values = _weight_values(weights, name)
    if values.ndim == 0:
        raise PlugrtError(f"weight {name!r} is a scalar; per-channel scales need a channel axis "
                          "(use weight_scale for one scale)")
    if not -values.ndim <= axis < values.ndim:
        raise PlugrtError(f"weight {name!r} has {values.ndim} axes, so it has no channel axis {axis}; "
                          "name one of its axes (0 for convolution and GEMM weights)")
    others = tuple(a for a in range(values.ndim) if a != axis % values.ndim)
    amax = np.abs(values).max(axis=others) if values.size else np.zeros(values.shape[axis])
    return np.maximum(amax / INT8_MAX, MIN_SCALE).astype(np.float32)


def weight_scale(weights, *, name: str = "weight") -> float:
    """One symmetric INT8 scale for a whole weight: max |w| / 127, at least :data:`MIN_SCALE`."""
    values = _weight_values(weights, name)
    amax = float(np.abs(values).max()) if values.size else 0.0
    return float(np.float32(max(amax / INT8_MAX, MIN_SCALE)))


def _weight_values(weights, name: str) -> np.ndarray:
    values = np.asarray(weights)
    if values.dtype.kind != "f":
        raise PlugrtError(f"weight {name!r} has dtype {values.dtype}; only floating-point weights are quantized")
    values = values.astype(np.float64, copy=False)
    if not np.isfinite(values).all():
        raise PlugrtError(f"weight {name!r} holds NaN or Inf, so it has no INT8 scale; fix the model's weights "
                          "(re-export it) or keep that layer in floating point")
    return values
