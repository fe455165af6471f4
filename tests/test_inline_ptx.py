"""The FP16 tensor-core primitives' inline PTX (plugrt.inline_ptx) assembles for sm_90.

The simulator runs no inline PTX and Numba's typing never reads the asm text, so ptxas is
the only check short of a GPU that the statements are well formed.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from plugrt import kernels


def _ptxas() -> str:
    ptxas = shutil.which("ptxas") or ("/usr/local/bin/ptxas" if os.path.exists("/usr/local/bin/ptxas") else None)
    if ptxas is None:
        pytest.skip("ptxas not installed")
    return ptxas


def _operands(ptx: str, names: list[str]) -> str:
    for index in reversed(range(len(names))):  # $10 before $1
        ptx = ptx.replace(f"${index}", names[index])
    return ptx


def test_f16_primitives_assemble_for_sm_90(tmp_path):
    floats, words = [f"%f{k}" for k in range(1, 9)], [f"%r{k}" for k in range(1, 9)]
    body = "\n    ".join([
        _operands(kernels.SHARED_ADDRESS_PTX, ["%r9", "%rd2"]),
        _operands(kernels.CP_ASYNC_ZFILL_PTX, ["%r9", "%rd1", "%r10"]),
        "cp.async.commit_group;",
        "cp.async.wait_group 0;",
        "bar.sync 0;",
        _operands(kernels.ldmatrix_ptx(4), words[:4] + ["%r9"]),
        _operands(kernels.ldmatrix_ptx(4, True), words[4:8] + ["%r9"]),
        _operands(kernels.ldmatrix_ptx(2, True), words[4:6] + ["%r9"]),
        _operands(kernels.CVT_F16X2_PTX, ["%r11", "%f1", "%f2"]),
        _operands(kernels.MMA_F16_PTX, floats[4:8] + words[:4] + words[4:6] + floats[:4]),
        "st.global.f32 [%rd1], %f5;",
    ])
    source = f"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry probe(.param .u64 out)
{{
    .reg .b32 %r<12>;
    .reg .f32 %f<9>;
    .reg .b64 %rd<3>;
    .shared .align 16 .b8 stage[256];
    ld.param.u64 %rd1, [out];
    cvta.shared.u64 %rd2, stage;
    mov.b32 %r10, 16;
    mov.f32 %f1, 0f3F800000;
    mov.f32 %f2, %f1;
    mov.f32 %f3, %f1;
    mov.f32 %f4, %f1;
    {body}
    ret;
}}
"""
    path = tmp_path / "probe.ptx"
    path.write_text(source)
    proc = subprocess.run([_ptxas(), "-arch=sm_90", str(path), "-o", str(tmp_path / "probe.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + source
