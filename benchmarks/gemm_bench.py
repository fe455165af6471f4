"""SGEMM benchmark (GPU only): every float32 MatMul tactic the plugin offers at n^3,
timed with CUDA events (median), against torch.matmul in fp32 and in TF32.

``sgemm_benchmark(n=4096)`` returns ``{"n", "tactics": [{name, params, math, ms, tflops,
max_rel_err, ok}], "torch_fp32": {...}, "torch_tf32": {...}}`` and prints a short table.
Each tactic's output is checked against torch's fp32 product (max error relative to
max |reference|: 1e-4 for fp32 tactics, 5e-3 for TF32 ones).
"""

from __future__ import annotations

import numpy as np

FP32_TOL = 1e-4
TF32_TOL = 5e-3


def _median_ms(fn, repeats: int, warmup: int, stream) -> float:
    from numba import cuda

    for _ in range(warmup):
        fn()
    stream.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(timing=True), cuda.event(timing=True)
        start.record(stream)
        fn()
        stop.record(stream)
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return float(np.median(times))


def _torch_ms(fn, repeats: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))


def _matmul_tactics(n: int):
    from plugrt.ir.graph import Node
    from plugrt.plugin import TensorInfo
    from plugrt.registry import default_registry

    op = default_registry().find_op("", "MatMul", 17)
    node = Node("bench", "MatMul", "", ("a", "b"), ("y",), {}, opset=17)
    ins = [TensorInfo(np.float32, (n, n)), TensorInfo(np.float32, (n, n))]
    return op.tactics(node, ins, op.infer(node, ins))


def sgemm_benchmark(n: int = 4096, repeats: int = 20, warmup: int = 3, skip=("direct",)) -> dict:
    """Time the MatMul tactics at ``n x n x n`` (float32) and torch fp32/TF32; see module doc."""
    import torch
    from numba import cuda

    from plugrt.launcher import PreparedLaunch

    flops = 2.0 * n ** 3
    rng = np.random.default_rng(0)
    a_host = rng.standard_normal((n, n), dtype=np.float32)
    b_host = rng.standard_normal((n, n), dtype=np.float32)
    a_t, b_t = torch.from_numpy(a_host).cuda(), torch.from_numpy(b_host).cuda()
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        reference = torch.matmul(a_t, b_t)
        torch_fp32 = _torch_ms(lambda: torch.matmul(a_t, b_t), repeats, warmup)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch_tf32 = _torch_ms(lambda: torch.matmul(a_t, b_t), repeats, warmup)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    want = reference.cpu().numpy().astype(np.float64)
    scale = float(np.max(np.abs(want)))

    stream = cuda.stream()
    a, b = cuda.to_device(a_host, stream=stream), cuda.to_device(b_host, stream=stream)
    out = cuda.device_array((n, n), np.float32, stream=stream)
    rows = []
    for tactic in _matmul_tactics(n):
        if tactic.name in skip:
            continue
        row = {"name": tactic.name, "params": dict(tactic.params), "math": tactic.math}
        try:
            workspace = cuda.device_array(tactic.workspace_bytes, np.uint8) if tactic.workspace_bytes else None
            launches = [PreparedLaunch(launch) for launch in tactic.launches([a, b], [out], workspace)]

            def run(launches=launches):
                for launch in launches:
                    launch(stream)

            run()
            stream.synchronize()
            err = float(np.max(np.abs(out.copy_to_host().astype(np.float64) - want))) / scale
            row["max_rel_err"] = err
            row["ok"] = err <= (TF32_TOL if tactic.math == "tf32" else FP32_TOL)
            row["ms"] = _median_ms(run, repeats, warmup, stream)
            row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
        except Exception as error:  # one broken tactic must not hide the others' numbers
            row.update(ok=False, error=f"{type(error).__name__}: {error}"[:500])
        rows.append(row)

    result = {"n": n, "tactics": rows,
              "torch_fp32": {"ms": torch_fp32, "tflops": flops / (torch_fp32 * 1e-3) / 1e12},
              "torch_tf32": {"ms": torch_tf32, "tflops": flops / (torch_tf32 * 1e-3) / 1e12}}
    print(f"SGEMM {n}^3 (median of {repeats}, CUDA events)")
    print(f"{'tactic':34} {'math':5} {'ms':>9} {'TFLOP/s':>8} {'rel err':>9} ok")
    for row in rows:
        if "ms" in row:
            print(f"{row['name']:34} {row['math'] or 'fp32':5} {row['ms']:9.3f} {row['tflops']:8.2f} "
                  f"{row['max_rel_err']:9.2e} {row['ok']}")
        else:
            print(f"{row['name']:34} {row['math'] or 'fp32':5} failed: {row.get('error')}")
    for key in ("torch_fp32", "torch_tf32"):
        print(f"{key:34} {'':5} {result[key]['ms']:9.3f} {result[key]['tflops']:8.2f}")
    return result


def hgemm_benchmark(n: int = 4096, repeats: int = 20, warmup: int = 3) -> dict:
    """FP16 GEMM at ``n^3``: the FP16 wgmma tactics of MatMul with B a weight (held
    transposed) and of Gemm with transB (B K-contiguous), against cuBLAS FP16
    (``torch.matmul`` in half) in the same run; errors against torch's FP32 product of the
    same FP16 inputs (max relative to max |reference|, 2e-3 allowed)."""
    import torch
    from numba import cuda

    from plugrt.ir.graph import Node
    from plugrt.launcher import PreparedLaunch
    from plugrt.plugin import TensorInfo
    from plugrt.registry import default_registry

    flops = 2.0 * n ** 3
    rng = np.random.default_rng(0)
    a_host = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
    b_host = rng.standard_normal((n, n), dtype=np.float32).astype(np.float16)
    a_t, b_t = torch.from_numpy(a_host).cuda(), torch.from_numpy(b_host).cuda()
    cublas = _torch_ms(lambda: torch.matmul(a_t, b_t), repeats, warmup)
    torch.backends.cuda.matmul.allow_tf32 = False
    want = torch.matmul(a_t.float(), b_t.float()).cpu().numpy().astype(np.float64)
    scale = float(np.max(np.abs(want)))
    registry = default_registry()
    stream = cuda.stream()
    rows = []
    for op_type, attrs, b_given in (("MatMul", {}, b_host), ("Gemm", {"transB": 1, "transA": 0, "alpha": 1.0,
                                                                      "beta": 1.0}, np.ascontiguousarray(b_host.T))):
        op = registry.find_op("", op_type, 17)
        node = Node("bench", op_type, "", ("a", "b"), ("y",), attrs, opset=17)
        ins = [TensorInfo(np.float16, (n, n)), TensorInfo(np.float16, (n, n), b_given if op_type == "MatMul" else None)]
        a, b = cuda.to_device(a_host, stream=stream), cuda.to_device(b_given, stream=stream)
        out = cuda.device_array((n, n), np.float16, stream=stream)
        for tactic in op.tactics(node, ins, op.infer(node, ins)):
            if not tactic.name.startswith("wgmma_f16"):
                continue
            row = {"name": f"{op_type} {tactic.name}", "params": dict(tactic.params)}
            try:
                workspace = cuda.device_array(tactic.workspace_bytes, np.uint8) if tactic.workspace_bytes else None
                launches = [PreparedLaunch(launch) for launch in tactic.launches([a, b], [out], workspace)]

                def run(launches=launches):
                    for launch in launches:
                        launch(stream)

                run()
                stream.synchronize()
                err = float(np.max(np.abs(out.copy_to_host().astype(np.float64) - want))) / scale
                row.update(max_rel_err=err, ok=err <= 2e-3, ms=_median_ms(run, repeats, warmup, stream))
                row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
                row["vs_cublas"] = cublas / row["ms"]
            except Exception as error:  # one broken tactic must not hide the others' numbers
                row.update(ok=False, error=f"{type(error).__name__}: {error}"[:500])
            rows.append(row)
    result = {"n": n, "tactics": rows, "cublas_fp16": {"ms": cublas, "tflops": flops / (cublas * 1e-3) / 1e12}}
    print(f"HGEMM {n}^3 (median of {repeats}, CUDA events); cuBLAS FP16 {cublas:.3f} ms "
          f"{result['cublas_fp16']['tflops']:.1f} TFLOP/s")
    for row in rows:
        if "ms" in row:
            print(f"{row['name']:40} {row['ms']:9.3f} ms {row['tflops']:8.1f} TFLOP/s {100 * row['vs_cublas']:5.1f}% "
                  f"of cuBLAS, rel err {row['max_rel_err']:.2e} {row['ok']}")
        else:
            print(f"{row['name']:40} failed: {row.get('error')}")
    return result


if __name__ == "__main__":
    import json
    import sys

    size = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    print(json.dumps(sgemm_benchmark(size), indent=1, default=str))
