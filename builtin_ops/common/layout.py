"""Tensor layouts the families share: a Transpose node's permutation, and the channels-first
view of a channels-last tensor (the NHWC convolutions and pools, the ``channels_last`` pass).
"""

from __future__ import annotations

import numpy as np

from plugrt.plugin import TensorInfo


def transpose_perm(node, rank: int) -> list[int]:
    """A Transpose node's permutation over ``rank`` axes, normalized: absent means reversed,
    negative axes counted from the end (as ONNX and the Transpose reference read it)."""
    perm = node.attrs.get("perm")
    return list(range(rank))[::-1] if perm is None else [int(p) % rank for p in perm]


def channels_first(info: TensorInfo | None) -> TensorInfo | None:
    """The info of ``[N, spatial..., C]``'s channels-first view ``[N, C, spatial...]``, a
    constant's value moved with it."""
    if info is None:
        return None
    shape = (info.shape[0], info.shape[-1], *info.shape[1:-1])
    return TensorInfo(info.dtype, shape, None if info.value is None else np.moveaxis(info.value, -1, 1))


def channels_last(info: TensorInfo) -> TensorInfo:
    """The info of ``[N, C, spatial...]``'s channels-last view ``[N, spatial..., C]``."""
    shape = (info.shape[0], *info.shape[2:], info.shape[1])
    return TensorInfo(info.dtype, shape, None if info.value is None else np.moveaxis(info.value, 1, -1))
