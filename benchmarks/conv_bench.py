"""Conv tactic benchmark (GPU only): every tactic the Conv plugin offers for ResNet-18's
3x3 layers at batch 32, timed with CUDA events (median), checked against the plugin's
reference (fp32 tolerance, or TF32's for ``math="tf32"`` tactics), against torch's
cuDNN convolution in fp32 and TF32.

``conv_benchmark()`` returns ``{"layers": [{"shape", "tactics": [{name, math, ms, ok}],
"best_fp32", "best_tf32", "torch_fp32_ms", "torch_tf32_ms"}]}``; it is what decides where
the TF32 conv tactic belongs in the plugin's preference order.
"""

from __future__ import annotations

import numpy as np

from gemm_bench import FP32_TOL, TF32_TOL, _median_ms, _torch_ms

#: (batch, in channels, out channels, spatial): ResNet-18's 3x3 stride-1 convolutions.
LAYERS = ((32, 64, 64, 56), (32, 128, 128, 28), (32, 256, 256, 14), (32, 512, 512, 7))


def _layer(batch: int, cin: int, cout: int, size: int, repeats: int, warmup: int, only=None) -> dict:
    import torch
    from numba import cuda

    from plugrt.launcher import PreparedLaunch
    from plugrt.onnx.importer import import_model
    from plugrt.registry import default_registry
    from plugrt.testing import single_node_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, cin, size, size), dtype=np.float32)
    w = (rng.standard_normal((cout, cin, 3, 3), dtype=np.float32) / np.sqrt(9 * cin)).astype(np.float32)
    bias = rng.standard_normal(cout, dtype=np.float32)
    registry = default_registry()
    graph = import_model(single_node_model("Conv", {"x": x, "w": w, "b": bias}, {"pads": [1, 1, 1, 1]}, {"w", "b"}),
                         registry=registry)
    node = graph.nodes[0]
    op = registry.op(node)
    ins_info = [graph.info(n) for n in node.inputs]
    outs_info = [graph.info(n) for n in node.outputs]

    xt, wt, bt = (torch.from_numpy(v).cuda() for v in (x, w, bias))
    previous = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        want = torch.nn.functional.conv2d(xt, wt, bt, padding=1).cpu().numpy().astype(np.float64)
        torch_fp32 = _torch_ms(lambda: torch.nn.functional.conv2d(xt, wt, bt, padding=1), repeats, warmup)
        torch.backends.cudnn.allow_tf32 = True
        torch_tf32 = _torch_ms(lambda: torch.nn.functional.conv2d(xt, wt, bt, padding=1), repeats, warmup)
    finally:
        torch.backends.cudnn.allow_tf32 = previous
    scale = float(np.max(np.abs(want)))

    stream = cuda.stream()
    ins = [cuda.to_device(v, stream=stream) for v in (x, w, bias)]
    out = cuda.device_array(want.shape, np.float32, stream=stream)
    rows = []
    for tactic in op.tactics(node, ins_info, outs_info):
        if tactic.name.startswith("direct") or (only and not tactic.name.startswith(tuple(only))):
            continue  # minutes at this size; or a tactic not asked for
        row = {"name": tactic.name, "math": tactic.math}
        try:
            workspace = cuda.device_array(tactic.workspace_bytes, np.uint8) if tactic.workspace_bytes else None
            launches = [PreparedLaunch(launch) for launch in tactic.launches(ins, [out], workspace)]

            def run(launches=launches):
                for launch in launches:
                    launch(stream)

            run()
            stream.synchronize()
            err = float(np.max(np.abs(out.copy_to_host().astype(np.float64) - want))) / scale
            row.update(max_rel_err=err, ok=err <= (TF32_TOL if tactic.math == "tf32" else FP32_TOL * 10),
                       ms=_median_ms(run, repeats, warmup, stream))
        except Exception as error:  # one broken tactic must not hide the others' numbers
            row.update(ok=False, error=f"{type(error).__name__}: {error}"[:300])
        rows.append(row)

    def best(math):
        timed = [r for r in rows if "ms" in r and r["ok"] and r["math"] == math]
        return min(timed, key=lambda r: r["ms"]) if timed else None

    return {"shape": [batch, cin, cout, size], "tactics": rows, "best_fp32": best(""), "best_tf32": best("tf32"),
            "torch_fp32_ms": torch_fp32, "torch_tf32_ms": torch_tf32}


def conv_benchmark(repeats: int = 10, warmup: int = 2, only=None) -> dict:
    """``only``: name prefixes of the tactics to time (default: all but ``direct``)."""
    layers = [_layer(*shape, repeats, warmup, only) for shape in LAYERS]
    print(f"Conv 3x3 (median of {repeats}, CUDA events): best tactics vs cuDNN")
    print(f"{'N,Cin,Cout,HW':18} {'best fp32':34} {'ms':>7} {'best tf32':34} {'ms':>7} {'torch fp32':>10} {'tf32':>7}")
    for layer in layers:
        f, t = layer["best_fp32"] or {}, layer["best_tf32"] or {}
        print(f"{','.join(map(str, layer['shape'])):18} {f.get('name', '-'):34} {f.get('ms', float('nan')):7.3f} "
              f"{t.get('name', '-'):34} {t.get('ms', float('nan')):7.3f} {layer['torch_fp32_ms']:10.3f} "
              f"{layer['torch_tf32_ms']:7.3f}")
        for row in layer["tactics"]:
            if "error" in row or not row.get("ok", True):
                print(f"   {row['name']}: {row.get('error') or 'wrong result, rel err %.2e' % row['max_rel_err']}")
    return {"layers": layers}


if __name__ == "__main__":
    import json

    print(json.dumps(conv_benchmark(), indent=1, default=str))
