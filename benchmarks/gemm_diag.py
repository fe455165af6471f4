"""GEMM diagnostics (GPU only): more tile configurations timed at 4096^3 than the plugin
offers, and each compiled kernel's registers, local memory (spills) and PTX mix.

``python3 gemm_diag.py [--time]`` prints both; :func:`variants_benchmark` is the timing
part, for ``gpu_run.py --parts gemm_variants``.
"""

from __future__ import annotations

import collections
import json
import re
import sys

from plugrt_builtin_ops.matmul import simt as gs, tf32 as gt, wgmma as gw

SIMT_VARIANTS = ((128, 128, 8, 8, 4, 1),)
TF32_VARIANTS = ((4, 2, 4, 8, 32, 4),)
#: wgmma: (warpgroups, columns, stages)
WGMMA_VARIANTS = ((2, 256, 4), (2, 256, 3), (2, 128, 5), (2, 128, 4), (3, 128, 4), (2, 192, 4), (1, 256, 4))
SKIP = ("direct", "tiled128x128x8_8x8", "tiled64x64x16_4x4", "tiled32x32x16_2x2")


class _Variants:
    """Swap the plugin's tile lists for the variants while in the ``with`` block."""

    def __enter__(self):
        self.saved = gs.SIMT_CONFIGS, gt.TF32_CONFIGS, gw.WGMMA_CONFIGS
        gs.SIMT_CONFIGS = tuple(gs.SimtConfig(*c) for c in SIMT_VARIANTS)
        gt.TF32_CONFIGS = tuple(gt.Tf32Config(*c) for c in TF32_VARIANTS)
        gw.WGMMA_CONFIGS = tuple(gw.WgmmaConfig(*c) for c in WGMMA_VARIANTS)

    def __exit__(self, *exc):
        gs.SIMT_CONFIGS, gt.TF32_CONFIGS, gw.WGMMA_CONFIGS = self.saved


def variants_benchmark(n: int = 4096) -> dict:
    from gemm_bench import sgemm_benchmark

    with _Variants():
        return sgemm_benchmark(n, repeats=10, skip=SKIP)


def resources(n: int = 4096) -> dict:
    """Registers, local memory and a PTX instruction count per variant kernel."""
    from numba import cuda

    from gemm_bench import _matmul_tactics
    from plugrt.launcher import PreparedLaunch

    report = {}
    with _Variants():
        a = cuda.device_array((n, n), "float32")
        for tactic in _matmul_tactics(n):
            if not tactic.name.startswith(("simt", "tf32")) or "splitk" in tactic.name:
                continue
            launch = tactic.launches([a, a], [a], None)[0]
            PreparedLaunch(launch)(0)
            cuda.synchronize()
            kernel = launch.kernel
            ptx = "\n".join(kernel.inspect_asm().values())
            ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+([a-z][\w.]*)", ptx, re.M))
            report[tactic.name] = {
                "regs": list(kernel.get_regs_per_thread().values()),
                "local": list(kernel.get_local_mem_per_thread().values()),
                "ptx_ops": {k: v for k, v in ops.items() if k.startswith(("ld.", "st.", "mma", "cp.", "cvt.rna", "bar"))},
            }
            print(tactic.name, json.dumps(report[tactic.name])[:900])
    return report


if __name__ == "__main__":
    if "--time" in sys.argv:
        variants_benchmark()
    resources()
