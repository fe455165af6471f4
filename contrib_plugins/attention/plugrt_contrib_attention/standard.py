"""The standard ONNX ``Attention`` (opset 23 on) run as ``MultiHeadAttention``.

``torch.onnx.export(..., opset_version=23)`` writes PyTorch's
``scaled_dot_product_attention`` as this op. With no plugin for it the importer expands it
into its ONNX function body (two MatMuls, a Softmax, and the body's glue for grouped heads,
the causal bias and fully masked rows), which runs, but as a dozen kernels that the fusion
pass does not recognize. This plugin takes the op itself:

- :class:`StandardAttention` owns ``Attention`` for what it implements: Q, K and V 4-D
  ``[B, H, S, D]``, or 3-D ``[B, S, H * D]`` with ``q_num_heads`` and ``kv_num_heads``;
  grouped K/V heads (query head ``h`` reads K/V head ``h // (H / Hk)``, as ONNX repeats
  them); an additive float mask or a boolean one (True: attend) broadcastable to
  ``[B, H, Sq, Sk]``; ``is_causal`` (aligned to the upper left, as ONNX does without a
  cache); ``scale`` (absent: ``1 / sqrt(D)``); a KV cache: ``past_key``/``past_value``
  ``[B, Hk, P, D]`` before this step's K and V, giving ``present_key``/``present_value``
  ``[B, Hk, P + S, D]`` (the causal mask then aligned to the lower right: query ``i`` sees
  keys up to ``P + i``). A query row that every key is masked from gives zeros, as ONNX
  says. A node using what it does not implement (``qk_matmul_output``,
  ``nonpad_kv_seqlen``, ``softcap``, sliding windows) is declined
  (:meth:`StandardAttention.declines`): the importer expands that node into its ONNX body
  as before.
- :func:`run`, the first step of the ``fuse_attention`` pass, replaces each such node
  without a cache by a ``MultiHeadAttention`` node (a boolean mask, or one of another float dtype, becomes the
  additive mask of Q's dtype through a ``Where`` or ``Cast`` node), so that the head split
  and merge around it are taken into the op's layout (:mod:`.heads`) and its projections
  packed (:mod:`.pack`). A node with a cache, or with that pass disabled, runs the same
  kernels itself: the present K and V written first (into the outputs, or its workspace
  where they are not asked for), a boolean mask converted in its workspace.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from plugrt.kernels import cuda, flat, grid_1d, jit
from plugrt.passes.pattern import finish, fresh_name, make_node, origin_of, replace_node
from plugrt.plugin import Attr, Example, Launch, OpPlugin, TensorInfo, dims, optional

from plugrt_contrib_attention.masks import Masking, mask_input
from plugrt_contrib_attention.op import DOMAIN, DTYPES, OP_TYPE, OPSET, MultiHeadAttention

#: Where a boolean or differently typed mask's additive copy starts after it in the workspace.
ALIGN = 256
BOOL = np.dtype(np.bool_)
MASK_DTYPES = frozenset({BOOL, np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})


def _present(names, index: int) -> bool:
    return len(names) > index and bool(names[index])


class StandardAttention(OpPlugin):
    """ONNX ``Attention`` (opsets 23 on) on the fused attention kernels (see the module doc)."""

    op_type = "Attention"
    domain = ""
    since_opset = 23
    inputs = (3, 7)
    outputs = (1, 4)
    attributes = (Attr("is_causal", "int", 0), Attr("q_num_heads", "int", 0), Attr("kv_num_heads", "int", 0),
                  Attr("scale", "float", None), Attr("softcap", "float", 0.0), Attr("softmax_precision", "int", None),
                  Attr("qk_matmul_output_mode", "int", 0), Attr("left_window_size", "int", -1),
                  Attr("right_window_size", "int", -1))
    dtypes = DTYPES | MASK_DTYPES

    def declines(self, node):
        if _present(node.inputs, 6):
            return "nonpad_kv_seqlen"
        if _present(node.outputs, 3):
            return "the qk_matmul_output output"
        if node.attrs.get("softcap"):
            return f"softcap={node.attrs['softcap']}"
        if node.attrs.get("left_window_size", -1) != -1 or node.attrs.get("right_window_size", -1) != -1:
            return "a sliding window"
        return None

    def check(self, node, inputs):
        why = self.declines(node)
        if why:
            raise self.unsupported(node, why, "export without it (the importer expands such a node into its "
                                   "ONNX function body when the model is imported)")
        q, k, v = inputs[:3]
        mask = optional(inputs, 3)
        if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
            raise self.unsupported(node, f"Q, K, V of dtypes {q.dtype}, {k.dtype}, {v.dtype}",
                                   "give Q, K and V one dtype, float16 or float32")
        if mask is not None and mask.dtype not in MASK_DTYPES:
            raise self.unsupported(node, f"a mask of dtype {mask.dtype}", "give a boolean or float mask")
        if q.rank not in (3, 4) or k.rank != q.rank or v.rank != q.rank:
            raise self.unsupported(node, f"Q, K, V of ranks {q.rank}, {k.rank}, {v.rank}",
                                   "give all three 4-D [B, H, S, D] or 3-D [B, S, H * D]")
        if q.rank == 3 and not (node.attrs.get("q_num_heads") and node.attrs.get("kv_num_heads")):
            raise self.unsupported(node, "3-D Q, K, V without q_num_heads and kv_num_heads",
                                   "say how many heads Q and K/V hold")
        past_k, past_v = optional(inputs, 4), optional(inputs, 5)
        if (past_k is None) != (past_v is None):
            raise self.unsupported(node, "past_key without past_value, or past_value without past_key",
                                   "give both, or neither")
        for name, info in (("past_key", past_k), ("past_value", past_v)):
            if info is not None and (info.rank != 4 or info.dtype != q.dtype):
                raise self.unsupported(node, f"{name} {info.dtype}{list(info.shape)}",
                                       f"give {name} [B, kv heads, past length, head size] of Q's dtype")

    def infer(self, node, inputs):
        mask = optional(inputs, 3)
        if not _cached(node):
            _check_mask(self, node, mask, _seq(inputs[1]))
            return MultiHeadAttention().infer(as_multi_head(node, inputs[0].rank), _mha_inputs(inputs))
        present_k, present_v = present_infos(node, inputs)
        _check_mask(self, node, mask, present_k.shape[2])
        if node.attrs.get("is_causal") and optional(inputs, 4) is not None:
            new, queries = _seq(inputs[1]), _seq(inputs[0])
            if isinstance(new, int) and isinstance(queries, int) and new != queries:
                raise self.unsupported(node, f"is_causal with a cache, {queries} queries over {new} new keys",
                                       "give as many queries as new keys (causal steps of one sequence)")
        y = MultiHeadAttention().infer(cached_multi_head(node, inputs),
                                       _mha_inputs([inputs[0], present_k, present_v] + list(inputs[3:4])))
        return y + [present_k, present_v]

    def reference(self, node, inputs):
        q, k, v = (np.asarray(x, dtype=np.float64) for x in inputs[:3])
        mask = optional(inputs, 3)
        three_d = q.ndim == 3
        if three_d:
            q = _heads_first(q, node.attrs["q_num_heads"])
            k = _heads_first(k, node.attrs["kv_num_heads"])
            v = _heads_first(v, node.attrs["kv_num_heads"])
        past = 0
        if optional(inputs, 4) is not None:
            past = inputs[4].shape[2]
            k = np.concatenate([np.asarray(inputs[4], np.float64), k], axis=2)
            v = np.concatenate([np.asarray(inputs[5], np.float64), v], axis=2)
        presents = [k.astype(inputs[1].dtype), v.astype(inputs[2].dtype)]
        heads, sq, sk = q.shape[1], q.shape[2], k.shape[2]
        k = np.repeat(k, heads // k.shape[1], axis=1)
        v = np.repeat(v, heads // v.shape[1], axis=1)
        scale = node.attrs.get("scale")
        scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
        bias = np.zeros((sq, sk))
        if node.attrs.get("is_causal"):  # (aligned to the cache's end: query i sees keys up to past + i)
            bias = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + past, 0.0, -np.inf)
        if mask is not None:
            mask = np.asarray(mask)
            bias = bias + (np.where(mask, 0.0, -np.inf) if mask.dtype == BOOL else mask.astype(np.float64))
        bias = np.broadcast_to(bias, scores.shape)
        scores = scores + bias
        with np.errstate(invalid="ignore"):
            peak = np.max(scores, axis=-1, keepdims=True)
            weights = np.exp(scores - np.where(np.isneginf(peak), 0.0, peak))
            total = np.sum(weights, axis=-1, keepdims=True)
            weights = weights / np.where(total == 0, 1.0, total)
        weights = np.where(np.isneginf(np.max(bias, axis=-1, keepdims=True)), 0.0, weights)  # fully masked rows
        out = np.matmul(weights, v)
        if three_d:
            out = np.swapaxes(out, 1, 2).reshape(out.shape[0], sq, -1)
        return [out.astype(inputs[0].dtype)] + presents

    def tactics(self, node, inputs, outputs, epilogue=None, wanted=None):
        mask = optional(inputs, 3)
        converted = mask is not None and mask.dtype != inputs[0].dtype
        if not _cached(node):
            found = MultiHeadAttention().tactics(as_multi_head(node, inputs[0].rank), _mha_inputs(inputs), outputs[:1],
                                                 wanted=wanted)
            return [_converting(tactic, mask, inputs[0].dtype) for tactic in found] if converted else found
        present_k, present_v = present_infos(node, inputs)
        found = MultiHeadAttention().tactics(cached_multi_head(node, inputs),
                                             _mha_inputs([inputs[0], present_k, present_v] + list(inputs[3:4])),
                                             outputs[:1], wanted=wanted)
        found = [_converting(tactic, mask, inputs[0].dtype) for tactic in found] if converted else found
        return [_caching(tactic, node, inputs, present_k, present_v) for tactic in found]

    def serialize(self, node):
        return {}

    def examples(self):
        f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
        tol = dict(rtol=1e-4, atol=1e-5)

        def qkv(dtype, b, h, hk, sq, sk, d, dv):
            return (TensorInfo(dtype, (b, h, sq, d)), TensorInfo(dtype, (b, hk, sk, d)),
                    TensorInfo(dtype, (b, hk, sk, dv)))

        keep = np.array([[True, True, False, True, True], [False] * 5, [True] * 5, [False, True, True, True, True]])
        return [
            Example(qkv(f32, 1, 1, 1, 3, 5, 4, 4), name="4-D, default scale", **tol),
            Example(qkv(f32, 1, 2, 1, 4, 4, 4, 4), {"is_causal": 1, "scale": 0.3},
                    name="is_causal with a scale, grouped K/V heads", **tol),
            Example((TensorInfo(f32, (1, 3, 8)), TensorInfo(f32, (1, 5, 4)), TensorInfo(f32, (1, 5, 6))),
                    {"q_num_heads": 2, "kv_num_heads": 1}, name="3-D, grouped heads, Dv != D", **tol),
            Example(qkv(f32, 1, 2, 2, 4, 5, 4, 4) + (keep,), name="boolean mask, a fully masked row", **tol),
            Example(qkv(f32, 2, 1, 1, 3, 4, 4, 4) + (TensorInfo(f32, (2, 1, 1, 4)),), {"is_causal": 1},
                    name="additive mask and causal", **tol),
            Example(qkv(f16, 1, 1, 1, 3, 4, 8, 8) + (TensorInfo(f32, (3, 4)),), name="float16, float32 mask",
                    rtol=1e-2, atol=1e-3),
            Example(qkv(f32, 1, 2, 1, 2, 2, 4, 4) + (None,) + (TensorInfo(f32, (1, 1, 3, 4)),) * 2,
                    {"is_causal": 1}, n_outputs=3, name="a KV cache, causal from the cache's end", **tol),
            Example((TensorInfo(f32, (1, 2, 8)), TensorInfo(f32, (1, 2, 4)), TensorInfo(f32, (1, 2, 4)), None,
                     TensorInfo(f32, (1, 1, 2, 4)), TensorInfo(f32, (1, 1, 2, 4))),
                    {"q_num_heads": 2, "kv_num_heads": 1}, n_outputs=3, name="3-D with a KV cache", **tol),
        ]


def as_multi_head(node, rank: int):
    """``node`` (Q of ``rank`` 3 or 4) as the ``MultiHeadAttention`` node computing the same
    (its inputs unchanged; a mask the caller has made additive in Q's dtype). The layout
    follows the rank: opsets 23 and 24 let a 4-D node name its head counts too."""
    three_d = rank == 3
    attrs = {"scale": node.attrs.get("scale"), "guard_nan": 1, "causal": 1 if node.attrs.get("is_causal") else 0,
             "causal_fill": None, "layout": "bsh,bsh,bsh,bsh" if three_d else "bhsd,bhsd,bhsd,bhsd",
             "num_heads": node.attrs.get("q_num_heads") or 0 if three_d else 0,
             "kv_num_heads": node.attrs.get("kv_num_heads") or 0 if three_d else 0,
             "mask_period": 0, "packed": None}
    return node.replace(op_type=OP_TYPE, domain=DOMAIN, opset=OPSET, attrs=attrs)


def _mha_inputs(inputs) -> list:
    """The inputs' infos as the fused op reads them: the mask additive, of Q's dtype."""
    mask = optional(inputs, 3)
    found = list(inputs[:3])
    if mask is not None:
        found.append(TensorInfo(inputs[0].dtype, mask.shape))
    return found


def _heads_first(x: np.ndarray, heads: int) -> np.ndarray:
    """``[B, S, H * D]`` as ``[B, H, S, D]``."""
    return np.swapaxes(x.reshape(x.shape[0], x.shape[1], heads, -1), 1, 2)


def _cached(node) -> bool:
    """A KV cache given, or the present K/V asked for."""
    return _present(node.inputs, 4) or _present(node.outputs, 1) or _present(node.outputs, 2)


def _check_mask(op, node, mask, keys) -> None:
    if mask is not None and mask.rank and isinstance(keys, int) and isinstance(mask.shape[-1], int) \
            and keys != mask.shape[-1]:
        raise op.unsupported(node, f"a mask of {mask.shape[-1]} keys for {keys} keys (ONNX pads a shorter mask "
                             "with -inf)", "give the mask one entry per key")


def _seq(info):
    """The sequence dim of Q, K or V: ``[B, H, S, D]`` or ``[B, S, H * D]``."""
    return info.shape[2] if info.rank == 4 else info.shape[1]


def present_infos(node, inputs) -> tuple[TensorInfo, TensorInfo]:
    """``present_key``, ``present_value``: ``[B, Hk, P + S, D]`` and ``[B, Hk, P + S, Dv]``."""
    found = []
    for x, cache in ((inputs[1], optional(inputs, 4)), (inputs[2], optional(inputs, 5))):
        if x.rank == 4:
            b, heads, seq, width = x.shape
        else:
            heads = node.attrs["kv_num_heads"]
            b, seq = x.shape[:2]
            width = x.shape[2] // heads if isinstance(x.shape[2], int) else f"{node.name}_head_{len(found)}"
        total = seq if cache is None else dims.add(cache.shape[2], seq)
        found.append(TensorInfo(x.dtype, (b, heads, total, width)))
    return found[0], found[1]


def cached_multi_head(node, inputs):
    """The ``MultiHeadAttention`` node over the present K and V (``bhsd``), Q and the
    output in Q's layout; causal from the cache's end (``causal=2``)."""
    mha = as_multi_head(node, inputs[0].rank)
    q_layout = "bsh" if inputs[0].rank == 3 else "bhsd"
    attrs = dict(mha.attrs, layout=f"{q_layout},bhsd,bhsd,{q_layout}", kv_num_heads=0)
    if attrs["causal"] and optional(inputs, 4) is not None:
        attrs["causal"] = 2
    return mha.replace(attrs=attrs)


# --------------------------------------------------------------------------- the graph pass


def run(graph, registry) -> int:
    """Replace each ``Attention`` node this plugin takes by a ``MultiHeadAttention`` node."""
    count = 0
    for node in [n for n in graph.nodes if n.op_type == "Attention" and not n.domain]:
        inputs = [graph.info(name) if name else None for name in node.inputs]
        if any(info is None for info in inputs[:3]) or _cached(node) or _refused(node, inputs):
            continue  # (a node with a cache runs as itself)
        mask = optional(inputs, 3)
        names = list(node.inputs[:3])
        if mask is not None:
            dtype, base, origin = inputs[0].dtype, node.name, [node]
            if mask.dtype == BOOL:
                masked = mask_input(graph, registry, Masking(wheres=[(node.inputs[3], True)]), dtype, base, origin)
            elif mask.dtype != dtype:
                masked = fresh_name(graph, f"{base}/mask_{dtype}")
                cast = make_node(graph, registry, "Cast", [node.inputs[3]], [masked], {"to": _onnx_type(dtype)},
                                 opset=graph.opsets.get("", 13), name=masked, origin=origin_of(origin))
                graph.add_node(cast)
            else:
                masked = node.inputs[3]
            names.append(masked)
        fused = as_multi_head(node, inputs[0].rank).replace(inputs=tuple(names), outputs=node.outputs[:1])
        replace_node(graph, node, fused)
        graph.opsets.setdefault(DOMAIN, OPSET)
        count += 1
    if count:
        finish(graph, registry)
    return count


def _refused(node, inputs) -> bool:
    op = StandardAttention()
    try:
        op.check(node, inputs)
        op.infer(node, inputs)
    except Exception:  # noqa: BLE001 - whatever the op refuses stays the op's, to report
        return True
    return False


def _onnx_type(dtype) -> int:
    import onnx.helper

    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


# --------------------------------------------------------------------------- a boolean mask, run by the op itself


@jit
def _additive_from_bool(mask, out, n, zero, minus_inf):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, step):
        out[i] = zero if mask[i] else minus_inf


@jit
def _additive_cast(mask, out, n, zero, minus_inf):
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, n, step):
        out[i] = mask[i]


def _converting(tactic, mask: TensorInfo, dtype):
    """``tactic`` reading a mask of another dtype: the additive mask of ``dtype`` is made in
    the front of its workspace first."""
    shape = tuple(int(d) for d in mask.shape)
    count = max(math.prod(shape), 1)
    room = -(-count * np.dtype(dtype).itemsize // ALIGN) * ALIGN
    kernel = _additive_from_bool if mask.dtype == BOOL else _additive_cast
    typed = np.dtype(dtype).type

    def launches(ins, outs, workspace):
        additive = workspace[:count * np.dtype(dtype).itemsize].view(dtype)
        blocks, threads = grid_1d(count)
        convert = Launch(kernel, blocks, threads, (flat(ins[3]), additive, np.int64(count), typed(0),
                                                   typed(-np.inf)))
        rest = workspace[room:] if tactic.workspace_bytes else None
        return [convert] + list(tactic.launches(list(ins[:3]) + [additive.reshape(shape)], outs, rest))

    return dataclasses.replace(tactic, launches=launches, workspace_bytes=room + tactic.workspace_bytes)


# --------------------------------------------------------------------------- the KV cache


@jit
def _append_kv(out, past, new, total, heads, length, past_length, width, s_b, s_h, s_s):
    """``out [B, H, length, width]``: the past rows, then the new ones (read through their
    strides: ``[B, H, S, D]`` or ``[B, S, H * D]``)."""
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, total, step):
        d = i % width
        rest = i // width
        t = rest % length
        rest //= length
        h = rest % heads
        b = rest // heads
        if t < past_length:
            out[i] = past[((b * heads + h) * past_length + t) * width + d]
        else:
            out[i] = new[b * s_b + h * s_h + (t - past_length) * s_s + d]


def _append_launch(out, past, new, shape, new_info, heads: int):
    """The launch filling ``out`` (present, ``shape``) from ``past`` (or nothing) and ``new``."""
    b, _, length, width = shape
    seq = int(_seq(new_info))
    strides = (heads * seq * width, seq * width, width) if new_info.rank == 4 else (seq * heads * width, width,
                                                                                      heads * width)
    total = b * heads * length * width
    blocks, threads = grid_1d(total)
    return Launch(_append_kv, blocks, threads, (flat(out), flat(past) if past is not None else flat(new), flat(new),
                                                np.int64(total), np.int64(heads), np.int64(length),
                                                np.int64(length - seq), np.int64(width), *map(np.int64, strides)))


def _caching(tactic, node, inputs, present_k: TensorInfo, present_v: TensorInfo):
    """``tactic`` (over the present K and V) after the launches writing them: into the node's
    outputs where asked for, else into the front of the workspace."""
    shapes = [tuple(int(d) for d in info.shape) for info in (present_k, present_v)]
    sizes = [math.prod(shape) * np.dtype(info.dtype).itemsize for shape, info in zip(shapes, (present_k, present_v))]
    asked = [_present(node.outputs, 1), _present(node.outputs, 2)]
    rooms = [0 if given else -(-size // ALIGN) * ALIGN for given, size in zip(asked, sizes)]

    def launches(ins, outs, workspace):
        at, presents, made = 0, [], []
        for index, (shape, info, room) in enumerate(zip(shapes, (present_k, present_v), rooms)):
            given = outs[1 + index] if len(outs) > 1 + index else None
            if given is None:
                given = workspace[at:at + math.prod(shape) * np.dtype(info.dtype).itemsize].view(info.dtype)
                at += room
            present = given.reshape(shape)
            presents.append(present)
            if math.prod(shape):
                made.append(_append_launch(present, optional(ins, 4 + index), ins[1 + index], shape,
                                           inputs[1 + index], shape[1]))
        rest = workspace[at:] if tactic.workspace_bytes else None
        return made + list(tactic.launches([ins[0]] + presents + list(ins[3:4]), outs[:1], rest))

    return dataclasses.replace(tactic, launches=launches, workspace_bytes=sum(rooms) + tactic.workspace_bytes)
