"""INT8 where it is faster: ``place_qdq`` asks the build's timer (:attr:`Int8Request.timer
<plugrt.ir.graph.Int8Request.timer>`, a GPU build's) whether a layer's integer kernel beats
its float ones, and leaves it in float where it does not (TensorRT's implicit INT8 picks
each layer's precision by time; its users' first complaint is an INT8 engine slower than
FP16, with no word of why).

A layer's integer form (:data:`INTEGER_FORMS`: Conv -> ConvInteger, ConvNHWC ->
ConvIntegerNHWC, MatMul -> MatMulInteger, on the layer's own tensors read as int8) is
timed against the layer in FP32 and, in an FP16 build, FP16: the fastest tactic of each,
none with its epilogue (the integer one stores int32, more bytes than the INT8 or FP16 it
stores once fused, so a memory-bound layer is judged a little against INT8). A Gemm's
integer form reads a transposed copy of its weight, which no graph tensor holds: it is
not timed, and takes INT8 as in the simulator. The build report names every layer left
in float this way with both times.
"""

from __future__ import annotations

import logging

import numpy as np

from plugrt.passes.pattern import fresh_name, make_node
from plugrt_builtin_ops.conv.nhwc_ops import DOMAIN as CONV_DOMAIN

from .fuse_qdq import CONV_ATTRS, FLOATS
from .nhwc_ops import DOMAIN as QUANT_DOMAIN

log = logging.getLogger("plugrt.builder")

#: (domain, op type) of a float layer -> (domain, op type, opset) of its integer form.
INTEGER_FORMS = {("", "Conv"): ("", "ConvInteger", 10), (CONV_DOMAIN, "ConvNHWC"): (QUANT_DOMAIN, "ConvIntegerNHWC", 1),
                 ("", "MatMul"): ("", "MatMulInteger", 10)}


def slower_in_int8(graph, registry, node, request) -> str | None:
    """Why ``node`` should stay in float (its integer form measured slower), or None
    (faster, not timed, or no timer)."""
    form = INTEGER_FORMS.get((node.domain or "", node.op_type))
    if request.timer is None or form is None:
        return None
    domain, op_type, opset = form
    attrs = {k: v for k, v in node.attrs.items() if k in CONV_ATTRS} if "Conv" in op_type else {}
    integer = make_node(graph, registry, op_type, node.inputs[:2], [fresh_name(graph, f"{node.name}/int32")], attrs,
                        opset=opset, domain=domain, name=f"{node.name}/int8")
    if integer is None:
        return None
    int8_ms = request.timer(integer, {0: np.dtype(np.int8), 1: np.dtype(np.int8)})
    floats = [i for i, name in enumerate(node.inputs) if name and np.dtype(graph.info(name).dtype) in FLOATS]
    times = {"FP32": request.timer(node, {})}
    if request.fp16:
        times["FP16"] = request.timer(node, {i: np.dtype(np.float16) for i in floats})
    times = {label: ms for label, ms in times.items() if ms is not None}
    if int8_ms is None or not times:
        return None
    label = min(times, key=times.get)
    if int8_ms <= times[label]:
        log.info("%s: INT8 %.4f ms, %s %.4f ms: INT8", node.describe(), int8_ms, label, times[label])
        return None
    reason = f"INT8 measured slower than {label} ({int8_ms:.4f} ms against {times[label]:.4f} ms); it runs in float"
    log.warning("%s: %s", node.describe(), reason)
    return reason
