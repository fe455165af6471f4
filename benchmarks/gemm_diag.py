"""Diagnostics for the GEMM tactics (GPU only): extra tile configurations timed at 4096^3,
and each compiled kernel's registers, local memory and PTX instruction mix."""

from __future__ import annotations

import collections
import json
import re
import sys

from plugrt_builtin_ops import gemm_simt as gs, gemm_tf32 as gt

gs.SIMT_CONFIGS = (gs.SimtConfig(128, 128, 8, 8, 4, 1),)
gt.TF32_CONFIGS = tuple(gt.Tf32Config(*c) for c in (
    (2, 4, 4, 4, 32, 3), (2, 4, 4, 4, 32, 4), (2, 4, 4, 4, 16, 4), (4, 2, 4, 8, 32, 3), (4, 4, 2, 4, 32, 3),
    (4, 4, 2, 4, 32, 4), (2, 4, 2, 4, 32, 3), (2, 4, 4, 4, 64, 2)))

from gemm_bench import _matmul_tactics, sgemm_benchmark  # noqa: E402

if "--time" in sys.argv:
    sgemm_benchmark(4096, repeats=10, skip=("direct", "tiled128x128x8_8x8", "tiled64x64x16_4x4", "tiled32x32x16_2x2"))
report = {}
for tactic in _matmul_tactics(4096):
    if not tactic.name.startswith(("simt", "tf32")) or "splitk" in tactic.name:
        continue
    kernel = tactic.launches.__closure__ and None
    from numba import cuda
    a = cuda.device_array((4096, 4096), "float32")
    from plugrt.engine.launcher import PreparedLaunch
    launch = tactic.launches([a, a], [a], None)[0]
    PreparedLaunch(launch)(0)
    cuda.synchronize()
    disp = launch.kernel
    try:
        regs = list(disp.get_regs_per_thread().values())
        local = list(disp.get_local_mem_per_thread().values())
        ptx = "\n".join(disp.inspect_asm().values())
        ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+([a-z][\w.]*)", ptx, re.M))
        keep = {k: v for k, v in ops.items() if k.startswith(("ld.", "st.", "mma", "cvt.rna", "fma", "bar"))}
        report[tactic.name] = {"regs": regs, "local": local, "ptx_ops": keep}
    except Exception as error:
        report[tactic.name] = {"error": repr(error)[:300]}
    print(tactic.name, json.dumps(report[tactic.name])[:900])
