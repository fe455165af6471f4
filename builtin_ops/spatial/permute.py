"""The permuting gather of DepthToSpace and SpaceToDepth (a 6-D view transposed); Resize
(:mod:`.resize`) also copies a build-time constant output with it.

Pure data movement: the kernel copies elements of any dtype (bool included) and takes
every shape from small int64 device tables, so one compiled kernel serves all.
"""

from __future__ import annotations

import functools

import numpy as np

from plugrt.kernels import c_strides, cuda, flat, grid_1d, jit, to_device
from plugrt.plugin import Launch, Tactic


@functools.lru_cache(maxsize=None)
def permute_kernel():
    """``y[i] = x[sum_d coord_d(i) * strides[d]]`` for ``y``'s (up to 6-D) ``shape``."""

    @jit
    def kernel(y, x, n, ndim, shape, strides):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            r = i
            off = 0
            for d in range(ndim - 1, -1, -1):
                c = r % shape[d]
                r //= shape[d]
                off += c * strides[d]
            y[i] = x[off]

    return kernel


def block_permute_tactic(x_shape, view_shape, perm) -> Tactic:
    """DepthToSpace / SpaceToDepth as ``y = x.reshape(view_shape).transpose(perm)``, flat."""
    view_shape = tuple(int(d) for d in view_shape)
    out_view = np.asarray([view_shape[p] for p in perm], np.int64)
    strides = c_strides(view_shape)[list(perm)]
    n = int(np.prod(x_shape, dtype=np.int64))

    def launches(inputs, outputs, workspace):
        blocks, threads = grid_1d(n)
        args = (flat(outputs[0]), flat(inputs[0]), np.int64(n), np.int64(len(perm)), to_device(out_view),
                to_device(strides))
        return [Launch(permute_kernel(), blocks, threads, args)]

    return Tactic("permute", launches, {})
