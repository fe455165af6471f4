"""Matrix products: MatMul, Gemm and MatMulInteger.

- :mod:`.ops`: the op plugins;
- :mod:`.plan`: how a product is described on the host (the ``meta``/``offs`` every kernel
  reads), the element types and the store's value function;
- :mod:`.tactics`: which kernels serve a product, and in which order (the one module the op
  plugins reach the GEMM kernels through);
- kernels: :mod:`.tiled` (every dtype: the shared-memory tiled kernel and the direct one),
  and for big float32 products :mod:`.simt` (SIMT SGEMM, with the staging and split-K
  pieces the others share), :mod:`.tf32` (``mma.sync`` tensor cores; its warp step, copies
  and inline PTX in :mod:`.mma_sync`) and :mod:`.wgmma` (Hopper's warpgroup MMA; inline
  PTX in :mod:`.wgmma_intrinsics`).
"""

from plugrt import hookimpl

from . import ops

#: Every op of the family, in the order they register.
OPS = ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]
