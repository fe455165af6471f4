"""Targets that misbehave on purpose, for tests/test_fuzz_harness.py."""

import os
import time

import numpy as np

from plugrt import PlugrtError


def misbehave(payload: bytes):
    if payload == b"raise":
        raise ValueError("boom")
    if payload == b"plugrt":
        raise PlugrtError("a clean answer to bad input")
    if payload == b"crash":
        os.kill(os.getpid(), 11)
    if payload == b"hang":
        time.sleep(100)
    if payload == b"memory":
        np.ones(10**10)
    if payload == b"problem":
        return "loaded an inconsistent header"
    return None
