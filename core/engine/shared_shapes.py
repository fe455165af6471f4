"""What preparing an input shape shares between the contexts of one engine.

A context meeting a shape (:class:`~plugrt.engine.specialization.Specialization`) infers
every tensor's shape for it and finds every layer's recorded tactic again: work that
depends on the engine, the profile and the shapes, not on the context. The engine's most
recent shapes keep it (:data:`KEPT` of them), so the other contexts of a pool (a server's
:class:`~plugrt.engine.pool.ContextPool`, ``plugrt bench --streams``) find it ready and
only make their own launches, whose pointers are into their own buffers.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

#: Shapes whose preparation an engine keeps for its contexts (least recently used dropped).
KEPT = 64


@dataclass
class SharedShape:
    """One shape's context-free preparation: the concrete graph, and each layer's tactic
    by the layer's position in ``engine.layers`` (filled as contexts find them; kernel keys
    are remembered by :func:`plugrt.tuning.kernel_keys.layer_key` itself)."""

    graph: object
    tactics: dict = field(default_factory=dict)


def shape_key(profile: int, shapes: Mapping, values: Mapping, sizes: Mapping, start: int) -> tuple:
    """What decides a specialization's graph and tactics: the profile, the input shapes,
    the shape-tensor values, the data-dependent sizes and the first layer prepared."""
    return (profile, tuple(sorted((name, tuple(int(d) for d in shape)) for name, shape in shapes.items())),
            tuple(sorted((name, np.asarray(v).dtype.str, np.asarray(v).shape, np.asarray(v).tobytes())
                         for name, v in values.items())),
            repr(sorted((name, [tuple(s) for s in found]) for name, found in sizes.items())), start)


def shared_shape(engine, key: tuple, make_graph: Callable[[], object]) -> SharedShape:
    """The engine's :class:`SharedShape` for ``key``, made (``make_graph()`` for its graph)
    where no context of the engine has prepared those shapes lately."""
    with _LOCK:
        kept = _BY_ENGINE.get(engine)
        found = None if kept is None else kept.get(key)
        if found is not None:
            kept.move_to_end(key)
            return found
    made = SharedShape(make_graph())
    with _LOCK:
        kept = _BY_ENGINE.setdefault(engine, OrderedDict())
        made = kept.setdefault(key, made)  # (another context's, if it came first)
        while len(kept) > KEPT:
            kept.popitem(last=False)
    return made


_BY_ENGINE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


__all__ = ["SharedShape", "shape_key", "shared_shape", "KEPT"]
