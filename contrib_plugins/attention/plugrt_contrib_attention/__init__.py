"""plugrt-contrib-attention: fused multi-head attention for plugrt.

Provides the op ``plugrt.contrib::MultiHeadAttention`` (:mod:`.op`; its kernels in
:mod:`.simt` and :mod:`.tensor_cores`, ordered in :mod:`.tactics`), the standard ONNX
``Attention`` (opset 23 on, what PyTorch exports SDPA as there) on the same kernels
(:mod:`.standard`), and the graph pass
``fuse_attention`` (:mod:`.fuse`), which replaces the
attention subgraph of exported transformers by it, and then ``pack_projections``
(:mod:`.pack`), which makes its Q, K and V projections of one input one GEMM that it reads
in place; between them ``read_seq_first`` (:mod:`.seq_first`) does that for
``torch.nn.MultiheadAttention``'s sequence-first packed projection and takes its layout ops
around the attention away. Installed, it is found through the entry point group ``plugrt.plugins``; build
without a pass with ``plugrt build --disable-pass contrib-attention:fuse_attention``
(or ``:pack_projections``).
"""

from __future__ import annotations

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from plugrt_contrib_attention import fuse, pack, seq_first
from plugrt_contrib_attention.op import MultiHeadAttention
from plugrt_contrib_attention.standard import StandardAttention

__version__ = "0.1.0"
version = __version__
#: The plugrt plugin API versions this package supports (inclusive).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [MultiHeadAttention(), StandardAttention()]


#: Fusion-stage priorities: the sequence-first rewrite and packing read what the attention
#: fusion made.
FUSE_PRIORITY, SEQ_FIRST_PRIORITY, PACK_PRIORITY = 100, 105, 110


@hookimpl
def plugrt_passes():
    return [GraphPass(fuse.NAME, fuse.run, priority=FUSE_PRIORITY,
                      description="MatMul-Softmax-MatMul attention -> MultiHeadAttention"),
            GraphPass(seq_first.NAME, seq_first.run, priority=SEQ_FIRST_PRIORITY,
                      description="nn.MultiheadAttention's sequence-first projections -> batch-first, read in place"),
            GraphPass(pack.NAME, pack.run, priority=PACK_PRIORITY,
                      description="Q/K/V projections of one input -> one GEMM the attention reads in place")]
