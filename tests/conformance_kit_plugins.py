"""A throwaway op plugin for the conformance kit's self-tests, with bugs to plant.

``AxpyShift`` (domain ``com.example.kit``) computes ``y = x * alpha + b`` for float32
``x`` and ``b`` of one shape. It has two tactics: ``direct`` (one kernel) and ``staged``
(``x * alpha`` into the workspace, then the add), so the kit sees a workspace in use. It is
an ``ANCHOR``: given an epilogue, both apply it before the store (the planted bugs stay in
the tactics without one, except ``epilogue_skipped``).
``AxpyShift(bug)`` plants one bug from :data:`BUGS`; ``plugin_module(bug)`` wraps it as a
plugin module (an object with a ``plugrt_ops`` hook), ready for ``Registry.register``.
"""

from __future__ import annotations

import functools
import pickle
import types
from pickle import dumps as _bound_dumps  # bound at import: escapes the kit's patch

import numpy as np

from plugrt import hookimpl
from plugrt.ir import dims
from plugrt.kernels import cuda, flat, grid_1d, jit
from plugrt.plugin import ANCHOR, Attr, Example, OpPlugin, TensorInfo
from plugrt.tactic import Launch, Tactic

BUGS = (
    "none",
    "wrong_kernel",          # direct: x * alpha - b
    "workspace_overflow",    # staged: declares 8 bytes less workspace than it writes
    "output_overflow",       # direct: writes 3 elements past the output
    "input_write",           # direct: zeroes x after reading it
    "infer_lie",             # infer: one more column than the reference makes
    "static_only_infer",     # infer: int() of every dim, crashes on symbolic dims
    "serialize_pickle",      # serialize: pickle.dumps of its state
    "serialize_bytes",       # serialize: raw bytes, not JSON
    "smuggled_pickle",       # serialize: a pickle (from a pre-bound dumps) as latin-1 text
    "host_table",            # a third tactic bakes x * alpha, read on the host, into its launch
    "tuple_params",          # direct: params {"tile": (8, 1)}, which JSON turns into a list
    "epilogue_skipped",      # direct with an epilogue: stores the value without applying it
    "no_examples",           # examples() claims nothing
)


@jit
def _axpy(x, b, y, alpha, n):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, stride):
        y[i] = x[i] * alpha + b[i]


@jit
def _axpy_wrong(x, b, y, alpha, n):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, stride):
        y[i] = x[i] * alpha - b[i]


@jit
def _axpy_past_end(x, b, y, alpha, n):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n + 3, stride):
        y[i] = x[i % n] * alpha + b[i % n]


@jit
def _axpy_writes_input(x, b, y, alpha, n):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, stride):
        y[i] = x[i] * alpha + b[i]
        x[i] = 0.0


@jit
def _scale(x, scratch, alpha, n):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, stride):
        scratch[i] = x[i] * alpha


@jit
def _add(scratch, b, y, n):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, stride):
        y[i] = scratch[i] + b[i]


@functools.lru_cache(maxsize=None)
def _axpy_then(fn):
    @jit
    def axpy_then(x, b, y, alpha, n, operands):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, n, stride):
            y[i] = fn(x[i] * alpha + b[i], i, operands)
    return axpy_then


@functools.lru_cache(maxsize=None)
def _add_then(fn):
    @jit
    def add_then(scratch, b, y, n, operands):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, n, stride):
            y[i] = fn(scratch[i] + b[i], i, operands)
    return add_then


class AxpyShift(OpPlugin):
    """``y = x * alpha + b``, float32, ``x`` and ``b`` of one shape."""

    domain = "com.example.kit"
    op_type = "AxpyShift"
    attributes = (Attr("alpha", "float", 1.0),)
    inputs = (2, 2)
    dtypes = frozenset({np.dtype(np.float32)})
    groups = frozenset({ANCHOR})

    def __init__(self, bug: str = "none"):
        assert bug in BUGS, bug
        self.bug = bug

    def check(self, node, inputs):
        if tuple(inputs[0].shape) != tuple(inputs[1].shape):
            raise self.unsupported(node, "inputs of different shapes", "give x and b one shape")

    def infer(self, node, inputs):
        shape = tuple(inputs[0].shape)
        if self.bug == "static_only_infer":
            shape = tuple(int(d) for d in shape)
        if self.bug == "infer_lie":
            shape = shape[:-1] + (dims.add(shape[-1], 1),)
        return [TensorInfo(inputs[0].dtype, shape)]

    def reference(self, node, inputs):
        x, b = inputs
        return [(x * np.float32(node.attrs["alpha"]) + b).astype(np.float32)]

    def examples(self):
        if self.bug == "no_examples":
            return []
        shift = np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)
        return [
            Example((TensorInfo(np.float32, (2, 8)), TensorInfo(np.float32, (2, 8))), {"alpha": 2.0}),
            Example((TensorInfo(np.float32, (3, 5)), shift), {"alpha": -0.5}, name="constant-shift",
                    ranges={0: (0.5, 2.0)}),
        ]

    def serialize(self, node):
        state = {"alpha": node.attrs["alpha"], "layout": "flat"}
        if self.bug == "serialize_pickle":
            return {"state": pickle.dumps(state).hex()}
        if self.bug == "serialize_bytes":
            return {"layout": b"flat"}
        if self.bug == "smuggled_pickle":
            return {"state": _bound_dumps(state).decode("latin-1")}
        return state

    # ------------------------------------------------------------------ tactics

    def tactics(self, node, inputs, outputs, epilogue=None):
        n = int(np.prod(outputs[0].shape))
        alpha = np.float32(node.attrs["alpha"])
        if epilogue is not None:
            return [Tactic("direct", self._direct_then(n, alpha, epilogue)),
                    Tactic("staged", self._staged(n, alpha, epilogue), {"stages": 2}, workspace_bytes=4 * n)]
        params = {"tile": (8, 1)} if self.bug == "tuple_params" else {"tile": [8, 1]}
        tactics = [Tactic("direct", self._direct(n, alpha), params),
                   Tactic("staged", self._staged(n, alpha), {"stages": 2}, workspace_bytes=4 * n)]
        if self.bug == "workspace_overflow":
            tactics[1].workspace_bytes = 4 * n - 8
        if self.bug == "host_table":
            tactics.append(Tactic("table", self._table(n, alpha)))
        return tactics

    def _direct(self, n, alpha):
        kernel = {"wrong_kernel": _axpy_wrong, "output_overflow": _axpy_past_end,
                  "input_write": _axpy_writes_input}.get(self.bug, _axpy)

        def launches(ins, outs, workspace):
            blocks, threads = grid_1d(n)
            return [Launch(kernel, blocks, threads, (flat(ins[0]), flat(ins[1]), flat(outs[0]), alpha, np.int64(n)))]
        return launches

    def _direct_then(self, n, alpha, epilogue):
        def launches(ins, outs, workspace):
            blocks, threads = grid_1d(n)
            args = (flat(ins[0]), flat(ins[1]), flat(outs[0]), alpha, np.int64(n))
            if self.bug == "epilogue_skipped":
                return [Launch(_axpy, blocks, threads, args)]
            return [Launch(_axpy_then(epilogue.fn), blocks, threads, args + (epilogue.arguments(ins),))]
        return launches

    def _staged(self, n, alpha, epilogue=None):
        def launches(ins, outs, workspace):
            scratch = workspace.view(np.float32)
            blocks, threads = grid_1d(n)
            first = Launch(_scale, blocks, threads, (flat(ins[0]), scratch, alpha, np.int64(n)))
            args = (scratch, flat(ins[1]), flat(outs[0]), np.int64(n))
            if epilogue is None:
                return [first, Launch(_add, blocks, threads, args)]
            return [first, Launch(_add_then(epilogue.fn), blocks, threads, args + (epilogue.arguments(ins),))]
        return launches

    def _table(self, n, alpha):
        def launches(ins, outs, workspace):
            table = cuda.to_device(flat(ins[0]).copy_to_host() * alpha)  # reads input values: wrong
            blocks, threads = grid_1d(n)
            return [Launch(_add, blocks, threads, (table, flat(ins[1]), flat(outs[0]), np.int64(n)))]
        return launches


def plugin_module(bug: str = "none", name: str | None = None):
    """A plugin module providing ``AxpyShift(bug)``."""
    module = types.ModuleType(name or f"kit_plugin_{bug}")

    @hookimpl
    def plugrt_ops():
        return [AxpyShift(bug)]

    module.plugrt_ops = plugrt_ops
    return module


__all__ = ["AxpyShift", "BUGS", "plugin_module"]
