"""Real models for the GPU run, exported from PyTorch: torchvision ResNet-18 and a
BERT-base-sized encoder layer (written out as HuggingFace's BertLayer computes it)."""

from __future__ import annotations

import math

import torch
from torch import nn


class BertLayer(nn.Module):
    """One BERT-base encoder layer: self-attention, add & LayerNorm, GELU MLP, add & LayerNorm."""

    def __init__(self, hidden: int = 768, heads: int = 12, intermediate: int = 3072):
        super().__init__()
        self.heads, self.head_size = heads, hidden // heads
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.up, self.down = nn.Linear(hidden, intermediate), nn.Linear(intermediate, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def _split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_size).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        b, h, s, d = context.shape
        context = context.permute(0, 2, 1, 3).reshape(b, s, h * d)
        x = self.ln1(x + self.attn_out(context))
        return self.ln2(x + self.down(nn.functional.gelu(self.up(x))))


def resnet18() -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(weights=None).eval()


def export(model: nn.Module, example: torch.Tensor, path: str, dynamic_dims: dict, opset: int = 17) -> str:
    """Export with the TorchScript exporter; ``dynamic_dims`` names input dims. Below opset
    17 it writes LayerNorm as primitive ops (ReduceMean, Sub, Pow, ...)."""
    with torch.no_grad():
        torch.onnx.export(model, (example,), path, input_names=["input"], output_names=["output"],
                          opset_version=opset, dynamic_axes={"input": dynamic_dims, "output": dynamic_dims},
                          dynamo=False)
    return path
