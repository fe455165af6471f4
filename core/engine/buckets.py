"""Batch buckets: a request's batch padded up to the nearest of a few listed sizes, so that a
serving context sees few shapes (few specializations, few CUDA graphs) however its
requests' batches vary; the outputs come back cut to the request's batch.

Only the batch (dim 0 of every input and output) is padded: the rows of a batch are
independent in the models people serve, so padding changes no real row's result (padded
rows repeat the request's last row, values the model has seen). A padded sequence would
change an attention's results unless the model masks it, so other dims are never padded
here. A request larger than every bucket runs at its own batch.
"""

from __future__ import annotations

import numpy as np

from plugrt.errors import BindingError, PlugrtError


def check_buckets(engine, profile: int, buckets) -> tuple[int, ...]:
    """The buckets sorted, each a batch every input's profile range allows."""
    try:
        found = tuple(sorted({int(b) for b in buckets}))
    except (TypeError, ValueError):
        raise PlugrtError(f"batch buckets must be whole numbers, got {buckets!r}") from None
    shapes = engine.profiles[profile].shapes
    for name in engine.input_names:
        low, _, high = shapes[name]
        outside = [b for b in found if not low or not low[0] <= b <= high[0]]
        if outside:
            where = f"[{low[0]}, {high[0]}]" if low else "none (a scalar input)"
            raise PlugrtError(f"batch bucket {outside[0]}: input {name!r} takes batches (dim 0) {where} in "
                              f"profile {profile}; give buckets inside that range")
    return found


def run(context, feeds, device_outputs: bool) -> dict:
    """``context.execute`` of ``feeds`` padded to the nearest bucket, outputs cut back."""
    batches = {int(np.shape(value)[0]) if np.ndim(value) else None for value in feeds.values()}
    if len(batches) != 1 or None in batches:
        raise BindingError(f"batch buckets: every input needs the same batch (dim 0), got "
                           f"{ {name: list(np.shape(value)) for name, value in feeds.items()} }")
    batch = batches.pop()
    bucket = next((b for b in context.batch_buckets if b >= batch), batch)
    if bucket == batch:
        return context.run_unbucketed(feeds, device_outputs)
    outputs = context.run_unbucketed({name: _padded(value, bucket) for name, value in feeds.items()}, device_outputs)
    return {name: value[:batch] if np.ndim(value) and np.shape(value)[0] == bucket else value
            for name, value in outputs.items()}


def _padded(value, bucket: int):
    """``value`` with rows repeating its last one up to ``bucket`` rows."""
    if isinstance(value, np.ndarray) or not hasattr(value, "__cuda_array_interface__"):
        array = np.asarray(value)
        return np.concatenate([array, np.repeat(array[-1:], bucket - len(array), axis=0)])
    from numba import cuda

    source = cuda.as_cuda_array(value)
    padded = cuda.device_array((bucket,) + tuple(source.shape[1:]), source.dtype)
    padded[:source.shape[0]].copy_to_device(source)
    for row in range(source.shape[0], bucket):
        padded[row:row + 1].copy_to_device(source[-1:])
    return padded
