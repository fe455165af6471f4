"""The attention op's tactics, in the order the tuner should see them.

First the SIMT kernel with plain scalar shared-memory loads (the safest: no inline PTX, so
it is what the tuner verifies the others against), then the TF32 tensor-core kernels
(``math="tf32"``: dropped when the builder forbids TF32), then the SIMT kernels with
16-byte shared-memory loads. The tuner times the first few at its default level, so the
likeliest winners come early in each family.

float16 data also gets the FP16 tensor-core kernels (:func:`for_dtype`), after the plain
SIMT kernel on a GPU too: the default level times the plain kernel (the tuner's reference,
the one with no inline PTX), the first FP16 kernel and the first TF32 one, so an FP16
kernel that went wrong on some GPU is dropped against the plain one and the TF32 kernel
still competes; the other FP16 tiles follow (timed from level 4).
"""

from __future__ import annotations

import numpy as np

from plugrt.kernels import simulated
from plugrt.plugin import Tactic

from plugrt_contrib_attention import simt, tensor_cores, tensor_cores_f16
from plugrt_contrib_attention.problem import AttentionShapes


def _on_gpu(gpu: bool | None) -> bool:
    return not simulated() if gpu is None else bool(gpu)


def candidates(gpu: bool | None = None) -> tuple:
    """The configurations offered for any dtype, the SIMT and TF32 kernels', on a GPU
    (``gpu``; default: when not in the simulator, which gets tiny tiles of the same code)."""
    if not _on_gpu(gpu):
        plain, *vector = simt.SIM_CONFIGS
        return (plain, *tensor_cores.SIM_CONFIGS, *vector)
    plain, first, *rest = simt.GPU_CONFIGS
    tf32_first, tf32_second, *tf32_rest = tensor_cores.GPU_CONFIGS
    return (plain, tf32_first, tf32_second, first, *rest, *tf32_rest)


def f16_candidates(gpu: bool | None = None) -> tuple:
    """The FP16 tensor-core configurations (float16 data only), on a GPU or in the simulator."""
    return tensor_cores_f16.GPU_CONFIGS if _on_gpu(gpu) else tensor_cores_f16.SIM_CONFIGS


def for_dtype(configs, dtype, gpu: bool | None = None) -> tuple:
    """``configs`` (:func:`candidates`) in the order for ``dtype``'s data: for float16 with
    the FP16 configurations after the first (plain) one; on a GPU the first FP16 one, the
    first TF32 one, the other FP16 ones, then the rest of ``configs``."""
    configs = tuple(configs)
    if np.dtype(dtype) != np.float16 or not configs:
        return configs
    f16 = f16_candidates(gpu)
    if not _on_gpu(gpu):
        return (configs[0], *f16, *configs[1:])
    plain, rest = configs[0], configs[1:]
    tf32 = [c for c in rest if isinstance(c, tensor_cores.Tf32Config)][:1]
    return (plain, *f16[:1], *tf32, *f16[1:], *(c for c in rest if c not in tf32))


def attention_tactics(shapes: AttentionShapes, dtype, scale: float, configs=None,
                      guard_nan: bool = False, wanted=None) -> list[Tactic]:
    """The tactics for a problem, in preference order; ``configs`` replaces
    :func:`for_dtype` of :func:`candidates`; ``guard_nan``: the op's attribute. After all
    of them come their bounds-checked twins (``NAME_ragged``, offered at every shape:
    ``params["even"]`` says which bounds checks a tactic leaves out where the sequences
    fill whole tiles): the kernels that serve every sequence length of a dynamic profile
    (:mod:`plugrt.engine.generic`). ``wanted``: a tactic's identity (a new shape looking for
    a plan's): only its tile is made."""
    tactics, twins = [], []
    name = None if wanted is None else wanted["name"]
    for config in configs if configs is not None else for_dtype(candidates(), dtype):
        if name is not None and name not in (config.name, config.name + "_ragged"):
            continue
        tactic = _tactic(config, shapes, dtype, scale, guard_nan, False)
        if tactic is not None:
            tactics.append(tactic)
            twins.append(_tactic(config, shapes, dtype, scale, guard_nan, True))
    return tactics + twins


def _tactic(config, shapes: AttentionShapes, dtype, scale: float, guard_nan: bool, ragged: bool) -> Tactic | None:
    if isinstance(config, tensor_cores_f16.F16Config):
        return tensor_cores_f16.f16_tactic(config, shapes, dtype, scale, guard_nan=guard_nan, ragged=ragged)
    if isinstance(config, tensor_cores.Tf32Config):
        return tensor_cores.tf32_tactic(config, shapes, dtype, scale, guard_nan=guard_nan, ragged=ragged)
    return simt.flash_tactic(config, shapes, dtype, scale, guard_nan, ragged)


def fits_head_sizes(d: int, dv: int) -> bool:
    """Whether some tactic's tiles fit in shared memory at head sizes ``d`` and ``dv`` (the
    graph pass fuses only what a kernel can run)."""
    shapes = AttentionShapes.plain(1, 1, 1, 1, d, dv)
    return bool(attention_tactics(shapes, "float32", 1.0, candidates(gpu=True)))
