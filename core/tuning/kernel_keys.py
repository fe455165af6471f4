"""Kernel keys: a string naming the code of a layer's kernels, for the kernel cache and plans.

:func:`layer_key` names everything a layer's kernels can depend on; a launch's key is the
layer key plus the launch's index (:class:`plugrt.launcher.PreparedLaunch`), and the
kernel store adds the argument types and the GPU architecture.
"""

from __future__ import annotations


def layer_key(registry, node, graph, tactic) -> str | None:
    """The key of ``node``'s kernels under ``tactic`` at ``graph``'s concrete shapes, or
    ``None`` where the kernels cannot be named (they are then always compiled)."""
    return None
