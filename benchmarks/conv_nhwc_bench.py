"""Channels-last conv benchmark (GPU only): every ``plugrt.conv::ConvNHWC`` tactic but the
plain kernel on ResNet-50's 3x3 and 1x1 layers at batch 32, FP16 and float32 (TF32),
timed with CUDA events (median), checked against torch, beside cuDNN on channels-last
tensors in the same dtype (TF32 allowed for float32) in the same run.

``conv_nhwc_benchmark()`` returns ``{"layers": [{"shape", "dtype", "tactics": [...],
"best", "cudnn_ms", "fraction"}]}``; ``fraction`` is cuDNN's time over the best tactic's.
"""

from __future__ import annotations

import numpy as np

from gemm_bench import _median_ms, _torch_ms

#: (batch, in channels, out channels, spatial, kernel, stride): ResNet-50's convolutions.
LAYERS = ((32, 64, 64, 56, 3, 1), (32, 128, 128, 28, 3, 1), (32, 256, 256, 14, 3, 1), (32, 512, 512, 7, 3, 1),
          (32, 256, 64, 56, 1, 1), (32, 64, 256, 56, 1, 1), (32, 1024, 256, 14, 1, 1), (32, 512, 2048, 7, 1, 1),
          (32, 128, 128, 56, 3, 2))
TOL = {"float16": 2e-2, "float32": 1e-2}


def _layer(shape, dtype: str, repeats: int, warmup: int) -> dict:
    import torch
    from numba import cuda

    from plugrt.launcher import PreparedLaunch
    from plugrt.onnx.importer import import_model
    from plugrt.registry import default_registry
    from plugrt.testing import single_node_model

    batch, cin, cout, size, k, stride = shape
    pad = k // 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, size, size, cin)).astype(dtype)
    w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(k * k * cin)).astype(dtype)
    bias = rng.standard_normal(cout).astype(dtype)
    attrs = {"pads": [pad] * 4, "strides": [stride, stride]}
    registry = default_registry()
    model = single_node_model("ConvNHWC", {"x": x, "w": w, "b": bias}, attrs, {"w", "b"}, domain="plugrt.conv", opset=1)
    graph = import_model(model, registry=registry)
    node = graph.nodes[0]
    op = registry.op(node)

    tx = torch.from_numpy(x).cuda().permute(0, 3, 1, 2)  # NCHW view of channels-last memory
    tw = torch.from_numpy(np.ascontiguousarray(w.transpose(0, 3, 1, 2))).cuda().to(memory_format=torch.channels_last)
    tb = torch.from_numpy(bias).cuda()
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        def cudnn():
            return torch.nn.functional.conv2d(tx, tw, tb, stride=stride, padding=pad)

        want = cudnn().permute(0, 2, 3, 1).float().cpu().numpy().astype(np.float64)
        cudnn_ms = _torch_ms(cudnn, repeats, warmup)
    finally:
        torch.backends.cudnn.allow_tf32 = previous
    scale = float(np.max(np.abs(want)))

    stream = cuda.stream()
    ins = [cuda.to_device(v, stream=stream) for v in (x, w, bias)]
    out = cuda.device_array(want.shape, np.dtype(dtype), stream=stream)
    rows = []
    for tactic in op.tactics(node, [graph.info(n) for n in node.inputs], [graph.info(n) for n in node.outputs]):
        if tactic.name.startswith("direct"):
            continue  # minutes at this size
        row = {"name": tactic.name}
        try:
            workspace = cuda.device_array(tactic.workspace_bytes, np.uint8) if tactic.workspace_bytes else None
            launches = [PreparedLaunch(launch) for launch in tactic.launches(ins, [out], workspace)]

            def run(launches=launches):
                for launch in launches:
                    launch(stream)

            run()
            stream.synchronize()
            err = float(np.max(np.abs(out.copy_to_host().astype(np.float64) - want))) / scale
            row.update(max_rel_err=err, ok=err <= TOL[dtype], ms=_median_ms(run, repeats, warmup, stream))
        except Exception as error:  # one broken tactic must not hide the others' numbers
            row.update(ok=False, error=f"{type(error).__name__}: {error}"[:300])
        rows.append(row)
    timed = [r for r in rows if r.get("ok") and "ms" in r]
    best = min(timed, key=lambda r: r["ms"]) if timed else None
    flops = 2.0 * batch * cout * (size // stride) ** 2 * cin * k * k
    return {"shape": list(shape), "dtype": dtype, "tactics": rows, "best": best, "cudnn_ms": cudnn_ms,
            "fraction": cudnn_ms / best["ms"] if best else 0.0,
            "tflops": flops / best["ms"] / 1e9 if best else 0.0}


def conv_nhwc_benchmark(repeats: int = 20, warmup: int = 3) -> dict:
    layers = [_layer(shape, dtype, repeats, warmup) for dtype in ("float16", "float32") for shape in LAYERS]
    print(f"ConvNHWC (median of {repeats}, CUDA events): best tactic vs cuDNN channels-last, same dtype")
    print(f"{'dtype':8} {'N,Cin,Cout,HW,k,s':22} {'best':38} {'ms':>7} {'TFLOP/s':>8} {'cuDNN ms':>8} {'of cuDNN':>8}")
    for layer in layers:
        b = layer["best"] or {}
        print(f"{layer['dtype']:8} {','.join(map(str, layer['shape'])):22} {b.get('name', '-'):38} "
              f"{b.get('ms', float('nan')):7.3f} {layer['tflops']:8.1f} {layer['cudnn_ms']:8.3f} "
              f"{100 * layer['fraction']:7.1f}%")
        for row in layer["tactics"]:
            if "error" in row or not row.get("ok", True):
                print(f"   {row['name']}: {row.get('error') or 'wrong result, rel err %.2e' % row['max_rel_err']}")
    return {"layers": layers}


if __name__ == "__main__":
    import json

    print(json.dumps(conv_nhwc_benchmark(), indent=1, default=str))
