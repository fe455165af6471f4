"""The stepwise tactic of LSTM, GRU and RNN: the launches of one node, in order, and the
workspace they share.

Launches: the input projection of every time (:mod:`.projection`); the initial state into
slot 0 of the workspace's state (a copy of initial_h / initial_c, or zeros); one launch a
time step (two for GRU without ``linear_before_reset``), both directions in each, the
state moving between two slots (:mod:`.cell_steps`); the final state out to Y_h and Y_c.
The sequence length is part of the shapes, so the launch list is fixed for them.

Workspace, in the accumulator type (float32; float64 for float64 inputs):
``proj [dirs, seq, batch, gates * hidden]``, ``state_h [2, dirs, batch, hidden]``, then
LSTM's ``state_c`` and GRU's ``z, r * H'`` of the same size.
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import flat, grid_1d, to_device
from plugrt.plugin import Launch, Tactic

from . import cell_steps
from .projection import copy_state, projection_kernel, zero_state
from .recurrence import B, INITIAL_C, INITIAL_H, P, R, SEQUENCE_LENS, W, X


def accumulator(dtype) -> np.dtype:
    """What the kernels compute a dtype in: float64 for float64, float32 otherwise."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def _state_strides(rec, batch: int) -> tuple[int, int]:
    """``(direction stride, batch stride)`` of initial_h, Y_h and their kin in the node's layout."""
    dirs, hidden = rec.directions, rec.hidden
    return (hidden, dirs * hidden) if rec.layout == 1 else (batch * hidden, hidden)


def _y_strides(rec, steps: int, batch: int) -> tuple[int, int, int]:
    """``(time, direction, batch)`` strides of Y in the node's layout."""
    dirs, hidden = rec.directions, rec.hidden
    if rec.layout == 1:  # [batch, seq, dirs, hidden]
        return dirs * hidden, hidden, steps * dirs * hidden
    return dirs * batch * hidden, batch * hidden, hidden


def stepwise_tactic(rec, x_shape, dtype, present: tuple[bool, ...]) -> Tactic:
    """The ``stepwise`` tactic of the node ``rec`` (:class:`~.recurrence.Recurrence`) for X of
    ``x_shape`` and ``dtype``; ``present[k]`` says whether the node gives input ``k``."""
    acc = accumulator(dtype)
    size = int(x_shape[2])
    steps, batch = (int(x_shape[1]), int(x_shape[0])) if rec.layout == 1 else (int(x_shape[0]), int(x_shape[1]))
    dirs, hidden, gh = rec.directions, rec.hidden, rec.gates * rec.hidden
    units = dirs * batch * hidden
    two_phase = rec.cell == "GRU" and not rec.linear_before_reset
    sizes = {"proj": dirs * steps * batch * gh, "state_h": 2 * units,
             "state_c": 2 * units if rec.cell == "LSTM" else 0, "gates": 2 * units if two_phase else 0}
    has = {name: present[k] if k < len(present) else False
           for name, k in (("bias", B), ("lens", SEQUENCE_LENS), ("h0", INITIAL_H), ("c0", INITIAL_C),
                           ("peepholes", P))}
    state_sd, state_sb = _state_strides(rec, batch)
    x_st, x_sb = (size, steps * size) if rec.layout == 1 else (batch * size, size)

    def launches(ins, outs, workspace):
        if units == 0:
            return []
        space, views, at = workspace.view(acc), {}, 0
        for name, count in sizes.items():
            views[name] = space[at:at + count]
            at += count
        dummy = to_device(np.zeros(1, dtype))
        x, w, r = flat(ins[X]), flat(ins[W]), flat(ins[R])
        bias = flat(ins[B]) if has["bias"] else dummy
        lens = ins[SEQUENCE_LENS] if has["lens"] else to_device(np.zeros(1, np.int32))
        y, y_h, y_c = (_output(outs, k) for k in range(3))
        found = []
        if sizes["proj"]:
            blocks, threads = grid_1d(sizes["proj"])
            found.append(Launch(projection_kernel(acc.name, has["bias"]), blocks, threads,
                                (x, w, bias, views["proj"], np.int64(x_st), np.int64(x_sb), np.int64(dirs),
                                 np.int64(steps), np.int64(batch), np.int64(size), np.int64(gh))))
        blocks, threads = grid_1d(units)
        states = [("state_h", INITIAL_H, "h0", y_h)]
        if rec.cell == "LSTM":
            states.append(("state_c", INITIAL_C, "c0", y_c))
        geometry = (np.int64(batch), np.int64(hidden))
        for state, k, given, _ in states:
            if has[given]:
                found.append(Launch(copy_state, blocks, threads,
                                    (flat(ins[k]), np.int64(0), np.int64(state_sd), np.int64(state_sb),
                                     views[state], np.int64(0), np.int64(batch * hidden), np.int64(hidden),
                                     np.int64(dirs)) + geometry))
            else:
                found.append(Launch(zero_state, blocks, threads, (views[state], np.int64(units))))
        y_strides = tuple(np.int64(s) for s in _y_strides(rec, steps, batch))
        y_flat = flat(y) if y is not None else dummy
        for step in range(steps):
            src, dst = np.int64((step % 2) * units), np.int64(((step + 1) % 2) * units)
            found.extend(_step_launches(rec, acc.name, has, y is not None, blocks, threads, views, ins, bias, lens,
                                        src, dst, y_flat, y_strides, np.int64(step), np.int64(steps), geometry))
        final = np.int64((steps % 2) * units)
        for state, _, _, out in states:
            if out is not None:
                found.append(Launch(copy_state, blocks, threads,
                                    (views[state], final, np.int64(batch * hidden), np.int64(hidden), flat(out),
                                     np.int64(0), np.int64(state_sd), np.int64(state_sb), np.int64(dirs))
                                    + geometry))
        return found

    workspace_bytes = acc.itemsize * sum(sizes.values())
    return Tactic("stepwise", launches, {"cell": rec.cell}, workspace_bytes=workspace_bytes)


def _output(outs, k: int):
    return outs[k] if k < len(outs) else None


def _step_launches(rec, acc_name, has, has_y, blocks, threads, views, ins, bias, lens, src, dst, y, y_strides,
                   step, steps, geometry) -> list[Launch]:
    """The launches of time step ``step``: one, or GRU's two without ``linear_before_reset``."""
    proj, r, state_h = views["proj"], flat(ins[R]), views["state_h"]
    tail = (y,) + y_strides + (step, steps) + geometry
    if rec.cell == "RNN":
        kernel = cell_steps.rnn_step_kernel(rec, acc_name, has["bias"], has["lens"], has_y)
        return [Launch(kernel, blocks, threads, (proj, r, bias, lens, state_h, src, dst) + tail)]
    if rec.cell == "LSTM":
        peepholes = flat(ins[P]) if has["peepholes"] else bias
        kernel = cell_steps.lstm_step_kernel(rec, acc_name, has["bias"], has["lens"], has["peepholes"], has_y)
        return [Launch(kernel, blocks, threads,
                       (proj, r, bias, peepholes, lens, state_h, views["state_c"], src, dst) + tail)]
    if rec.linear_before_reset:
        kernel = cell_steps.gru_linear_before_reset_kernel(rec, acc_name, has["bias"], has["lens"], has_y)
        return [Launch(kernel, blocks, threads, (proj, r, bias, lens, state_h, src, dst) + tail)]
    gates = cell_steps.gru_gates_kernel(rec, acc_name, has["bias"], has["lens"])
    candidate = cell_steps.gru_candidate_kernel(rec, acc_name, has["bias"], has["lens"], has_y)
    return [Launch(gates, blocks, threads, (proj, r, bias, lens, state_h, src, views["gates"], step, steps) + geometry),
            Launch(candidate, blocks, threads, (proj, r, bias, lens, state_h, src, dst, views["gates"]) + tail)]
