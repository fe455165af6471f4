"""What a recurrent node computes, as data (:class:`Recurrence`), and the NumPy reference
that runs it.

The three cells, for one direction (ONNX's equations; ``f``, ``g``, ``h`` the direction's
activations; ``clip``, when the node sets it, bounds the input of every gate's activation,
not that of LSTM's ``h(C)``, as onnxruntime reads it):

- RNN: ``H = f(X W^T + H' R^T + Wb + Rb)``;
- GRU (gates z, r, h): ``z = f(X Wz^T + H' Rz^T + Wbz + Rbz)``, ``r`` likewise,
  ``~h = g(X Wh^T + (r * H') Rh^T + Rbh + Wbh)``, or with ``linear_before_reset``
  ``~h = g(X Wh^T + r * (H' Rh^T + Rbh) + Wbh)``; ``H = (1 - z) * ~h + z * H'``;
- LSTM (gates i, o, f, c): ``i = f(X Wi^T + H' Ri^T + Pi * C' + Wbi + Rbi)``, ``f`` with
  ``Pf`` likewise (``1 - i`` with ``input_forget``), ``~c = g(X Wc^T + H' Rc^T + Wbc + Rbc)``,
  ``C = f * C' + i * ~c``, ``o = f(X Wo^T + H' Ro^T + Po * C + Wbo + Rbo)``,
  ``H = o * h(C)``.

``sequence_lens`` (as onnxruntime reads it): batch entry ``b`` runs ``lens[b]`` steps, the
forward direction over times ``0 .. lens[b] - 1`` and the reverse one from ``lens[b] - 1``
down to 0; Y is zero at later times, and Y_h, Y_c hold the state after its last step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .activations import Activation, resolve

#: Input positions: every cell's, then LSTM's.
X, W, R, B, SEQUENCE_LENS, INITIAL_H, INITIAL_C, P = range(8)
#: Gates per cell, in the order of W's rows.
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
#: Default activations of one direction.
DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


@dataclass(frozen=True)
class Recurrence:
    """One recurrent node: its cell, each direction's time order (``reversed``) and
    activations, and the options that change the math."""

    cell: str
    hidden: int
    reversed: tuple[bool, ...]
    activations: tuple[tuple[Activation, ...], ...]
    clip: float | None = None
    linear_before_reset: bool = False
    input_forget: bool = False
    layout: int = 0

    @property
    def gates(self) -> int:
        return GATES[self.cell]

    @property
    def directions(self) -> int:
        return len(self.reversed)


def describe(cell: str, attrs, hidden: int) -> Recurrence | str:
    """The :class:`Recurrence` of a node of ``cell`` with attributes ``attrs``, or what in
    them is not supported (a phrase for :meth:`OpPlugin.unsupported`)."""
    direction = attrs["direction"]
    if direction not in DIRECTIONS:
        return f"direction={direction!r} (ONNX's directions: forward, reverse, bidirectional)"
    reversed_ = DIRECTIONS[direction]
    per_direction = len(DEFAULT_ACTIVATIONS[cell])
    names = list(attrs["activations"] or DEFAULT_ACTIVATIONS[cell] * len(reversed_))
    if len(names) == per_direction and len(reversed_) == 2:
        names = names * 2  # one list for both directions, as onnxruntime reads it
    if len(names) != per_direction * len(reversed_):
        return (f"{len(names)} activations for a {direction} {cell} (it takes {per_direction} per direction: "
                f"{', '.join(DEFAULT_ACTIVATIONS[cell])} by default)")
    alphas, betas = attrs["activation_alpha"], attrs["activation_beta"]
    found = resolve(names, alphas, betas)
    if isinstance(found, str):
        return found
    clip = attrs["clip"]
    if clip is not None and not clip > 0:
        return f"clip={clip} (a cell clip threshold is positive)"
    by_direction = tuple(tuple(found[d * per_direction:(d + 1) * per_direction]) for d in range(len(reversed_)))
    return Recurrence(cell, int(hidden), reversed_, by_direction, None if clip is None else float(clip),
                      bool(attrs.get("linear_before_reset", 0)), bool(attrs.get("input_forget", 0)),
                      int(attrs["layout"]))


# --------------------------------------------------------------------------- reference


def run(rec: Recurrence, x, w, r, b=None, lens=None, h0=None, c0=None, p=None) -> list[np.ndarray]:
    """``[Y, Y_h, Y_c]`` of the node (``Y_c`` only for LSTM) in float64, each in the node's
    layout. Inputs as the node takes them; ``None`` for an omitted one."""
    wide = [None if a is None else np.asarray(a, np.float64) for a in (x, w, r, b, h0, c0, p)]
    x, w, r, b, h0, c0, p = wide
    if rec.layout == 1:  # [batch, seq, ...] -> [seq, batch, ...]; states [batch, dirs, ...] -> [dirs, batch, ...]
        x = x.swapaxes(0, 1)
        h0 = None if h0 is None else h0.swapaxes(0, 1)
        c0 = None if c0 is None else c0.swapaxes(0, 1)
    steps, batch = x.shape[0], x.shape[1]
    hidden, dirs, gh = rec.hidden, rec.directions, rec.gates * rec.hidden
    lengths = np.full(batch, steps, np.int64) if lens is None else np.asarray(lens, np.int64).reshape(batch)
    if np.any(lengths < 0) or np.any(lengths > steps):
        raise ValueError(f"sequence_lens {lengths.tolist()} must be in [0, {steps}] (the sequence length)")
    y = np.zeros((steps, dirs, batch, hidden))
    y_h = np.zeros((dirs, batch, hidden))
    y_c = np.zeros((dirs, batch, hidden))
    for d in range(dirs):
        bias = np.zeros(2 * gh) if b is None else b[d]
        projected = x @ w[d].T + bias[:gh]  # [seq, batch, gates * hidden]
        h = np.zeros((batch, hidden)) if h0 is None else h0[d].copy()
        c = np.zeros((batch, hidden)) if c0 is None else c0[d].copy()
        rows = np.arange(batch)
        for step in range(steps):
            active = step < lengths
            times = np.where(active, lengths - 1 - step if rec.reversed[d] else step, 0)
            new_h, new_c = _cell(rec, d, projected[times, rows], h, c, r[d], bias[gh:],
                                 None if p is None else p[d])
            y[times[active], d, rows[active]] = new_h[active]
            h = np.where(active[:, None], new_h, h)
            c = np.where(active[:, None], new_c, c)
        y_h[d], y_c[d] = h, c
    if rec.layout == 1:
        y, y_h, y_c = y.transpose(2, 0, 1, 3), y_h.swapaxes(0, 1), y_c.swapaxes(0, 1)
    return [y, y_h, y_c] if rec.cell == "LSTM" else [y, y_h]


def _cell(rec: Recurrence, d: int, xw, h, c, r, rb, p):
    """One step of direction ``d`` for every batch entry: ``xw`` is X W^T + Wb at this
    step; returns the new ``(H, C)`` (C unchanged but for LSTM)."""
    hidden, acts = rec.hidden, rec.activations[d]

    def clipped(v):
        return v if rec.clip is None else np.clip(v, -rec.clip, rec.clip)

    def gate(k, v):  # gate k's columns of [batch, gates * hidden] (or of a bias row)
        return v[..., k * hidden:(k + 1) * hidden]

    if rec.cell == "RNN":
        return acts[0].numpy(clipped(xw + h @ r.T + rb)), c
    if rec.cell == "GRU":
        hr = h @ r.T  # (its h gate is only used with linear_before_reset)
        z = acts[0].numpy(clipped(gate(0, xw) + gate(0, hr) + gate(0, rb)))
        reset = acts[0].numpy(clipped(gate(1, xw) + gate(1, hr) + gate(1, rb)))
        rh = r[2 * hidden:]
        if rec.linear_before_reset:
            candidate = gate(2, xw) + reset * (h @ rh.T + gate(2, rb))
        else:
            candidate = gate(2, xw) + (reset * h) @ rh.T + gate(2, rb)
        candidate = acts[1].numpy(clipped(candidate))
        return (1.0 - z) * candidate + z * h, c
    pre = xw + h @ r.T + rb
    pi, po, pf = (np.zeros(hidden),) * 3 if p is None else (p[:hidden], p[hidden:2 * hidden], p[2 * hidden:])
    i = acts[0].numpy(clipped(gate(0, pre) + pi * c))
    if rec.input_forget:
        f = 1.0 - i
    else:
        f = acts[0].numpy(clipped(gate(2, pre) + pf * c))
    candidate = acts[1].numpy(clipped(gate(3, pre)))
    new_c = f * c + i * candidate
    o = acts[0].numpy(clipped(gate(1, pre) + po * new_c))
    return o * acts[2].numpy(new_c), new_c
