"""Export tiny configurations of the models people ship, as test data for the simulator.

Run where PyTorch, torchvision and transformers are installed (the GPU machine)::

    python3 benchmarks/export_tiny.py --out DIR

For each model it writes ``NAME.onnx`` (``torch.onnx.export``, opset 17, ``dynamo=False``,
random weights, as ``../shared/GPU.md`` says real exports are made) and ``NAME.npz``: the
inputs and PyTorch's float32 outputs on them (``in:NAME`` / ``out:NAME`` keys), the oracle
the tests compare built engines against. Sizes are tiny (hidden 32, two layers) so the
CUDA simulator can run them; the graphs are what the full-size exports produce.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import numpy as np

SEQ = 16


def _hf(model_cls, config, names=("input_ids",), mask=False, output="last_hidden_state"):
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model_cls(config)

        def forward(self, input_ids, attention_mask=None):
            kwargs = {"input_ids": input_ids}
            if attention_mask is not None:
                kwargs["attention_mask"] = attention_mask
            return getattr(self.model(**kwargs), output)

    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(0, config.vocab_size, (2, SEQ)).astype(np.int64))
    inputs = {"input_ids": ids}
    if mask:
        m = np.ones((2, SEQ), np.int64)
        m[1, SEQ - 5:] = 0  # the second sequence padded
        inputs["attention_mask"] = torch.from_numpy(m)
    return Wrapped().eval(), inputs


def models() -> dict:
    """name -> (module, {input name: example tensor}); built lazily by the caller."""
    import torch
    import transformers as T

    def bert(mask):
        config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=64)
        return _hf(lambda c: T.BertModel(c, add_pooling_layer=False), config, mask=mask)

    def eager(model_cls):
        """Decoders with eager attention (transformers 5's default mask code calls
        ``aten::diff``, which the exporter lacks, when no attention_mask is given)."""
        def make(config):
            config._attn_implementation = "eager"
            return model_cls(config)
        return make

    def gpt2():
        config = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False)
        return _hf(eager(T.GPT2Model), config, mask=True)

    def llama():
        config = T.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
        return _hf(eager(T.LlamaModel), config, mask=True)

    def t5():
        config = T.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
        return _hf(T.T5EncoderModel, config)

    def vit():
        from torchvision.models.vision_transformer import VisionTransformer

        torch.backends.mha.set_fastpath_enabled(False)
        model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                  mlp_dim=64, num_classes=10).eval()
        for parameter in model.heads.parameters():  # torchvision zeroes the head: the output would be 0
            torch.nn.init.normal_(parameter, std=0.2)
        return model, {"input": torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 32, 32))
                                                 .astype(np.float32))}

    def swin():
        from torchvision.models.swin_transformer import SwinTransformer

        model = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
                                num_classes=10).eval()
        return model, {"input": torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 32, 32))
                                                 .astype(np.float32))}

    return {"bert": lambda: bert(False), "bert_mask": lambda: bert(True), "gpt2": gpt2, "llama": llama,
            "t5_encoder": t5, "vit": vit, "swin": swin}


def export(name: str, make, out: str) -> str:
    import torch

    torch.manual_seed(0)
    model, inputs = make()
    names = list(inputs)
    with torch.no_grad():
        outputs = model(*inputs.values())
        torch.onnx.export(model, tuple(inputs.values()), os.path.join(out, f"{name}.onnx"), input_names=names,
                          output_names=["output"], opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch"} for n in names} | {"output": {0: "batch"}})
    arrays = {f"in:{k}": v.numpy() for k, v in inputs.items()}
    arrays["out:output"] = outputs.float().numpy()
    np.savez(os.path.join(out, f"{name}.npz"), **arrays)
    return f"{name}: {os.path.getsize(os.path.join(out, name + '.onnx'))} bytes"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    found = models()
    failed = 0
    for name in (args.models.split(",") if args.models else found):
        try:
            print(export(name, found[name], args.out), flush=True)
        except Exception:  # noqa: BLE001 - one model's failure must not stop the others
            failed += 1
            print(f"{name}: FAILED\n{traceback.format_exc()[-2500:]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
