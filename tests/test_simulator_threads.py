"""The test setup's simulator blocks (the root conftest.py: pooled threads, a barrier for
``syncthreads``) keep the simulator's rules: a shared-memory reduction across barriers,
the block votes, threads that end before a barrier, 2-D blocks run again on reused threads,
and a thread's exception raised by the launch with the thread named."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from plugrt.device import simulated

simulator_only = pytest.mark.skipif(not simulated(), reason="the simulator's block manager")


@cuda.jit
def _block_sums(x, out):
    s = cuda.shared.array(64, np.float32)
    t = cuda.threadIdx.x
    s[t] = x[cuda.blockIdx.x * 64 + t]
    cuda.syncthreads()
    step = 32
    while step > 0:
        if t < step:
            s[t] += s[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


@cuda.jit
def _votes(x, out):
    t = cuda.threadIdx.x
    out[0, t] = cuda.syncthreads_count(x[t] > 0)
    out[1, t] = cuda.syncthreads_and(x[t] > -4)
    out[2, t] = cuda.syncthreads_and(x[t] > 0)
    out[3, t] = cuda.syncthreads_or(x[t] > 11)


@cuda.jit
def _first_ten_wait(seen, out):
    t = cuda.threadIdx.x
    if t >= 10:
        return  # ended threads are not waited for at the barrier below
    seen[t] = t
    cuda.syncthreads()
    out[t] = seen[0] + seen[9]


@cuda.jit
def _indices(out):
    x, y = cuda.grid(2)
    out[y, x] = x * 100 + y


@cuda.jit
def _raises_in_one_thread(x):
    t = cuda.threadIdx.x
    if t == 5:
        raise ValueError("thread five")
    cuda.syncthreads()
    x[t] = 1


@simulator_only
def test_the_simulator_runs_blocks_through_the_test_setups_barrier():
    from numba.cuda.simulator import kernel

    assert kernel.BlockManager.run.__qualname__.startswith("_use_a_pool_and_a_barrier_in_the_simulator")


def test_a_reduction_across_barriers(rng):
    x = rng.standard_normal(64 * 3).astype(np.float32)
    out = np.zeros(3, np.float32)
    _block_sums[3, 64](x, out)
    np.testing.assert_allclose(out, x.reshape(3, 64).astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def test_the_block_votes():
    """``syncthreads_count`` counts; ``syncthreads_and``/``_or`` return zero or non-zero
    (CUDA promises no more than that: the GPU's non-zero need not be 1)."""
    out = np.zeros((4, 16), np.int32)
    _votes[1, 16](np.arange(-3, 13).astype(np.float32), out)
    assert out[0].tolist() == [12] * 16
    assert (out[1] != 0).all() and (out[2] == 0).all() and (out[3] != 0).all(), out.tolist()


def test_threads_that_end_early_are_not_waited_for():
    seen, out = np.zeros(16, np.int32), np.zeros(16, np.int32)
    _first_ten_wait[1, 16](seen, out)
    assert out.tolist() == [9] * 10 + [0] * 6


def test_two_dimensional_blocks_on_reused_threads():
    for _ in range(3):
        out = np.zeros((6, 8), np.int64)
        _indices[(2, 3), (4, 2)](out)
        assert (out == np.arange(8)[None, :] * 100 + np.arange(6)[:, None]).all()


@simulator_only
def test_a_thread_that_raises_fails_the_launch_and_is_named():
    with pytest.raises(ValueError, match=r"tid=\[5, 0, 0\] ctaid=\[0, 0, 0\]: thread five"):
        _raises_in_one_thread[1, 8](np.zeros(8))
    out = np.zeros(3, np.float32)
    _block_sums[3, 64](np.ones(192, np.float32), out)  # the next launch runs as before
    assert out.tolist() == [64.0] * 3


@cuda.jit
def _shared_seen(out):
    a = cuda.shared.array(32, np.float32)
    b = cuda.shared.array(32, np.float32)  # (another line: another array)
    t = cuda.threadIdx.x
    a[t] = t
    b[t] = 2 * t
    cuda.syncthreads()
    total = np.float32(0)
    for i in range(32):
        total += a[i] - b[i]
    out[t] = total


@simulator_only
def test_a_blocks_threads_share_its_shared_arrays_across_a_thread_switch(monkeypatch):
    """``cuda.shared.array`` looks a block's array up, allocates it if missing and stores
    it: a thread switch in between (forced here by a slow allocation; under load it comes
    by chance) gave two threads arrays of their own without plugrt's lock
    (:func:`plugrt.device.guard_simulator`), and a tiled kernel a wrong row."""
    import time

    from numba.cuda.simulator import kernelapi

    real = kernelapi.np

    class SlowAllocation:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def empty(*args, **kwargs):
            time.sleep(0.002)  # (gives the GIL to the threads starting meanwhile)
            return real.empty(*args, **kwargs)

    monkeypatch.setattr(kernelapi, "np", SlowAllocation())
    out = np.zeros(32, np.float32)
    _shared_seen[1, 32](out)
    np.testing.assert_array_equal(out, np.full(32, -sum(range(32)), np.float32))
