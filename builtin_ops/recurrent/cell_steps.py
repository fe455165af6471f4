"""The kernels of one time step of each cell, and the device functions they share.

One thread per ``(direction, batch entry, hidden unit)`` (item ``i = (d * batch + b) *
hidden + j``, the index of its unit in the ``[dirs, batch, hidden]`` state), in a
grid-stride loop. A step reads the input projection X W^T + Wb of its time (computed for
every time at once, :mod:`.projection`), the previous hidden state ``state_h[src + ...]``
(and ``state_c``), multiplies the previous H by its unit's rows of R, applies the gates and
writes the new state to ``state_h[dst + ...]``: two slots of the workspace in turn, so that
no thread overwrites an H another still reads. It also writes Y at its time.

At step ``s`` a forward direction is at time ``s``, a reverse one at ``length - 1 - s``
(``length``: the batch entry's ``sequence_lens``, clamped to the sequence). A batch entry
whose sequence has ended copies its state on unchanged and writes zero to Y at time ``s``
(which no direction reaches for it): every padded time is zeroed exactly once.

GRU without ``linear_before_reset`` needs the whole ``r * H'`` of a batch entry before any
unit's candidate: its step is two launches, :func:`gru_gates_kernel` (z and ``r * H'`` to
the workspace) then :func:`gru_candidate_kernel`.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import cuda, jit

from .activations import device_activation


@jit(device=True)
def unit_of(i, batch, hidden):
    """``(direction, batch entry, hidden unit)`` of state item ``i``."""
    per_direction = batch * hidden
    d = i // per_direction
    rest = i - d * per_direction
    b = rest // hidden
    return d, b, rest - b * hidden


@functools.lru_cache(maxsize=None)
def step_geometry(first_reversed: bool, has_lens: bool):
    """``(length_of, time_of)`` device functions: a batch entry's sequence length (clamped to
    ``[0, steps]``), and the time direction ``d`` is at in step ``step``."""

    @jit(device=True)
    def length_of(lens, b, steps):
        if has_lens:
            return min(max(lens[b], 0), steps)
        return steps

    @jit(device=True)
    def time_of(d, step, length):
        if d == 1 or first_reversed:
            return length - 1 - step
        return step

    return length_of, time_of


@functools.lru_cache(maxsize=None)
def gate_activation(activations: tuple, k: int, acc_name: str, clip):
    """``fn(d, x)``: direction ``d``'s ``k``-th activation of ``x``, clipped first when the
    node sets ``clip`` (``activations``: one tuple per direction)."""
    first = device_activation(activations[0][k], acc_name)
    last = device_activation(activations[-1][k], acc_name)
    A = np.dtype(acc_name).type
    bound = A(0 if clip is None else clip)
    clipped = clip is not None

    @jit(device=True)
    def fn(d, x):
        if clipped:
            x = min(max(x, -bound), bound)
        if d == 0:
            return first(x)
        return last(x)

    return fn


@functools.lru_cache(maxsize=None)
def plain_activation(activations: tuple, k: int, acc_name: str):
    """``fn(d, x)``: as :func:`gate_activation` without the clip (LSTM's ``h(C)``)."""
    return gate_activation(activations, k, acc_name, None)


# --------------------------------------------------------------------------- RNN


@functools.lru_cache(maxsize=None)
def rnn_step_kernel(rec, acc_name: str, has_bias: bool, has_lens: bool, has_y: bool):
    """``kernel(proj, r, bias, lens, state_h, src, dst, y, y_st, y_sd, y_sb, step, steps,
    batch, hidden)``: ``H = f(xw + H' R^T + Rb)``."""
    A = np.dtype(acc_name).type
    zero = A(0)
    dirs = rec.directions
    length_of, time_of = step_geometry(rec.reversed[0], has_lens)
    f = gate_activation(rec.activations, 0, acc_name, rec.clip)

    @jit
    def kernel(proj, r, bias, lens, state_h, src, dst, y, y_st, y_sd, y_sb, step, steps, batch, hidden):
        for i in range(cuda.grid(1), dirs * batch * hidden, cuda.gridsize(1)):
            d, b, j = unit_of(i, batch, hidden)
            length = length_of(lens, b, steps)
            if step >= length:
                state_h[dst + i] = state_h[src + i]
                if has_y:
                    y[step * y_st + d * y_sd + b * y_sb + j] = zero
                continue
            t = time_of(d, step, length)
            total = proj[((d * steps + t) * batch + b) * hidden + j]
            if has_bias:
                total += A(bias[(2 * d + 1) * hidden + j])
            h_at, row = src + (d * batch + b) * hidden, (d * hidden + j) * hidden
            for k in range(hidden):
                total += state_h[h_at + k] * A(r[row + k])
            h = f(d, total)
            state_h[dst + i] = h
            if has_y:
                y[t * y_st + d * y_sd + b * y_sb + j] = h

    return kernel


# --------------------------------------------------------------------------- LSTM


@functools.lru_cache(maxsize=None)
def lstm_step_kernel(rec, acc_name: str, has_bias: bool, has_lens: bool, has_peepholes: bool, has_y: bool):
    """``kernel(proj, r, bias, peepholes, lens, state_h, state_c, src, dst, y, y_st, y_sd,
    y_sb, step, steps, batch, hidden)``: one LSTM step (gates i, o, f, c in W's order)."""
    A = np.dtype(acc_name).type
    zero, one = A(0), A(1)
    dirs = rec.directions
    input_forget = rec.input_forget
    length_of, time_of = step_geometry(rec.reversed[0], has_lens)
    f = gate_activation(rec.activations, 0, acc_name, rec.clip)
    g = gate_activation(rec.activations, 1, acc_name, rec.clip)
    h_of = plain_activation(rec.activations, 2, acc_name)

    @jit
    def kernel(proj, r, bias, peepholes, lens, state_h, state_c, src, dst, y, y_st, y_sd, y_sb, step, steps,
               batch, hidden):
        gh = 4 * hidden
        gate_rows = hidden * hidden  # R's elements between one gate's row j and the next gate's
        for i in range(cuda.grid(1), dirs * batch * hidden, cuda.gridsize(1)):
            d, b, j = unit_of(i, batch, hidden)
            length = length_of(lens, b, steps)
            c_prev = state_c[src + i]
            if step >= length:
                state_h[dst + i] = state_h[src + i]
                state_c[dst + i] = c_prev
                if has_y:
                    y[step * y_st + d * y_sd + b * y_sb + j] = zero
                continue
            t = time_of(d, step, length)
            at = ((d * steps + t) * batch + b) * gh + j
            gi, go, gf, gc = proj[at], proj[at + hidden], proj[at + 2 * hidden], proj[at + 3 * hidden]
            if has_bias:
                rb = (2 * d + 1) * gh + j
                gi += A(bias[rb])
                go += A(bias[rb + hidden])
                gf += A(bias[rb + 2 * hidden])
                gc += A(bias[rb + 3 * hidden])
            h_at, row = src + (d * batch + b) * hidden, (d * gh + j) * hidden
            for k in range(hidden):
                hk = state_h[h_at + k]
                gi += hk * A(r[row + k])
                go += hk * A(r[row + gate_rows + k])
                gf += hk * A(r[row + 2 * gate_rows + k])
                gc += hk * A(r[row + 3 * gate_rows + k])
            pi, po, pf = zero, zero, zero
            if has_peepholes:
                p_at = 3 * hidden * d + j
                pi, po, pf = A(peepholes[p_at]), A(peepholes[p_at + hidden]), A(peepholes[p_at + 2 * hidden])
            input_gate = f(d, gi + pi * c_prev)
            if input_forget:
                forget_gate = one - input_gate
            else:
                forget_gate = f(d, gf + pf * c_prev)
            c = forget_gate * c_prev + input_gate * g(d, gc)
            h = f(d, go + po * c) * h_of(d, c)
            state_h[dst + i] = h
            state_c[dst + i] = c
            if has_y:
                y[t * y_st + d * y_sd + b * y_sb + j] = h

    return kernel


# --------------------------------------------------------------------------- GRU


@functools.lru_cache(maxsize=None)
def gru_gates_kernel(rec, acc_name: str, has_bias: bool, has_lens: bool):
    """``kernel(proj, r, bias, lens, state_h, src, gates, step, steps, batch, hidden)``:
    z to ``gates[i]`` and ``r * H'`` to ``gates[units + i]`` (GRU without
    ``linear_before_reset``, the first of its two launches a step)."""
    A = np.dtype(acc_name).type
    dirs = rec.directions
    length_of, time_of = step_geometry(rec.reversed[0], has_lens)
    f = gate_activation(rec.activations, 0, acc_name, rec.clip)

    @jit
    def kernel(proj, r, bias, lens, state_h, src, gates, step, steps, batch, hidden):
        gh = 3 * hidden
        units = dirs * batch * hidden
        for i in range(cuda.grid(1), units, cuda.gridsize(1)):
            d, b, j = unit_of(i, batch, hidden)
            length = length_of(lens, b, steps)
            if step >= length:
                continue
            t = time_of(d, step, length)
            at = ((d * steps + t) * batch + b) * gh + j
            gz, gr = proj[at], proj[at + hidden]
            if has_bias:
                rb = (2 * d + 1) * gh + j
                gz += A(bias[rb])
                gr += A(bias[rb + hidden])
            h_at, row = src + (d * batch + b) * hidden, (d * gh + j) * hidden
            for k in range(hidden):
                hk = state_h[h_at + k]
                gz += hk * A(r[row + k])
                gr += hk * A(r[row + hidden * hidden + k])
            gates[i] = f(d, gz)
            gates[units + i] = f(d, gr) * state_h[src + i]

    return kernel


@functools.lru_cache(maxsize=None)
def gru_candidate_kernel(rec, acc_name: str, has_bias: bool, has_lens: bool, has_y: bool):
    """``kernel(proj, r, bias, lens, state_h, src, dst, gates, y, y_st, y_sd, y_sb, step,
    steps, batch, hidden)``: ``~h = g(xw_h + (r * H') Rh^T + Rbh)`` from
    :func:`gru_gates_kernel`'s z and ``r * H'``, then the new H."""
    A = np.dtype(acc_name).type
    zero, one = A(0), A(1)
    dirs = rec.directions
    length_of, time_of = step_geometry(rec.reversed[0], has_lens)
    g = gate_activation(rec.activations, 1, acc_name, rec.clip)

    @jit
    def kernel(proj, r, bias, lens, state_h, src, dst, gates, y, y_st, y_sd, y_sb, step, steps, batch, hidden):
        gh = 3 * hidden
        units = dirs * batch * hidden
        for i in range(cuda.grid(1), units, cuda.gridsize(1)):
            d, b, j = unit_of(i, batch, hidden)
            length = length_of(lens, b, steps)
            h_prev = state_h[src + i]
            if step >= length:
                state_h[dst + i] = h_prev
                if has_y:
                    y[step * y_st + d * y_sd + b * y_sb + j] = zero
                continue
            t = time_of(d, step, length)
            total = proj[((d * steps + t) * batch + b) * gh + 2 * hidden + j]
            if has_bias:
                total += A(bias[(2 * d + 1) * gh + 2 * hidden + j])
            rh_at, row = units + (d * batch + b) * hidden, (d * gh + 2 * hidden + j) * hidden
            for k in range(hidden):
                total += gates[rh_at + k] * A(r[row + k])
            z = gates[i]
            h = (one - z) * g(d, total) + z * h_prev
            state_h[dst + i] = h
            if has_y:
                y[t * y_st + d * y_sd + b * y_sb + j] = h

    return kernel


@functools.lru_cache(maxsize=None)
def gru_linear_before_reset_kernel(rec, acc_name: str, has_bias: bool, has_lens: bool, has_y: bool):
    """``kernel(proj, r, bias, lens, state_h, src, dst, y, y_st, y_sd, y_sb, step, steps,
    batch, hidden)``: one GRU step with ``linear_before_reset``: ``~h = g(xw_h + r * (H'
    Rh^T + Rbh))``, every gate from H' alone, so one launch."""
    A = np.dtype(acc_name).type
    zero, one = A(0), A(1)
    dirs = rec.directions
    length_of, time_of = step_geometry(rec.reversed[0], has_lens)
    f = gate_activation(rec.activations, 0, acc_name, rec.clip)
    g = gate_activation(rec.activations, 1, acc_name, rec.clip)

    @jit
    def kernel(proj, r, bias, lens, state_h, src, dst, y, y_st, y_sd, y_sb, step, steps, batch, hidden):
        gh = 3 * hidden
        gate_rows = hidden * hidden
        for i in range(cuda.grid(1), dirs * batch * hidden, cuda.gridsize(1)):
            d, b, j = unit_of(i, batch, hidden)
            length = length_of(lens, b, steps)
            h_prev = state_h[src + i]
            if step >= length:
                state_h[dst + i] = h_prev
                if has_y:
                    y[step * y_st + d * y_sd + b * y_sb + j] = zero
                continue
            t = time_of(d, step, length)
            at = ((d * steps + t) * batch + b) * gh + j
            gz, gr, hr = proj[at], proj[at + hidden], zero
            if has_bias:
                rb = (2 * d + 1) * gh + j
                gz += A(bias[rb])
                gr += A(bias[rb + hidden])
                hr += A(bias[rb + 2 * hidden])
            h_at, row = src + (d * batch + b) * hidden, (d * gh + j) * hidden
            for k in range(hidden):
                hk = state_h[h_at + k]
                gz += hk * A(r[row + k])
                gr += hk * A(r[row + gate_rows + k])
                hr += hk * A(r[row + 2 * gate_rows + k])
            z = f(d, gz)
            h = (one - z) * g(d, proj[at + 2 * hidden] + f(d, gr) * hr) + z * h_prev
            state_h[dst + i] = h
            if has_y:
                y[t * y_st + d * y_sd + b * y_sb + j] = h

    return kernel
