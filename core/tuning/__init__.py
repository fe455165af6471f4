"""Tactic selection: the auto-tuner and its persistent timing cache.

:class:`Tuner` chooses each device layer's tactic (by the plugin's preference, or by
timing the candidates on the GPU, see :mod:`plugrt.tuning.tuner`); :class:`TimingCache`
keeps the timings in a JSON file across builds (:mod:`plugrt.tuning.timing_cache`).
"""

from plugrt.tuning.timing import TacticRun, cuda_event_median
from plugrt.tuning.timing_cache import TimingCache, TimingCacheError, layer_key, tactic_key
from plugrt.tuning.tuner import PLAUSIBLE_TACTICS, TACTICS_BY_LEVEL, Choice, Tuner

__all__ = ["PLAUSIBLE_TACTICS", "TACTICS_BY_LEVEL", "Choice", "TacticRun", "TimingCache", "TimingCacheError", "Tuner",
           "cuda_event_median", "layer_key", "tactic_key"]
