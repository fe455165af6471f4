"""Registers, spills and shared memory of the GEMM, conv, row-norm and attention kernels for sm_90, without a GPU.

Compiles kernels to PTX with Numba's CUDA target (the device query answered with compute
capability 9.0, as ``tests/cuda_typing.py`` does) and runs ``ptxas -v`` on each: the cheap
way to see whether a tile spills before spending GPU time on it. Needs NVVM and NVRTC
libraries (a CUDA toolkit: set ``CUDA_HOME``; Numba also loads ``libnvrtc`` through
``LD_LIBRARY_PATH``) and ``ptxas`` on ``PATH``.

    python3 benchmarks/ptx_resources.py                      # the offered TF32/SIMT GEMM and TF32 conv tiles
    python3 benchmarks/ptx_resources.py tf32:4,2,4,8,32,3    # one TF32 GEMM tile (wm,wn,mi,ni,bk[,stages])
    python3 benchmarks/ptx_resources.py wgmma:2,256,4        # one wgmma GEMM tile (warpgroups,columns,stages), sm_90a
    python3 benchmarks/ptx_resources.py wgmma8:2,256,4       # the INT8 wgmma GEMM (s8.s8; u8.s8 with zero points)
    python3 benchmarks/ptx_resources.py nhwc16:2,128,5       # one channels-last conv tile, FP16 (nhwc: TF32)
    python3 benchmarks/ptx_resources.py nhwc8:2,128,5        # the channels-last INT8 conv (ConvIntegerNHWC), s8.s8
    python3 benchmarks/ptx_resources.py rownorm16:1,8,3      # the vector row kernel (warps,rows,vectors a lane), FP16
    python3 benchmarks/ptx_resources.py attn16:4,1,64,3,128  # one FP16 attention tile (warps,mi,bk,min_blocks[,d[,dv]])

With no CUDA toolkit's ``libnvrtc`` (Numba asks NVRTC which architectures it supports),
``pip install --target DIR nvidia-cuda-nvrtc`` and put ``DIR/nvidia/cu13/lib`` on
``LD_LIBRARY_PATH``.

ptxas's "warpgroup.arrive/wait is injected" notes (C7517/C7519) on a wgmma kernel mean its
accumulators were touched between an MMA and its wait: the MMAs were serialized.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import types as pytypes

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

import numpy as np  # noqa: E402
import numba.cuda.dispatcher as _dispatcher  # noqa: E402
from numba import from_dtype, types  # noqa: E402

_dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))

import plugrt  # noqa: E402,F401  (chooses the backend first)
from numba import cuda  # noqa: E402
from numba.cuda.compiler import compile_ptx  # noqa: E402

from plugrt_builtin_ops.conv import tf32 as conv_tf32  # noqa: E402
from plugrt_builtin_ops.conv import wgmma_nhwc  # noqa: E402
from plugrt_builtin_ops.matmul import simt, tf32, wgmma  # noqa: E402
from plugrt_builtin_ops.matmul.integer_store import Int8Operands  # noqa: E402
from plugrt_builtin_ops.normalization import row_norm, row_norm_vector  # noqa: E402

try:  # the contrib attention plugin, when installed
    from plugrt_contrib_attention import tensor_cores_f16 as attention_f16  # noqa: E402
except ImportError:
    attention_f16 = None


@cuda.jit(device=True)
def _no_epilogue(value, index, operands):
    return value


def _arr(dtype):
    return types.Array(from_dtype(np.dtype(dtype)), 1, "C")


F32, I64 = _arr(np.float32), _arr(np.int64)
GEMM_ARGS = (F32, F32, F32, F32, F32, I64, I64, types.float32, types.float32, types.int64, types.int64,
             types.Tuple((I64,)))
CONV_ARGS = (F32, F32, F32, F32, F32, I64, I64, types.Tuple((I64,)))


def resources(kernel, args, arch: str = "") -> str:
    """``ptxas -v``'s register, spill and shared-memory lines for one kernel (``arch``:
    ``"a"`` for sm_90a, which wgmma needs)."""
    ptx, _ = compile_ptx(kernel.py_func, args, device=False, cc=(9, 0, arch) if arch else (9, 0),
                         launch_bounds=kernel.targetoptions.get("launch_bounds"))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        proc = subprocess.run(["ptxas", f"-arch=sm_90{arch}", "-v", path, "-o", os.path.join(folder, "kernel.cubin")],
                              capture_output=True, text=True)
    lines = [line.split("info    : ")[-1].strip() for line in proc.stderr.splitlines()
             if re.search(r"registers|spill|error|C751", line)]
    return "; ".join(lines) or proc.stderr.strip()[-300:]


def kernels(spec: str | None):
    if spec is None:
        for config in tf32.TF32_CONFIGS:
            yield f"gemm {config.name}", tf32.tf32_kernel(config, True, False, True, False, _no_epilogue, False), \
                GEMM_ARGS
        for config in simt.SIMT_CONFIGS:
            yield f"gemm {config.name}", simt.simt_kernel(config, True, False, True, False, _no_epilogue), GEMM_ARGS
        for config in conv_tf32.GPU_CONFIGS:
            yield f"conv {config.name}", conv_tf32.conv_tf32_kernel(config, _no_epilogue, False, False), CONV_ARGS
        for config in wgmma.WGMMA_CONFIGS:
            yield f"gemm {config.name}", _wgmma(config), GEMM_ARGS
            yield from _wgmma_int8(config)
        for config in wgmma_nhwc.GPU_CONFIGS:
            yield f"conv nhwc16 {config.name}", _nhwc(config, True), GEMM_ARGS
            yield from _nhwc_int8(config)
        for config in attention_f16.GPU_CONFIGS if attention_f16 else ():
            yield from _attention_f16(config, 64, 64)
        return
    kind, _, numbers = spec.partition(":")
    values = [int(v) for v in numbers.split(",")]
    if kind == "tf32":
        config = tf32.Tf32Config(*values)
        yield f"gemm {config.name}", tf32.tf32_kernel(config, True, False, True, False, _no_epilogue, False), \
            GEMM_ARGS
    elif kind == "simt":
        config = simt.SimtConfig(*values)
        yield f"gemm {config.name}", simt.simt_kernel(config, True, False, True, False, _no_epilogue), GEMM_ARGS
    elif kind == "wgmma":
        config = wgmma.WgmmaConfig(*values)
        yield f"gemm {config.name}", _wgmma(config), GEMM_ARGS
    elif kind == "wgmma8":
        yield from _wgmma_int8(wgmma.WgmmaConfig(*values))
    elif kind in ("nhwc", "nhwc16"):
        config = wgmma.WgmmaConfig(*values)
        yield f"conv {kind} {config.name}", _nhwc(config, kind == "nhwc16"), GEMM_ARGS
    elif kind == "nhwc8":
        yield from _nhwc_int8(wgmma.WgmmaConfig(*values))
    elif kind in ("rownorm", "rownorm16"):
        yield from _row_norms(kind == "rownorm16", *values)
    elif kind == "attn16":
        d = values[4] if len(values) > 4 else 64
        yield from _attention_f16(attention_f16.F16Config(*values[:4]), d, values[5] if len(values) > 5 else d)
    elif kind == "conv":
        config = tf32.Tf32Config(*values)
        yield f"conv {config.name}", conv_tf32.conv_tf32_kernel(config, _no_epilogue, False, False), CONV_ARGS
    else:
        raise SystemExit(f"unknown kernel kind {kind!r}: use tf32:, simt:, wgmma:, wgmma8:, nhwc:, nhwc16:, nhwc8:, "
                         "conv:, rownorm: or attn16:")


def _row_norms(half: bool, warps: int, rows: int, vectors: int):
    """The vector row kernel as LayerNorm (scale, bias, Mean and InvStdDev) and RMSNorm
    (scale, float32 Y) use it."""
    data = _arr(np.float16 if half else np.float32)
    scalars = (types.int64, types.int64, types.float32, types.float32)
    for centered in (True, False):
        y = data if centered else F32
        kernel = row_norm_vector.vector_row_kernel(
            row_norm_vector.WARP, warps, rows, vectors, row_norm.PER_COL, row_norm.PER_COL if centered else row_norm.ABSENT,
            centered, row_norm.INV_STD if centered else row_norm.NO_STAT, centered)
        args = (data, y, *scalars, y, types.int64, y if centered else F32, types.int64, F32, F32)
        yield f"rownorm {warps}x{rows}x{vectors} {'layer' if centered else 'rms'}", kernel, args


def _attention_f16(config, d: int, dv: int):
    """The FP16 attention kernel with a mask and ragged tiles, in its 16-byte-copy and
    element-copy forms."""
    args = (_arr(np.float16),) * 5 + (types.int64,) * 22 + (types.float32,)
    for vector in (True, False):
        kernel = attention_f16.f16_kernel(config, d, dv, True, False, False, vector, False)
        yield f"attention {config.name} d{d}/{dv}{' vector' if vector else ''}", kernel, args


def _wgmma(config):
    """A whole-tile wgmma kernel (A K-contiguous, B row-contiguous: a plain MatMul)."""
    kernel = wgmma.wgmma_kernel(config, True, False, True, False, _no_epilogue, False)
    kernel.ptx_arch = "a"
    return kernel


def _wgmma_int8(config):
    """MatMulInteger's INT8 kernel (whole tiles, int32 out): symmetric s8.s8, and u8.s8
    with the zero-point correction at the store, sm_90a."""
    i8, u8, i32 = _arr(np.int8), _arr(np.uint8), _arr(np.int32)
    for operands, za in ((Int8Operands("s8.s8", False), i8), (Int8Operands("u8.s8", True), u8)):
        zp = types.Tuple((za, i8, i32, i32, I64))
        kernel = wgmma.wgmma_kernel(config, True, True, True, False, _no_epilogue, False, int8=operands)
        kernel.ptx_arch = "a"
        label = f"gemm {config.name} {operands.types}{' corrected' if operands.corrected else ''}"
        yield label, kernel, (i32, F32, F32, zp, i32, I64, I64, types.float32, types.float32, types.int64,
                              types.int64, types.Tuple((I64,)))


def _nhwc(config, half: bool):
    """The channels-last implicit GEMM (ragged tiles; FP16 or TF32), sm_90a."""
    kernel = wgmma.wgmma_kernel(config, True, True, False, False, _no_epilogue, False, half, wgmma_nhwc.nhwc_gather)
    kernel.ptx_arch = "a"
    return kernel


def _nhwc_int8(config):
    """ConvIntegerNHWC's wgmma kernel: the NHWC gather on s8.s8 operands (symmetric, no
    correction), ragged tiles, int32 out, sm_90a."""
    i32 = _arr(np.int32)
    kernel = wgmma.wgmma_kernel(config, True, True, False, False, _no_epilogue, False, gather=wgmma_nhwc.nhwc_gather,
                                int8=Int8Operands("s8.s8", False))
    kernel.ptx_arch = "a"
    zp = types.Tuple((i32, i32, i32, i32, I64))
    yield f"conv nhwc8 {config.name} s8.s8", kernel, (i32, F32, F32, zp, i32, I64, I64, types.float32, types.float32,
                                                      types.int64, types.int64, types.Tuple((I64,)))


def main() -> int:
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(__doc__)
        return 0
    if shutil.which("ptxas") is None:
        print("ptxas not found on PATH (it comes with a CUDA toolkit)", file=sys.stderr)
        return 2
    for label, kernel, args in kernels(sys.argv[1] if len(sys.argv) > 1 else None):
        print(f"{label:40} {resources(kernel, args, getattr(kernel, 'ptx_arch', ''))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
