"""Test setup: import plugrt first, so it picks the CUDA simulator when there is no GPU."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import plugrt  # noqa: F401  (chooses GPU or simulator before numba.cuda is imported)


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id (the same inputs on every run)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
