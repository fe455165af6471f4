"""More small architectures for the sweep (see torch_models.py): SDPA with a mask, Swin's
shifted windows, padding modes, einsum and bilinear, grid sampling, several outputs,
unfold; battery3: the same families over dynamic sequence and spatial dims."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_models import MobileNetV2, EncoderTorch, RotaryBlock

torch.manual_seed(1)


class SDPA(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.cls = nn.Parameter(torch.randn(1, 1, 16))
        self.pos = nn.Parameter(torch.randn(1, 7, 16) * 0.1)
        self.patch = nn.Conv2d(3, 16, 4, 4)

    def forward(self, img, mask):
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        q, k, v = self.qkv(x).view(x.shape[0], -1, 3, 2, 8).permute(2, 0, 3, 1, 4)
        m = mask[:, None, None, :]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        return a.transpose(1, 2).flatten(2)[:, 0]


class Swinish(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):  # x [B, H, W, C]
        b, h, w, c = x.shape
        x = torch.roll(x, shifts=(-2, -2), dims=(1, 2))
        win = x.view(b, h // 4, 4, w // 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 16, c)
        win = self.fc(self.norm(win))
        x = win.view(b, h // 4, w // 4, 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        return torch.roll(x, shifts=(2, 2), dims=(1, 2))


class Pads(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 4)
        self.c = nn.Conv2d(4, 4, 3)
        self.lrn = nn.LocalResponseNorm(3)

    def forward(self, x):
        y = F.pad(x, (1, 1, 1, 1), mode="reflect")
        z = F.pad(x, (2, 0, 1, 1), mode="replicate")
        c = F.pad(x, (1, 2, 0, 1), value=0.5)
        y = self.c(self.gn(y))
        out = y + z[..., 1:-1, :y.shape[-1]] + c[..., :y.shape[-2], :y.shape[-1]]
        out = self.lrn(out)
        return torch.cat([F.adaptive_avg_pool2d(out, (2, 2)).flatten(1), F.interpolate(out, size=(5, 3), mode="nearest").flatten(1)], 1)


class EinsumBilinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.bil = nn.Bilinear(5, 4, 3)
        self.w = nn.Parameter(torch.randn(4, 5, 6))

    def forward(self, a, b):
        e = torch.einsum("bi,jik->bk", a, self.w)
        cs = F.cosine_similarity(a[:, :4], b, dim=-1)[:, None]
        return torch.cat([self.bil(a, b), e, cs], -1)


class GridSample(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(16, 6)

    def forward(self, x):
        theta = self.loc(x.mean(1).flatten(1)).view(-1, 2, 3) * 0.1 + torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)


class MultiOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, flag):
        y = self.fc(x)
        return y, y.argmax(-1), (y > 0) & flag, x.shape[0] * torch.ones(1)


class Unfold(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        u = F.unfold(x, kernel_size=2, stride=2)  # [B, C*4, L]
        return self.fc(u.transpose(1, 2))


def battery2():
    return {
        "mobilenet_dynhw": (MobileNetV2(), (torch.randn(2, 3, 16, 16),), {"x": {0: "b", 2: "h", 3: "w"}}),
        "sdpa_vit": (SDPA(), (torch.randn(2, 3, 8, 12), torch.tensor([[True] * 7, [True] * 5 + [False] * 2])), {"x": {0: "b"}, "y": {0: "b"}}),
        "swin": (Swinish(), (torch.randn(2, 8, 8, 8),), {"x": {0: "b"}}),
        "pads": (Pads(), (torch.randn(2, 4, 6, 6),), {"x": {0: "b"}}),
        "einsum": (EinsumBilinear(), (torch.randn(2, 5), torch.randn(2, 4)), {"x": {0: "b"}, "y": {0: "b"}}),
        "gridsample": (GridSample(), (torch.randn(2, 4, 4, 4),), {"x": {0: "b"}}),
        "multiout": (MultiOut(), (torch.randn(2, 4), torch.tensor([[True, False, True], [False, True, True]])), {"x": {0: "b"}, "y": {0: "b"}}),
        "unfold": (Unfold(), (torch.randn(2, 3, 4, 6),), {"x": {0: "b"}}),
        "rotary_dynseq": (RotaryBlock(), (torch.randn(2, 6, 16),), {"x": {0: "b", 1: "t"}}),
    }


def battery3():
    from torch_models import EncoderTorch, DecoderTorch, GRUTagger, Audio1d, ConvNeXt
    ids = torch.randint(1, 20, (2, 9)); ids[1, 6:] = 0
    return {
        "encoder_dynseq": (EncoderTorch(), (ids,), {"x": {0: "b", 1: "t"}}),
        "decoder_dynseq": (DecoderTorch(), (torch.randn(2, 5, 16), torch.randn(2, 7, 16)), {"x": {0: "b", 1: "t"}, "y": {0: "b", 1: "s"}}),
        "grutagger_dynseq": (GRUTagger(), (torch.randint(0, 30, (2, 7)),), {"x": {0: "b", 1: "t"}}),
        "audio_dynlen": (Audio1d(), (torch.randn(2, 2, 32),), {"x": {0: "b", 2: "l"}}),
        "convnext_dynhw": (ConvNeXt(), (torch.randn(2, 3, 16, 16),), {"x": {0: "b", 2: "h", 3: "w"}}),
    }
