"""Attention subgraphs as exporters write them (torch.onnx for GPT-2, LLaMA, T5, Swin and
``scaled_dot_product_attention``), built small with onnx.helper for the fusion tests.

Each builder takes the projections' outputs as graph inputs (``xq``, ``xk``, ``xv``:
``[B, S, hidden]``) and ends in the head merge (``y``: ``[B, S, H * D]``), unless it says
otherwise; ``dynamic`` names the batch and sequence dims instead of fixing them.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

B, S, H, D = 2, 5, 4, 4
FMIN = float(np.finfo(np.float32).min)


class Graph:
    """A small ONNX graph under construction."""

    def __init__(self):
        self.nodes, self.inits, self.inputs = [], [], []

    def input(self, name, shape, dtype=TensorProto.FLOAT):
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def const(self, name, value, dtype=np.float32):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type, *inputs, **attrs):
        out = f"{op_type.lower()}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"/{op_type}_{len(self.nodes)}",
                                           **attrs))
        return out

    def model(self, output="y", shape=None):
        self.nodes[-1].output[0] = output
        out = helper.make_tensor_value_info(output, TensorProto.FLOAT, shape) if shape else \
            helper.make_empty_tensor_value_info(output)
        graph = helper.make_graph(self.nodes, "attention", self.inputs, [out], initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)

    # ------------------------------------------------------------------ export idioms

    def dim(self, x, axis):
        """``x.size(axis)`` as a 1-element int64 tensor (Shape, Gather, Unsqueeze)."""
        shape = self.op("Shape", x)
        picked = self.op("Gather", shape, self.const(f"axis{len(self.nodes)}", axis, np.int64), axis=0)
        return self.op("Unsqueeze", picked, self.const(f"zero{len(self.nodes)}", [0], np.int64))

    def split_heads(self, x, heads, head, perm=(0, 2, 1, 3)):
        """``x.view(B, S, heads, head).permute(perm)``, the view's batch and sequence read
        from ``x``'s shape (as exports write it)."""
        target = self.op("Concat", self.dim(x, 0), self.dim(x, 1), self.const(f"tail{len(self.nodes)}",
                                                                              [heads, head], np.int64), axis=0)
        return self.op("Transpose", self.op("Reshape", x, target), perm=list(perm))

    def merge_heads(self, context, hidden):
        merged = self.op("Transpose", context, perm=[0, 2, 1, 3])
        target = self.op("Concat", self.dim(merged, 0), self.dim(merged, 1),
                         self.const(f"hidden{len(self.nodes)}", [hidden], np.int64), axis=0)
        return self.op("Reshape", merged, target)

    def repeat_kv(self, x, kv_heads, n_rep):
        """HF's ``repeat_kv``: ``x[:, :, None].expand(B, Hk, n, S, D).reshape(B, Hk * n, S, D)``."""
        wide = self.op("Unsqueeze", x, self.const(f"ax{len(self.nodes)}", [2], np.int64))
        size = self.op("Concat", self.dim(x, 0), self.const(f"kv{len(self.nodes)}", [kv_heads, n_rep], np.int64),
                       self.dim(x, 2), self.const(f"d{len(self.nodes)}", [D], np.int64), axis=0)
        target = self.op("Concat", self.dim(x, 0), self.const(f"h{len(self.nodes)}", [kv_heads * n_rep], np.int64),
                         self.dim(x, 2), self.const(f"d{len(self.nodes)}", [D], np.int64), axis=0)
        return self.op("Reshape", self.op("Expand", wide, size), target)


def _dims(dynamic):
    return ("batch", "seq") if dynamic else (B, S)


def gpt2(dynamic=False, buffer=None, fill=FMIN):
    """GPT-2's eager attention: scores / sqrt(D); ``Where(bias[:, :, Sk - Sq : Sk, :Sk], scores,
    finfo.min)`` of the uint8 ``bias`` buffer (cast to bool); ``+ attention_mask``."""
    g, (b, s) = Graph(), _dims(dynamic)
    q, k, v = (g.split_heads(g.input(n, (b, s, H * D)), H, D) for n in ("xq", "xk", "xv"))
    scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), g.const("root", np.sqrt(D)))
    buffer = np.tril(np.ones((8, 8), np.uint8)).reshape(1, 1, 8, 8) if buffer is None else buffer
    sq, sk = g.dim(q, 2), g.dim(k, 2)
    rows = g.op("Slice", g.const("bias", buffer, np.uint8), g.op("Sub", sk, sq), sk,
                g.const("axis2", [2], np.int64), g.const("step", [1], np.int64))
    causal = g.op("Cast", g.op("Slice", rows, g.const("start0", [0], np.int64), sk, g.const("axis3", [3], np.int64)),
                  to=TensorProto.BOOL)
    masked = g.op("Where", causal, scores, g.const("fill", fill))
    logits = g.op("Add", masked, g.input("attention_mask", (b, 1, 1, s)))
    g.merge_heads(g.op("MatMul", g.op("Softmax", logits, axis=-1), v), H * D)
    return g.model()


def sdpa(dynamic=False, upper=0, diagonal=None, guard=False):
    """torch.onnx's ``scaled_dot_product_attention(q, k, v, is_causal=True)``: sqrt(scale) on
    Q and on K^T, the mask built from ``Trilu(Expand(1, [L, S]))``, ``Where(Equal(m, 0), -inf, 0)``
    added, and (HF's SDPA export) the NaN guard."""
    g, (b, s) = Graph(), _dims(dynamic)
    q, k, v = (g.split_heads(g.input(n, (b, s, H * D)), H, D) for n in ("xq", "xk", "xv"))
    root = g.const("sqrt_scale", np.sqrt(1 / np.sqrt(D)))
    kt = g.op("Mul", g.op("Transpose", k, perm=[0, 1, 3, 2]), root)
    scores = g.op("MatMul", g.op("Mul", q, root), kt)
    size = g.op("Concat", g.dim(q, 2), g.dim(k, 2), axis=0)
    ones = g.op("Expand", g.const("one", [1.0]), size)
    tril = g.op("Trilu", ones, *([g.const("diag", diagonal, np.int64)] if diagonal is not None else []), upper=upper)
    mask = g.op("Where", g.op("Equal", tril, g.const("zero", 0.0)), g.const("minus_inf", -np.inf), g.const("z", 0.0))
    probs = g.op("Softmax", g.op("Add", scores, mask), axis=-1)
    if guard:
        probs = g.op("Where", g.op("IsNaN", probs), g.const("nan_fill", 0.0), probs)
    g.merge_heads(g.op("MatMul", probs, v), H * D)
    return g.model()


def llama(kv_heads=2, mask="constant", repeat="expand"):
    """A LLaMA decoder's eager attention: K and V with ``kv_heads`` heads, a stand-in for the
    rotary embedding on Q and K (a Mul by a [1, 1, S, D] table), ``repeat_kv``, the scores
    times 1/sqrt(D), an additive causal mask (``constant`` [1, 1, S, S] of 0 and finfo.min,
    or ``computed`` as ``triu(full(min), 1)``), the heads merged. ``repeat="tile"`` repeats
    K/V by Tile (head ``h`` reads ``h % kv_heads``: no grouped heads)."""
    g, n_rep = Graph(), H // kv_heads
    rotary = g.const("rotary", np.linspace(0.5, 1.5, S * D).reshape(1, 1, S, D))
    q = g.op("Mul", g.split_heads(g.input("xq", (B, S, H * D)), H, D), rotary)
    k = g.op("Mul", g.split_heads(g.input("xk", (B, S, kv_heads * D)), kv_heads, D), rotary)
    v = g.split_heads(g.input("xv", (B, S, kv_heads * D)), kv_heads, D)
    if repeat == "tile":
        k, v = (g.op("Tile", x, g.const(f"reps{i}", [1, n_rep, 1, 1], np.int64)) for i, x in enumerate((k, v)))
    else:
        k, v = g.repeat_kv(k, kv_heads, n_rep), g.repeat_kv(v, kv_heads, n_rep)
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])), g.const("inv", 1 / np.sqrt(D)))
    if mask == "constant":
        causal = g.const("causal_mask", np.triu(np.full((S, S), FMIN), 1).reshape(1, 1, S, S))
    else:
        full = g.op("Expand", g.const("min", [FMIN]), g.op("Concat", g.dim(q, 2), g.dim(k, 2), axis=0))
        causal = g.op("Expand", g.op("Trilu", full, g.const("one", 1, np.int64), upper=1),
                      g.const("lead", [B, 1, S, S], np.int64))
    probs = g.op("Softmax", g.op("Add", scores, causal), axis=-1)
    g.merge_heads(g.op("MatMul", probs, v), H * D)
    return g.model()


def t5(two_adds=True, bias_input=False):
    """T5's attention: no scale; a relative position bias [1, H, S, S] (a weight, or an input)
    and the extended padding mask [B, 1, 1, S] added to the scores: one after the other
    (``two_adds``) or summed first (as T5 passes ``position_bias + mask``)."""
    g = Graph()
    q, k, v = (g.split_heads(g.input(n, (B, S, H * D)), H, D) for n in ("xq", "xk", "xv"))
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    bias = g.input("position_bias", (1, H, S, S)) if bias_input else \
        g.const("position_bias", np.random.default_rng(7).standard_normal((1, H, S, S)))
    mask = g.input("mask", (B, 1, 1, S))
    if two_adds:
        logits = g.op("Add", g.op("Add", scores, bias), mask)
    else:
        logits = g.op("Add", scores, g.op("Add", bias, mask))
    g.merge_heads(g.op("MatMul", g.op("Softmax", logits, axis=-1), v), H * D)
    return g.model()


def swin(windows=2, window_mask="constant"):
    """Swin's window attention over ``B = 2 * windows`` windows of N = S tokens: ``q * scale``,
    ``+ relative_position_bias`` [1, H, N, N], the shifted-window mask [1, nW, 1, N, N] added
    under ``view(B / nW, nW, H, N, N)``, ``view(-1, H, N, N)``, softmax, ``@ v``; q, k, v
    given as ``[B, N, H, D]``. ``window_mask``: ``constant``, ``input`` (a graph input, as
    computed at run time) or ``per_image`` (an input that varies over the images too)."""
    g, batch = Graph(), 2 * windows
    q, k, v = (g.op("Transpose", g.input(n, (batch, S, H, D)), perm=[0, 2, 1, 3]) for n in ("q", "k", "v"))
    scores = g.op("MatMul", g.op("Mul", q, g.const("scale", D ** -0.5)), g.op("Transpose", k, perm=[0, 1, 3, 2]))
    rng = np.random.default_rng(11)
    biased = g.op("Add", scores, g.const("relative_bias", rng.standard_normal((1, H, S, S))))
    split = g.op("Reshape", biased, g.const("split", [batch // windows, windows, H, S, S], np.int64))
    shifted = np.where(rng.random((1, windows, 1, S, S)) < 0.3, -100.0, 0.0)
    if window_mask == "constant":
        shifted_mask = g.const("window_mask", shifted)
    else:  # computed at run time (torchvision builds it with ScatterND from the shapes)
        lead = 1 if window_mask == "input" else batch // windows
        shifted_mask = g.input("window_mask", (lead, windows, 1, S, S))
    merged = g.op("Reshape", g.op("Add", split, shifted_mask), g.const("merge", [-1, H, S, S], np.int64))
    g.op("MatMul", g.op("Softmax", merged, axis=-1), v)
    return g.model()


def scaled(q_op=None, k_op=None, k_before_transpose=False, scores_op=None, factor=0.5):
    """Plain attention with the scale wherever exports put it: ``q_op``/``k_op``/``scores_op``
    each ``"Mul"`` (by ``factor``), ``"Div"`` (by ``1 / factor``) or ``None``; K's before or
    after its transpose."""
    g = Graph()
    q, k, v = (g.split_heads(g.input(n, (B, S, H * D)), H, D) for n in ("xq", "xk", "xv"))

    def scale(x, how, tag):
        if how is None:
            return x
        return g.op(how, x, g.const(tag, factor if how == "Mul" else 1 / factor))

    k = scale(k, k_op if k_before_transpose else None, "k_in")
    kt = scale(g.op("Transpose", k, perm=[0, 1, 3, 2]), None if k_before_transpose else k_op, "k_out")
    scores = scale(g.op("MatMul", scale(q, q_op, "q_scale"), kt), scores_op, "s_scale")
    g.merge_heads(g.op("MatMul", g.op("Softmax", scores, axis=-1), v), H * D)
    return g.model()
