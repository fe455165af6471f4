"""plugrt-contrib-attention: fused multi-head attention for plugrt.

Provides the op ``plugrt.contrib::MultiHeadAttention`` (:mod:`.op`; its kernels in
:mod:`.simt` and :mod:`.tensor_cores`, ordered in :mod:`.tactics`) and the graph pass
``fuse_attention`` (:mod:`.fuse`), which replaces the
attention subgraph of exported transformers by it. Installed, it is found through the
entry point group ``plugrt.plugins``; build without the pass with
``plugrt build --disable-pass contrib-attention:fuse_attention``.
"""

from __future__ import annotations

from plugrt import hookimpl
from plugrt.plugin import GraphPass

from plugrt_contrib_attention import fuse
from plugrt_contrib_attention.op import MultiHeadAttention

__version__ = "0.1.0"
version = __version__
#: The plugrt plugin API versions this package supports (inclusive).
PLUGRT_API = (1, 1)


@hookimpl
def plugrt_ops():
    return [MultiHeadAttention()]


@hookimpl
def plugrt_passes():
    return [GraphPass(fuse.NAME, fuse.run, description="MatMul-Softmax-MatMul attention -> MultiHeadAttention")]
