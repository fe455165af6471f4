"""The attention op's tactics, in the order the tuner should see them.

First the SIMT kernel with plain scalar shared-memory loads (the safest: no inline PTX, so
it is what the tuner verifies the others against), then the TF32 tensor-core kernels
(``math="tf32"``: dropped when the builder forbids TF32), then the SIMT kernels with
16-byte shared-memory loads. The tuner times the first few at its default level, so the
likeliest winners come early in each family.
"""

from __future__ import annotations

from plugrt.kernels import simulated
from plugrt.plugin import Tactic

from plugrt_contrib_attention import simt, tensor_cores
from plugrt_contrib_attention.problem import AttentionShapes


def candidates(gpu: bool | None = None) -> tuple:
    """The configurations offered, both kernels', on a GPU (``gpu``; default: when not in
    the simulator, which gets tiny tiles of the same code)."""
    if not (not simulated() if gpu is None else gpu):
        plain, *vector = simt.SIM_CONFIGS
        return (plain, *tensor_cores.SIM_CONFIGS, *vector)
    plain, first, *rest = simt.GPU_CONFIGS
    tf32_first, tf32_second, *tf32_rest = tensor_cores.GPU_CONFIGS
    return (plain, tf32_first, tf32_second, first, *rest, *tf32_rest)


def attention_tactics(shapes: AttentionShapes, dtype, scale: float, configs=None,
                      guard_nan: bool = False) -> list[Tactic]:
    """The tactics for a problem, in preference order; ``configs`` replaces :func:`candidates`;
    ``guard_nan``: the op's attribute."""
    tactics = []
    for config in configs if configs is not None else candidates():
        if isinstance(config, tensor_cores.Tf32Config):
            tactic = tensor_cores.tf32_tactic(config, shapes, dtype, scale, guard_nan=guard_nan)
        else:
            tactic = simt.flash_tactic(config, shapes, dtype, scale, guard_nan)
        if tactic is not None:
            tactics.append(tactic)
    return tactics


def fits_head_sizes(d: int, dv: int) -> bool:
    """Whether some tactic's tiles fit in shared memory at head sizes ``d`` and ``dv`` (the
    graph pass fuses only what a kernel can run)."""
    shapes = AttentionShapes.plain(1, 1, 1, 1, d, dv)
    return bool(attention_tactics(shapes, "float32", 1.0, candidates(gpu=True)))
