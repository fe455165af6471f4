"""The epilogue probe: an ``ANCHOR`` op's tactics, given an epilogue, apply it once to every
output element with its flat index, before the store (:class:`plugrt.kernels.Epilogue`).

The probe is ``value * 0.5 + residual[index]``, with ``residual`` a float32 tensor of the
output's shape passed after the node's inputs, as the core's fused layers pass theirs. A
tactic that skips it, applies it twice (split-K partial sums), or passes the wrong index
or operands gets the wrong result; one that reads ``ins`` past its own inputs, or writes
out of bounds, is caught as every tactic is.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np

from plugrt.kernels import Epilogue, jit
from plugrt.plugin import ANCHOR
from plugrt.tactic import Tactic

#: The probe's scale of the anchor's value.
SCALE = 0.5



@dataclass
class Variant:
    """One tactic run the tactics and guards checks judge: the tactic, its inputs for the
    first run and the replay (``runtime``: which are replaced for the replay), and the
    outputs it must produce."""

    label: str
    tactic: Tactic
    inputs: list
    replay_inputs: list
    runtime: list
    expected: list
    replay_expected: list


@functools.lru_cache(maxsize=None)
def probe_function():
    """``value * 0.5 + operands[1][index]`` as a device function (``operands[0]`` is the table)."""
    @jit(device=True)
    def conformance_probe(value, index, operands):
        return value * 0.5 + operands[1][index]

    return conformance_probe


def epilogue_variants(run, runtime: list) -> tuple[list, list]:
    """``(variants, failures)``: every tactic the op offers with the probe epilogue, as
    :class:`Variant` objects (empty for ops outside ``ANCHOR``,
    and for outputs that are not floats or not one)."""

    node, op = run.node, run.op
    if ANCHOR not in op.groups or len(node.outputs) != 1:
        return [], []
    out = run.graph.info(node.outputs[0])
    if out.dtype.kind != "f":
        return [], []
    epilogue = Epilogue(probe_function(), first=len(node.inputs), label="conformance probe")
    ins = [run.graph.info(name) if name else None for name in node.inputs]
    failures: list = []
    try:
        with run.watch("tactics(epilogue=...)"):
            found = run.offered(node, ins, [out], epilogue=epilogue)
    except Exception as exc:
        return [], [run.failure("tactics", f"tactics(..., epilogue=E) raised {type(exc).__name__}: {exc}",
                                "an ANCHOR op's tactics accept an epilogue (plugrt.kernels.Epilogue)")]
    if not found:
        return [], [run.failure("tactics", "the op is in the ANCHOR group but offers no tactic with an epilogue",
                                "accept epilogue= in tactics() and apply it before each store, or leave ANCHOR")]
    found = [t for t in found if isinstance(t, Tactic) and run.declared_well(t, failures)]
    rng = np.random.default_rng([run.seed, zlib.crc32(run.op_label.encode()), run.index, 0xE9])
    shape = tuple(int(d) for d in out.shape)
    residual, replay_residual = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    expected = _probe(run.expected[0], residual, out.dtype)
    replay_expected = _probe(run.replay_expected[0], replay_residual, out.dtype)
    variants = [Variant(f"{t.name}+epilogue", t, run.node_inputs(run.feeds) + [residual],
                        run.node_inputs(run.replay_feeds) + [replay_residual], list(runtime) + [True],
                        [expected], [replay_expected]) for t in found]
    return variants, failures


def _probe(value: np.ndarray, residual: np.ndarray, dtype) -> np.ndarray:
    wide = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return (value.astype(wide) * wide(SCALE) + residual.astype(wide)).astype(dtype)


__all__ = ["SCALE", "epilogue_variants", "probe_function"]
