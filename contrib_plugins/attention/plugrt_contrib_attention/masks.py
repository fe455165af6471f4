"""What a matched attention adds to its scores, as the fused op's ``causal`` attribute and
one additive ``mask`` input.

The pass matches, between the scaled scores and the softmax, at most one
``Where(cond, scores, fill)`` (or ``Where(cond, fill, scores)``), then up to two added
terms (a position bias and a mask: T5's relative bias, Swin's window bias, padding
masks), then Swin's shifted-window mask ``[1, nW, 1, N, N]`` added under a batch split
(``Reshape(Add(Reshape(x, [B / nW, nW, H, N, N]), mask), [B, H, N, N])``). Of these:

- a Where over a causal condition, and an added causal mask (:mod:`.causal`), become
  ``causal``, their fills (summed in float32, as the graph adds them) ``causal_fill``;
- a Where with fill ``-inf`` over any other condition is the term ``Where(cond, 0, -inf)``
  (the same scores: ``s + -inf`` is ``-inf``); with a finite fill it is not fused (a row the
  condition masks whole would average V in the graph and not in the op);
- added terms stay terms; the window mask becomes the term ``[nW, 1, N, N]`` (a Squeeze of
  it) read with ``mask_period = nW`` (batch ``b`` reads window ``b % nW``), where the other
  terms do not vary over the batch;
- the terms are summed into one mask: folded where they are constants, else by Add
  nodes outside the op (a ``[1, H, S, S]`` bias plus a ``[B, 1, 1, S]`` mask is read as one
  ``[B, H, S, S]`` tensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from plugrt.passes.pattern import add_constant, constant_value, fresh_name, make_node, origin_of

from plugrt_contrib_attention.causal import CausalReader


@dataclass
class Masking:
    """``causal`` (0, 1, 2) and the terms to add: value names and constant arrays."""

    causal: int = 0
    period: int = 0  # the op's mask_period (a window mask)
    fills: list = field(default_factory=list)  # of the causal Where and causal masks, in order
    terms: list = field(default_factory=list)
    wheres: list = field(default_factory=list)  # (condition, keep): Where(cond, 0, -inf) terms


def read_masking(graph, dims, match) -> Masking | str:
    """The masking a match amounts to, or why it cannot be fused."""
    scores = match.values["scores"]
    reader = CausalReader(graph, dims, scores)
    masking = Masking()
    for tag, keep in (("select_keep", True), ("select_drop", False)):
        if tag not in match.values:
            continue
        condition, fill = match.values["select_cond"], float(match.const("select_fill").reshape(-1)[0])
        aligned = reader.condition(condition, keep)
        if aligned:
            masking.causal = aligned
            masking.fills.append(fill)
        elif fill == -np.inf and _broadcasts(graph, dims, condition, scores):
            masking.wheres.append((condition, keep))
        else:
            return (f"Where over {condition!r} with fill {fill:g}: not a causal mask, and a fill other than "
                    "-inf (a row it masks whole would average V)")
    for tag in ("term_a", "term_b"):
        if tag not in match.values:
            continue
        term = match.values[tag]
        aligned, fill = reader.additive(term)
        if aligned and masking.causal in (0, aligned):
            masking.causal = aligned
            masking.fills.append(fill)
        elif graph.info(term).dtype != graph.info(scores).dtype or not _broadcasts(graph, dims, term, scores):
            return f"the added {term!r} does not broadcast to the scores [B, H, Sq, Sk] in their dtype"
        else:
            masking.terms.append(term)
    if "win" in match.values:
        window = _window_term(graph, dims, match)
        if isinstance(window, str):
            return window
        term, masking.period = window
        others = masking.terms + [condition for condition, _ in masking.wheres]
        if masking.period and any(graph.info(t).rank == 4 and not dims.is_size(t, 0, 1) for t in others):
            return "a mask that varies over the batch added besides the window mask"
        masking.terms.append(term)
    return masking


def causal_fill(masking: Masking) -> float | None:
    """The op's ``causal_fill``: the fills summed in float32 (``None`` for ``-inf``)."""
    total = np.float32(0)
    with np.errstate(over="ignore"):
        for fill in masking.fills:
            total = np.float32(total + np.float32(fill))
    return None if total == -np.inf else float(total)


def _broadcasts(graph, dims, term: str, scores: str) -> bool:
    rank = graph.info(term).rank
    return rank <= 4 and all(dims.one_or_equal(term, rank - back, scores, 4 - back) for back in range(1, rank + 1))


def _window_term(graph, dims, match) -> tuple | str:
    """Swin's shifted-window mask as ``(term, period)``: the term (a value name, a
    constant, or ``("squeeze", name)`` for a ``[1, nW, ., N, N]`` value) and the op's
    ``mask_period`` (0 where the mask has no window axis), or why it cannot be fused."""
    inner = match.node("win5")
    x, split, out, mask = inner.inputs[0], inner.outputs[0], match.values["win"], match.values["win_mask"]
    if graph.info(split).rank != 5 or graph.info(x).rank != 4 or graph.info(out).rank != 4:
        return "a window mask added at another rank than [B / nW, nW, H, N, N]"
    if not (all(dims.equal(split, axis + 1, x, axis) for axis in (1, 2, 3)) and dims.product(split, (0, 1), x, 0)
            and all(dims.equal(out, axis, x, axis) for axis in range(4))):
        return "the window Reshapes are not a split of the batch into [B / nW, nW] and back"
    rank, windows = graph.info(mask).rank, dims.fixed(split, 1)
    if graph.info(mask).dtype != graph.info(x).dtype or rank > 5 or windows is None or \
            not all(dims.one_or_equal(mask, rank - back, split, 5 - back) for back in range(1, rank + 1)):
        return "the window mask does not broadcast to the split scores [B / nW, nW, H, N, N] in their dtype"
    if rank == 5 and not dims.is_size(mask, 0, 1):
        return "the window mask varies over the images, not only over the windows"
    if rank < 4 or dims.is_size(mask, rank - 4, 1):
        return (mask if rank < 5 else ("squeeze", mask)), 0  # no window axis: a plain broadcast term
    return (mask if rank == 4 else ("squeeze", mask)), windows


def mask_input(graph, registry, masking: Masking, dtype, base: str, origin) -> str | None:
    """The one value the fused op reads as its mask (new constants or Add/Where nodes
    outside it), or ``None`` for none."""
    arrays, names, constants = [], [], []
    for term in masking.terms:
        if isinstance(term, tuple):  # ("squeeze", a [1, nW, ., N, N] value)
            known = constant_value(graph, term[1])
            term = known[0] if known is not None else _squeezed(graph, registry, term[1], base, origin)
        if isinstance(term, np.ndarray):
            arrays.append(term)
        elif constant_value(graph, term) is not None:
            arrays.append(constant_value(graph, term))
            constants.append(term)
        else:
            names.append(term)
    zero, minus_inf = np.zeros((), dtype), np.array(-np.inf, dtype)
    for condition, keep in masking.wheres:
        known = constant_value(graph, condition)
        if known is not None:
            arrays.append(np.where((known != 0) == keep, zero, minus_inf))
            continue
        fills = [add_constant(graph, f"{base}/zero", zero), add_constant(graph, f"{base}/minus_inf", minus_inf)]
        names.append(_add_node(graph, registry, "Where", [condition] + (fills if keep else fills[::-1]), base, origin))
    if len(arrays) == 1 and constants:
        names.insert(0, constants[0])  # one constant as it is
    elif arrays:
        total = arrays[0].astype(np.float64)
        for array in arrays[1:]:
            total = total + array.astype(np.float64)
        with np.errstate(over="ignore"):  # finfo.min + finfo.min is -inf, as the graph's float32 Add makes it
            names.insert(0, add_constant(graph, f"{base}/mask", total.astype(dtype)))
    if not names:
        return None
    mask = names[0]
    for term in names[1:]:
        mask = _add_node(graph, registry, "Add", [mask, term], base, origin)
    return mask


def _squeezed(graph, registry, name: str, base: str, origin) -> str:
    """A new ``Squeeze(name, axes=[0])``."""
    opset = graph.opsets.get("", 13)
    if opset < 13:
        return _add_node(graph, registry, "Squeeze", [name], base, origin, {"axes": [0]})
    axes = add_constant(graph, f"{base}/axes", np.array([0], np.int64))
    return _add_node(graph, registry, "Squeeze", [name, axes], base, origin)


def _add_node(graph, registry, op_type: str, inputs, base: str, origin, attrs=None) -> str:
    out = fresh_name(graph, f"{base}/{op_type.lower()}")
    node = make_node(graph, registry, op_type, inputs, [out], attrs, opset=graph.opsets.get("", 13), name=out,
                     origin=origin_of(origin))
    graph.add_node(node)
    return out
