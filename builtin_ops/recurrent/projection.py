"""The kernels around the time steps: the input projection of every time at once, and the
copies that load the initial state and store the final one.

The projection ``proj[d, t, b, :] = X[t, b, :] W[d]^T + Wb[d]`` (``[dirs, seq, batch,
gates * hidden]`` in the accumulator type, in the workspace) is the part of a recurrent
layer that does not depend on the previous step: one launch computes it for every time,
one thread per output element, before the steps run.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import cuda, jit

from .cell_steps import unit_of


@functools.lru_cache(maxsize=None)
def projection_kernel(acc_name: str, has_bias: bool):
    """``kernel(x, w, bias, proj, x_st, x_sb, dirs, steps, batch, size, gh)``: X's time ``t``,
    batch entry ``b`` at ``x[t * x_st + b * x_sb + 0 .. size - 1]`` (either layout);
    ``gh`` = gates x hidden."""
    A = np.dtype(acc_name).type

    @jit
    def kernel(x, w, bias, proj, x_st, x_sb, dirs, steps, batch, size, gh):
        for e in range(cuda.grid(1), dirs * steps * batch * gh, cuda.gridsize(1)):
            col = e % gh
            rest = e // gh
            b = rest % batch
            rest //= batch
            t = rest % steps
            d = rest // steps
            total = A(0)
            if has_bias:
                total = A(bias[2 * d * gh + col])
            x_at, w_at = t * x_st + b * x_sb, (d * gh + col) * size
            for k in range(size):
                total += A(x[x_at + k]) * A(w[w_at + k])
            proj[e] = total

    return kernel


@jit
def copy_state(src, src_at, src_sd, src_sb, dst, dst_at, dst_sd, dst_sb, dirs, batch, hidden):
    """``dst[dst_at + d * dst_sd + b * dst_sb + j] = src[src_at + d * src_sd + b * src_sb + j]``
    for every ``(d, b, j)``: a state between a ``[dirs, batch, hidden]`` or ``[batch, dirs,
    hidden]`` tensor and the workspace, converting the dtype in the store."""
    for i in range(cuda.grid(1), dirs * batch * hidden, cuda.gridsize(1)):
        d, b, j = unit_of(i, batch, hidden)
        dst[dst_at + d * dst_sd + b * dst_sb + j] = src[src_at + d * src_sd + b * src_sb + j]


@jit
def zero_state(dst, count):
    """``dst[0 .. count - 1] = 0``: the initial state of a node without one."""
    for i in range(cuda.grid(1), count, cuda.gridsize(1)):
        dst[i] = 0
