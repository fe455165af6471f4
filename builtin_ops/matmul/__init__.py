"""Matrix products: MatMul, Gemm, MatMulInteger and Einsum.

- :mod:`.ops`: the op plugins (MatMul, Gemm, MatMulInteger, ``com.microsoft::FusedMatMul``);
- :mod:`.einsum_ops`: the Einsum op plugin; its equation parsing, host tables and generic
  kernel (one thread per output, a loop over the contracted letters) in :mod:`.einsum`;
- :mod:`.fold_transposes`: the pass folding a last-two-dims Transpose into a product;
- :mod:`.plan`: how a product is described on the host (the ``meta``/``offs`` every kernel
  reads), the element types and the store's value function;
- :mod:`.tactics`: which kernels serve a product, and in which order (the one module the op
  plugins reach the GEMM kernels through);
- kernels: :mod:`.tiled` (every dtype: the shared-memory tiled kernel and the direct one),
  and for big float32 products :mod:`.simt` (SIMT SGEMM, with the staging and split-K
  pieces the others share), :mod:`.tf32` (``mma.sync`` tensor cores; its warp step, copies
  and inline PTX in :mod:`.mma_sync`) and :mod:`.wgmma` (Hopper's warpgroup MMA; inline
  PTX in :mod:`.wgmma_intrinsics`; FP16 operands in :mod:`.wgmma_f16`, MatMulInteger's
  8-bit ones in :mod:`.wgmma_int8`, whose int32 store and zero-point correction are
  :mod:`.integer_store`).
"""

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from . import einsum_ops, fold_transposes, ops

#: Every op of the family, in the order they register.
OPS = ops.OPS + einsum_ops.OPS

#: The plugrt plugin API versions this package is written for (see plugrt.registry).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [op() for op in OPS]


#: After the contrib plugins' fusion passes (priority 100): the attention plugin matches
#: MatMul(Q, Transpose(K)) itself.
PASS_PRIORITY = 200


@hookimpl
def plugrt_passes():
    return [GraphPass("fold_transposes", fold_transposes.run, priority=PASS_PRIORITY,
                      description="MatMul(A, Transpose(B)) swapping the last two dims -> FusedMatMul(transB)")]
