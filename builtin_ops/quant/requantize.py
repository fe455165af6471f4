"""QLinearConv's and QLinearMatMul's requantizing store, as an epilogue of the integer kernels.

The QLinear ops run ConvInteger's and MatMulInteger's tactics on their integer inputs,
with :class:`Requantizing` as the epilogue: :func:`requantizer` turns the int32
accumulator into the output type (``+ B`` for QLinearConv, times ``x_scale * w_scale /
y_scale`` per output channel or column, ``+ y_zero_point``, round half to even, clamp),
then the epilogue fused after the QLinear node (if any) runs on that value.

The scales and zero points are read on the device (they may be runtime inputs), the
multiplier computed as ONNX's reference does: in the scales' dtype (float32, or float16
rounding after each operation), the product with the accumulator in float64.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
from numba import float64, int32

from plugrt.kernels import Epilogue, flat, jit, to_device

from .device_functions import limits, rint

# Slots of the requantizer's table: the flat index's divisor and modulus giving the
# channel (column), the step of a per-channel w (b) scale, whether there is a bias.
R_DIV, R_MOD, R_STEP, R_BIAS = range(4)


@functools.lru_cache(maxsize=None)
def _multiplier(half: bool):
    """``x_scale * w_scale / y_scale`` in float32, or in float16 arithmetic (each result
    rounded to float16, carried as float32)."""
    if half:
        @jit(device=True)
        def multiplier_half(xs, ws, ys):
            product = np.float32(np.float16(np.float32(xs) * np.float32(ws)))
            return np.float32(np.float16(product / np.float32(ys)))

        return multiplier_half

    @jit(device=True)
    def multiplier(xs, ws, ys):
        return np.float32(np.float32(xs) * np.float32(ws)) / np.float32(ys)

    return multiplier


@functools.lru_cache(maxsize=None)
def requantizer(scale_dtype, out_dtype):
    """``requant(acc, i, ops)`` with ``ops = (table, x_scale, w_scale, y_scale, y_zero_point,
    bias)``: output element ``i``'s int32 accumulator requantized to ``out_dtype``."""
    multiplier = _multiplier(np.dtype(scale_dtype) == np.float16)
    round_even = rint(np.float64)
    out = np.dtype(out_dtype).type
    low, high = limits(out_dtype)
    lo, hi = float64(low), float64(high)

    @jit(device=True)
    def requant(acc, i, ops):
        table = ops[0]
        channel = (i // table[R_DIV]) % table[R_MOD]
        total = acc
        if table[R_BIAS] != 0:
            total = int32(acc + ops[5][channel])
        scaled = float64(total) * float64(multiplier(ops[1][0], ops[2][channel * table[R_STEP]], ops[3][0]))
        v = round_even(scaled + float64(ops[4][0]))
        if v < lo:
            return out(low)
        if v > hi:
            return out(high)
        return out(v)

    return requant


@functools.lru_cache(maxsize=None)
def composed(requant, outer_fn):
    """The inner kernels' epilogue function: requantize, then the fused chain's function."""

    @jit(device=True)
    def requantized(value, i, ops):
        return outer_fn(requant(value, i, ops[0]), i, ops[1])

    return requantized


@dataclass(frozen=True, eq=False)
class Requantizing(Epilogue):
    """The epilogue a QLinear op hands its integer anchor's tactics. The inner tactic's ins
    are ``own`` (its ``first`` inputs), then the five requantizing arrays (x_scale,
    w_scale, y_scale, y_zero_point, bias), then the QLinear node's ins as the engine gave
    them, from which ``outer`` (the fused chain's epilogue) takes its operands."""

    outer: Epilogue | None = None
    requant_table: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int64))

    def arguments(self, ins):
        start = self.first
        mine = (to_device(self.requant_table),) + tuple(flat(ins[start + k]) for k in range(5))
        return (mine, self.outer.arguments(ins[start + 5:]))

    def vector_ready(self, ins, out) -> bool:
        return False


def requantizing(outer: Epilogue, first: int, scale_dtype, out_dtype, table) -> Requantizing:
    fn = composed(requantizer(np.dtype(scale_dtype), np.dtype(out_dtype)), outer.fn)
    return Requantizing(fn, first, label=f"requantize+{outer.label}" if outer.label else "requantize", outer=outer,
                        requant_table=np.asarray(table, np.int64))


def remapped_launches(inner, own, requant_inputs, dummy_bias):
    """``launches`` of a QLinear tactic running ``inner`` (a ConvInteger or MatMulInteger
    tactic made with a :class:`Requantizing` epilogue): ``own`` and ``requant_inputs`` are
    indices into the QLinear node's ins (``None``: omitted; the bias index may be ``None``,
    then ``dummy_bias`` stands in)."""

    def launches(ins, outs, workspace):
        def pick(k):
            return ins[k] if k is not None and k < len(ins) else None

        bias = pick(requant_inputs[4])
        extra = [pick(k) for k in requant_inputs[:4]] + [bias if bias is not None else to_device(dummy_bias)]
        return inner.launches([pick(k) for k in own] + extra + list(ins), outs, workspace)

    return launches
