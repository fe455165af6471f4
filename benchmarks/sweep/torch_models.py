"""Small PyTorch architectures for the export sweep (``run_model.py``): mobile and
efficient CNNs, ConvNeXt, DenseNet, grouped and dilated convs with exotic activations,
super-resolution, 1-D and 3-D convs, nn.Transformer layers, a LLaMA-style block, DLRM,
tensor ops (cumsum, topk, gather, where), a detection head, stacked RNNs. Tiny sizes,
random weights. ``battery()``: name -> (module, example inputs, dynamic axes)."""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.backends.mha.set_fastpath_enabled(False)


class InvertedResidual(nn.Module):  # MobileNetV2
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.conv = nn.Sequential(
            nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(inplace=True),
            nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(inplace=True),
            nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(8, 8, 1, 2), InvertedResidual(8, 12, 2, 3),
                                    InvertedResidual(12, 12, 1, 3))
        self.head = nn.Linear(12, 10)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(F.dropout(x, 0.2, self.training))


class SE(nn.Module):
    def __init__(self, c, r):
        super().__init__()
        self.fc1 = nn.Conv2d(c, r, 1)
        self.fc2 = nn.Conv2d(r, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(F.silu(self.fc1(s))))


class MBConv(nn.Module):  # EfficientNet / MobileNetV3 flavours
    def __init__(self, c, act):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 5, 1, 2, groups=c, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = act
        self.se = SE(c, 4)
        self.pw = nn.Conv2d(c, c, 1)

    def forward(self, x):
        return x + self.pw(self.se(self.act(self.bn(self.dw(x)))))


class EfficientNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, 2, 1)
        self.b1 = MBConv(8, nn.SiLU())
        self.b2 = MBConv(8, nn.Hardswish())
        self.out = nn.Linear(8, 5)

    def forward(self, x):
        x = F.hardsigmoid(self.stem(x)) * x.mean() + self.stem(x)
        x = self.b2(self.b1(x))
        return self.out(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))


class LayerNorm2d(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c))
        self.bias = nn.Parameter(torch.randn(c))

    def forward(self, x):  # ConvNeXt's channels_first LayerNorm
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + 1e-6)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1 = nn.Linear(c, 4 * c)
        self.pw2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.randn(c) * 0.1)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 2, 2)
        self.ln = LayerNorm2d(8)
        self.block = ConvNeXtBlock(8)
        self.down = nn.Conv2d(8, 16, 2, 2)
        self.head = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 4))

    def forward(self, x):
        x = self.down(self.block(self.ln(self.stem(x))))
        return self.head(x.mean([-2, -1]))


class DenseNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 6, 3, padding=1)
        self.layers = nn.ModuleList([nn.Sequential(nn.BatchNorm2d(6 + 4 * i), nn.ReLU(), nn.Conv2d(6 + 4 * i, 4, 3, padding=1))
                                     for i in range(3)])
        self.trans = nn.Sequential(nn.BatchNorm2d(18), nn.ReLU(), nn.Conv2d(18, 8, 1), nn.AvgPool2d(2, 2))
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        feats = [self.c0(x)]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        x = self.trans(torch.cat(feats, 1))
        return self.fc(F.adaptive_max_pool2d(x, 1).view(x.size(0), -1))


class ResNeXtish(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.g = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4)
        self.inorm = nn.InstanceNorm2d(16, affine=True)
        self.prelu = nn.PReLU(16)
        self.pool = nn.MaxPool2d(3, 2, 1, ceil_mode=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        x = F.leaky_relu(self.conv(x), 0.1)
        x = self.prelu(self.inorm(self.g(x))) + F.elu(x) + F.mish(x) * 0.1 + F.softplus(x) * 0.1
        x = self.pool(x)
        return self.fc(x.flatten(2).amax(-1))


class SuperRes(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 12, 3, padding=1)
        self.shuffle = nn.PixelShuffle(2)
        self.t = nn.ConvTranspose2d(3, 4, 4, stride=2, padding=1)
        self.c2 = nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x):
        y = self.shuffle(torch.tanh(self.c1(x)))
        z = self.c2(F.relu(self.t(x)))
        up = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        near = F.interpolate(x, scale_factor=2, mode="nearest")
        return y + z + up + near


class Audio1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(2, 8, 5, stride=2, padding=2)
        self.bn = nn.BatchNorm1d(8)
        self.c2 = nn.Conv1d(8, 8, 3, padding=1, groups=2)
        self.pool = nn.MaxPool1d(2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.c1(x))))
        x = F.gelu(self.c2(x), approximate="tanh")
        x = F.adaptive_avg_pool1d(x, 1).squeeze(-1)
        return F.log_softmax(self.fc(x), dim=-1)


class EncoderTorch(nn.Module):  # nn.TransformerEncoder (batch_first), with a padding mask
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.emb = nn.Embedding(20, 16)
        self.pos = nn.Parameter(torch.randn(1, 12, 16) * 0.1)

    def forward(self, ids):
        pad = ids == 0
        x = self.emb(ids) + self.pos[:, :ids.shape[1]]
        return self.enc(x, src_key_padding_mask=pad).mean(1)


class DecoderTorch(nn.Module):  # nn.TransformerDecoderLayer with causal mask + cross attention
    def __init__(self):
        super().__init__()
        self.dec = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.out = nn.Linear(16, 11)

    def forward(self, tgt, memory):
        t = tgt.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        return self.out(self.dec(tgt, memory, tgt_mask=causal))


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d) + torch.randn(d) * 0.1)

    def forward(self, x):
        return self.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryBlock(nn.Module):  # llama-ish with hand-written attention, rotary, SwiGLU
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, 24, bias=False), nn.Linear(d, 24, bias=False), nn.Linear(24, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        pos = torch.arange(t, dtype=torch.float32)
        inv = 1.0 / (10000 ** (torch.arange(0, self.dh, 2, dtype=torch.float32) / self.dh))
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q, k, v = self.qkv(self.n1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.h, self.dh).transpose(1, 2) for z in (q, k, v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        s = (q @ k.transpose(-2, -1)) / math.sqrt(self.dh)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        a = (F.softmax(s, -1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class DLRMish(nn.Module):
    def __init__(self):
        super().__init__()
        self.embs = nn.ModuleList([nn.Embedding(10, 8) for _ in range(3)])
        self.bot = nn.Sequential(nn.Linear(5, 8), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(8 + 6, 8), nn.ReLU(), nn.Linear(8, 1), nn.Sigmoid())

    def forward(self, dense, sparse):
        d = self.bot(dense)
        feats = torch.stack([d] + [e(sparse[:, i]) for i, e in enumerate(self.embs)], 1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(4, 4, 1)
        flat = inter[:, i, j]
        return self.top(torch.cat([d, flat], 1))


class Misc(nn.Module):  # where/cumsum/argmax/topk/gather/one_hot-ish/clamp/sort
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        y = self.fc(x)
        c = torch.cumsum(y, dim=1)
        top, idx = torch.topk(y, 3, dim=-1)
        g = torch.gather(y, 1, idx)
        am = torch.argmax(y, -1, keepdim=True).float()
        w = torch.where(y > 0, y, 0.1 * y).clamp(-1.0, 2.0)
        n = F.normalize(x, dim=-1)
        return torch.cat([c, top + g, am, w, n, y.std(-1, keepdim=True), y.var(1, keepdim=True)], -1)


class Detect(nn.Module):  # anchor-free head decode: sigmoid, grid math, reshape/permutes, cat
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(8, 3 * 7, 1)

    def forward(self, x):
        b, _, h, w = x.shape
        y = self.c(x).view(b, 3, 7, h, w).permute(0, 1, 3, 4, 2).sigmoid()
        gy, gx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        grid = torch.stack((gx, gy), 2).view(1, 1, h, w, 2).float()
        xy = (y[..., :2] * 2 - 0.5 + grid) * 8
        wh = (y[..., 2:4] * 2) ** 2 * 4
        return torch.cat((xy, wh, y[..., 4:]), -1).view(b, -1, 7)


class GRUTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 8)
        self.rnn = nn.GRU(8, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.lstm = nn.LSTM(12, 5, batch_first=True)
        self.fc = nn.Linear(5, 4)

    def forward(self, ids):
        y, _ = self.rnn(self.emb(ids))
        z, (h, c) = self.lstm(y)
        return self.fc(z) + h[-1][:, None, :].sum(-1, keepdim=True)


class Video3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(3, 4, (3, 3, 3), padding=1, stride=(1, 2, 2))
        self.bn = nn.BatchNorm3d(4)
        self.pool = nn.AvgPool3d((2, 2, 2))

    def forward(self, x):
        return self.pool(F.relu(self.bn(self.c(x)))).flatten(1)


def battery():
    """name -> (module, example inputs, dynamic axes for inputs)"""
    img = lambda b=2, c=3, h=16, w=16: torch.randn(b, c, h, w)
    ids = torch.randint(1, 20, (2, 12)); ids[1, 9:] = 0
    return {
        "mobilenetv2": (MobileNetV2(), (img(),), {"x": {0: "b"}}),
        "efficientnet": (EfficientNetish(), (img(),), {"x": {0: "b"}}),
        "convnext": (ConvNeXt(), (img(),), {"x": {0: "b"}}),
        "densenet": (DenseNetish(), (img(h=8, w=8),), {"x": {0: "b"}}),
        "resnext": (ResNeXtish(), (img(h=9, w=9),), {"x": {0: "b"}}),
        "superres": (SuperRes(), (img(h=6, w=6),), {"x": {0: "b"}}),
        "audio1d": (Audio1d(), (torch.randn(2, 2, 32),), {"x": {0: "b"}}),
        "encoder": (EncoderTorch(), (ids,), {"x": {0: "b"}}),
        "decoder": (DecoderTorch(), (torch.randn(2, 5, 16), torch.randn(2, 7, 16)), {"x": {0: "b"}, "y": {0: "b"}}),
        "rotary": (RotaryBlock(), (torch.randn(2, 6, 16),), {"x": {0: "b"}}),
        "dlrm": (DLRMish(), (torch.randn(2, 5), torch.randint(0, 10, (2, 3))), {"x": {0: "b"}, "y": {0: "b"}}),
        "misc": (Misc(), (torch.randn(2, 6),), {"x": {0: "b"}}),
        "detect": (Detect(), (torch.randn(2, 8, 4, 5),), {"x": {0: "b"}}),
        "grutagger": (GRUTagger(), (torch.randint(0, 30, (2, 7)),), {"x": {0: "b"}}),
        "video3d": (Video3d(), (torch.randn(2, 3, 4, 8, 8),), {"x": {0: "b"}}),
    }
