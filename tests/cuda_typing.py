"""Type-check CUDA kernels with Numba's real CUDA target, without a GPU.

The simulator runs kernels as Python and never types them, so a kernel that would fail
to compile on a GPU (a typing error, a float64 slipping into float32 code) passes there.
:func:`compile_kernels` compiles kernels to LLVM IR for sm_90 in a subprocess with the
simulator off (no driver, NVVM or NVRTC needed: the device-function dispatcher's one
question to the driver, the compute capability, is answered with (9, 0)).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_PRELUDE = """
import json, os, types as pytypes
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
import numpy as np
from numba import from_dtype, types
from numba.cuda.compiler import compile_cuda
import numba.cuda.dispatcher as _dispatcher
_dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))
import plugrt

I64 = types.int64
RESULTS = []


def arr(dtype, ndim=1):
    base = dtype if isinstance(dtype, types.Type) else from_dtype(np.dtype(dtype))
    return types.Array(base, ndim, "C")


def scalar(dtype):
    return from_dtype(np.dtype(dtype))


def check(label, kernel, args, f64_free=False):
    try:
        result = compile_cuda(kernel.py_func, types.void, tuple(args), cc=(9, 0))
        ir = result.library.get_llvm_str()
        if f64_free and " double " in ir:
            RESULTS.append(label + ": float64 arithmetic in a float32 kernel")
    except Exception as error:
        RESULTS.append(label + ": " + type(error).__name__ + ": " + str(error)[:2000])
"""


def compile_kernels(cases: str, timeout: float = 300) -> list[str]:
    """Run ``cases`` (code calling ``check(label, kernel, [arg types], f64_free=...)``)
    after the prelude; return the failures. Skips when the CUDA target cannot load."""
    script = _PRELUDE + "\n" + textwrap.dedent(cases) + "\nprint('RESULTS=' + json.dumps(RESULTS))\n"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULTS="):
            return json.loads(line[len("RESULTS="):])
    pytest.skip(f"Numba's CUDA target is not usable here: {proc.stderr.strip().splitlines()[-1:]}")
