"""The row-statistics kernel of the normalization ops, and the row view it reads X
through (the per-channel kernels, BatchNormalization's affine and LRN's channel window,
are in :mod:`.channel_norm`).

Every row normalization (LayerNorm, InstanceNorm, GroupNorm, MVN, BatchNorm's training
mode, RMSNorm) is the same computation on a *view* of X: the view's axes split into kept
axes (one row per index) and reduced axes (the row's columns). Element ``(r, c)`` of X lies
at ``row_offset[r] + col_offset[c]``; when the reduced axes are the view's trailing axes
that is just ``r * cols + c``, otherwise host-made offset tables give it (so any axes set
works). Scale and bias are indexed the same way from their broadcast strides in the view,
with fast paths for the common cases (per column, per row modulo a period).

One block handles ``by`` rows at once with ``bx`` threads per row (a 2-D block): short
rows such as a transformer's hidden size share a block instead of idling 224 of 256
threads. Statistics accumulate in float32 (float64 for float64 data) as sums of
``x - x[row, 0]`` and its square: shifting by a sample of the row keeps the one-pass
variance free of the cancellation ``E[x^2] - E[x]^2`` suffers when the mean is large.
An uncentered kernel (RMSNorm) sums plain squares: ``E[x^2]`` is what it wants. Y may have
another dtype than X (RMSNormalization's takes the scale's); the store converts.
Contiguous float16/float32 rows of a multiple of 8 columns have a faster kernel,
:mod:`.row_norm_vector`, which falls back to this one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import types

from plugrt.kernels import c_strides, cuda, flat, jit, simulated, to_device
from plugrt.plugin import Launch, Tactic

# How a scale or bias is indexed at element (r, c) of the row view.
ABSENT, PER_COL, PER_ROW, TABLE = 0, 1, 2, 3
# What the row kernel writes per row besides Y (the second statistic).
NO_STAT, INV_STD, VARIANCE = 0, 1, 2


def accumulator(dtype) -> np.dtype:
    """The dtype statistics and arithmetic use: float64 for float64, else float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


# --------------------------------------------------------------------------- row view


def _offsets(dims, strides) -> np.ndarray:
    """Offsets of every index of ``dims`` (C order) under element ``strides`` (int64)."""
    offsets = np.zeros(1, dtype=np.int64)
    for size, stride in zip(dims, strides):
        steps = np.arange(int(size), dtype=np.int64) * np.int64(stride)
        offsets = (offsets[:, None] + steps[None, :]).reshape(-1)
    return offsets


@dataclass(frozen=True, eq=False)
class RowView:
    """X seen as rows (kept axes of ``shape``) by columns (``reduced`` axes)."""

    shape: tuple
    reduced: tuple

    @property
    def kept(self) -> tuple:
        return tuple(a for a in range(len(self.shape)) if a not in self.reduced)

    @property
    def rows(self) -> int:
        return int(np.prod([self.shape[a] for a in self.kept], dtype=np.int64))

    @property
    def cols(self) -> int:
        return int(np.prod([self.shape[a] for a in self.reduced], dtype=np.int64))

    @property
    def contiguous(self) -> bool:
        """True when the reduced axes are the trailing ones: row r starts at r * cols."""
        rank = len(self.shape)
        return tuple(sorted(self.reduced)) == tuple(range(rank - len(self.reduced), rank))

    def tables(self, strides) -> tuple[np.ndarray, np.ndarray]:
        """(row offsets, column offsets) of an array read with ``strides`` in this view."""
        strides = np.asarray(strides, dtype=np.int64)
        kept, reduced = self.kept, self.reduced
        return (_offsets([self.shape[a] for a in kept], strides[list(kept)]),
                _offsets([self.shape[a] for a in reduced], strides[list(reduced)]))

    def x_tables(self) -> tuple[np.ndarray, np.ndarray]:
        return self.tables(c_strides(self.shape) if self.shape else np.zeros(0, np.int64))


@dataclass(frozen=True, eq=False)
class ParamIndex:
    """How the row kernel finds a scale or bias value: a mode and its int64 tables."""

    mode: int
    period: int = 1
    row_table: np.ndarray | None = None
    col_table: np.ndarray | None = None


def param_index(view: RowView, strides) -> ParamIndex:
    """Classify a parameter read with ``strides`` (0 on broadcast axes) over ``view``."""
    rows_t, cols_t = view.tables(strides)
    if not cols_t.any():
        if not rows_t.any():
            return ParamIndex(PER_ROW, 1)
        period = int(rows_t.max()) + 1
        if np.array_equal(rows_t, np.arange(rows_t.size, dtype=np.int64) % period):
            return ParamIndex(PER_ROW, period)
    if not rows_t.any() and np.array_equal(cols_t, np.arange(cols_t.size, dtype=np.int64)):
        return ParamIndex(PER_COL)
    return ParamIndex(TABLE, 1, rows_t, cols_t)


# --------------------------------------------------------------------------- row kernel


@functools.lru_cache(maxsize=None)
def row_norm_kernel(acc_name: str, x_table: bool, scale_mode: int, bias_mode: int,
                    write_mean: bool, second_stat: int, bx: int, by: int, centered: bool = True):
    """``y = (x - mean) / (sqrt(var + eps_in) + eps_out) * scale + bias`` per row; not
    ``centered``: ``y = x / sqrt(mean(x^2) + eps_in) * scale + bias`` (mean 0, var E[x^2]).

    A block of ``(bx, by)`` threads (``bx`` a power of two) works on rows
    ``blockIdx.x * by + threadIdx.y``, stepping by ``gridDim.x * by``; ``threadIdx.x``
    strides the row's columns by ``bx``. Optional per-row outputs: the mean (``st1``)
    and the inverse standard deviation or the variance (``st2``).
    """
    acc = np.dtype(acc_name).type
    shared_type = types.float64 if acc is np.float64 else types.float32
    threads = bx * by
    zero, one, nan = acc(0), acc(1), acc(np.nan)

    write_stats = stats_writer(write_mean, second_stat)

    @jit
    def kernel(x, y, rows, cols, eps_in, eps_out, xrow, xcol,
               scale, s_period, srow, scol, bias, b_period, brow, bcol, st1, st2):
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        sum1 = cuda.shared.array(threads, shared_type)
        sum2 = cuda.shared.array(threads, shared_type)
        lead = ty * bx
        slot = lead + tx
        for first in range(cuda.blockIdx.x * by, rows, cuda.gridDim.x * by):
            r = first + ty
            valid = r < rows
            base = r * cols
            if x_table and valid:
                base = xrow[r]
            shift = zero
            if centered and valid and cols > 0:
                if x_table:
                    shift = acc(x[base + xcol[0]])
                else:
                    shift = acc(x[base])
            a1 = zero
            a2 = zero
            if valid:
                for c in range(tx, cols, bx):
                    i = base + c
                    if x_table:
                        i = base + xcol[c]
                    d = acc(x[i]) - shift
                    a1 += d
                    a2 += d * d
            sum1[slot] = a1
            sum2[slot] = a2
            cuda.syncthreads()
            step = bx // 2
            while step > 0:
                if tx < step:
                    sum1[slot] += sum1[slot + step]
                    sum2[slot] += sum2[slot + step]
                cuda.syncthreads()
                step //= 2
            t1 = acc(sum1[lead])
            t2 = acc(sum2[lead])
            cuda.syncthreads()  # the next rows overwrite the sums

            mean = nan
            var = nan
            inv = nan
            if cols > 0:
                n = acc(cols)
                if centered:
                    offset = t1 / n
                    mean = shift + offset
                    var = t2 / n - offset * offset
                    if var < zero:
                        var = zero
                else:
                    mean = zero
                    var = t2 / n
                inv = one / (math.sqrt(var + eps_in) + eps_out)
            if valid:
                s_row = one
                b_row = zero
                if scale_mode == PER_ROW and cols > 0:
                    s_row = acc(scale[r % s_period])
                if bias_mode == PER_ROW and cols > 0:
                    b_row = acc(bias[r % b_period])
                for c in range(tx, cols, bx):
                    i = base + c
                    if x_table:
                        i = base + xcol[c]
                    v = (acc(x[i]) - mean) * inv
                    if scale_mode == PER_COL:
                        v = v * acc(scale[c])
                    elif scale_mode == PER_ROW:
                        v = v * s_row
                    elif scale_mode == TABLE:
                        v = v * acc(scale[srow[r] + scol[c]])
                    if bias_mode == PER_COL:
                        v = v + acc(bias[c])
                    elif bias_mode == PER_ROW:
                        v = v + b_row
                    elif bias_mode == TABLE:
                        v = v + acc(bias[brow[r] + bcol[c]])
                    y[i] = v
                if tx == 0:
                    write_stats(st1, st2, r, mean, inv, var)

    return kernel


@functools.lru_cache(maxsize=None)
def stats_writer(write_mean: bool, second_stat: int):
    """``write(st1, st2, r, mean, inv, var)``: row ``r``'s statistics the op outputs besides
    Y (the mean when ``write_mean``; :data:`INV_STD` or :data:`VARIANCE` as ``second_stat``)."""

    @jit(device=True)
    def write(st1, st2, r, mean, inv, var):
        if write_mean:
            st1[r] = mean
        if second_stat == INV_STD:
            st2[r] = inv
        elif second_stat == VARIANCE:
            st2[r] = var

    return write


def _pow2_at_least(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def row_geometries(rows: int, cols: int) -> list[tuple[int, int]]:
    """GPU block shapes ``(bx, by)`` for the row kernel, best first.

    About four columns per thread, 32 to 256 threads per row, and rows stacked until a
    block has 256 threads; then the plain one-row 256-thread block as an alternative.
    Blocks stay at 256 threads: the kernel takes 70-125 registers a thread (ptxas, sm_90),
    too many for 1024-thread blocks.
    """
    bx = min(256, max(32, _pow2_at_least(-(-max(cols, 1) // 4))))
    by = min(max(1, 256 // bx), _pow2_at_least(max(rows, 1)))
    best = (bx, by)
    return [best] if best == (256, 1) else [best, (256, 1)]


def _launch_shape(rows: int, bx: int, by: int) -> tuple[int, int, int]:
    """(grid, bx, by) actually launched: a few threads under the simulator."""
    if simulated():
        bx, by = (4, 2) if by > 1 else (8, 1)
        return min(-(-rows // by), 2), bx, by
    return min(-(-rows // by), 65535), bx, by


@dataclass(frozen=True, eq=False)
class RowNorm:
    """One row normalization node, ready to make tactics.

    ``x``, ``scale``, ``bias`` are input positions (``None``: absent); ``mean_out`` and
    ``stat_out`` output positions of the per-row statistics (``None``: not written);
    ``centered=False`` normalizes by the root mean square (RMSNorm); ``y_dtype`` is Y's
    dtype where it is not X's (RMSNormalization's takes the scale's).
    """

    view: RowView
    dtype: np.dtype
    eps_in: float
    eps_out: float = 0.0
    x: int = 0
    scale: int | None = None
    scale_index: ParamIndex = ParamIndex(ABSENT)
    bias: int | None = None
    bias_index: ParamIndex = ParamIndex(ABSENT)
    mean_out: int | None = None
    stat_out: int | None = None
    second_stat: int = NO_STAT
    centered: bool = True
    y_dtype: np.dtype | None = None

    def tactics(self) -> list[Tactic]:
        return [Tactic(f"rows{bx}x{by}", functools.partial(self.launches, bx=bx, by=by), {"block": [bx, by]})
                for bx, by in row_geometries(self.view.rows, self.view.cols)]

    def launches(self, ins, outs, workspace, *, bx: int, by: int, stats=None) -> list[Launch]:
        """The row kernel's launch; ``stats`` overrides the (mean, second) arrays."""
        view, acc = self.view, accumulator(self.dtype)
        rows, cols = view.rows, view.cols
        st1 = _present(outs, self.mean_out)
        st2 = _present(outs, self.stat_out)
        if stats is not None:
            st1, st2 = stats
        if rows == 0 or (cols == 0 and st1 is None and st2 is None):
            return []
        grid, lbx, lby = _launch_shape(rows, bx, by)
        kernel = row_norm_kernel(acc.name, not view.contiguous, self.scale_index.mode, self.bias_index.mode,
                                 st1 is not None, self.second_stat if st2 is not None else NO_STAT, lbx, lby,
                                 self.centered)
        dummy = to_device(np.zeros(1, dtype=acc))
        xrow, xcol = view.x_tables() if not view.contiguous else (_NO_TABLE, _NO_TABLE)
        x, y = flat(ins[self.x]), flat(outs[0])
        args = (x, y, np.int64(rows), np.int64(cols), acc.type(self.eps_in), acc.type(self.eps_out),
                _table(xrow), _table(xcol),
                *_param_args(ins, self.scale, self.scale_index, dummy),
                *_param_args(ins, self.bias, self.bias_index, dummy),
                flat(st1) if st1 is not None else dummy, flat(st2) if st2 is not None else dummy)
        return [Launch(kernel, grid, (lbx, lby), args)]


_NO_TABLE = np.zeros(1, dtype=np.int64)


def _table(table: np.ndarray):
    return to_device(table if table.size else _NO_TABLE)


def _present(arrays, index):
    if index is None or index >= len(arrays):
        return None
    return arrays[index]


def _param_args(ins, position, index: ParamIndex, dummy) -> tuple:
    array = _present(ins, position)
    if array is None or index.mode == ABSENT:
        return dummy, np.int64(1), _table(_NO_TABLE), _table(_NO_TABLE)
    rows_t = index.row_table if index.row_table is not None else _NO_TABLE
    cols_t = index.col_table if index.col_table is not None else _NO_TABLE
    return flat(array), np.int64(max(index.period, 1)), _table(rows_t), _table(cols_t)
