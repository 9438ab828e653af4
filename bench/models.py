"""Benchmark models written in plain torch (no transformers / torchvision needed on the
GPU machine): an 8-layer 1024-wide MLP, a BERT-base encoder and a ResNet-50-style CNN,
exported to ONNX."""
from __future__ import annotations

import torch
from torch import nn


class BertLayer(nn.Module):
    def __init__(self, hidden=768, heads=12, intermediate=3072):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x):
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        q = q.reshape(batch, seq, self.heads, head_dim).transpose(1, 2)
        k = k.reshape(batch, seq, self.heads, head_dim).transpose(1, 2)
        v = v.reshape(batch, seq, self.heads, head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (head_dim ** 0.5)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.transpose(1, 2).reshape(batch, seq, hidden)
        x = self.norm1(x + self.out(context))
        return self.norm2(x + self.down(torch.nn.functional.gelu(self.up(x))))


class BertBase(nn.Module):
    def __init__(self, layers=12, hidden=768, vocab=30522, max_positions=512):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden) for _ in range(layers))

    def forward(self, input_ids):
        seq = input_ids.shape[1]
        positions = torch.arange(seq, device=input_ids.device)
        x = self.norm(self.embed(input_ids) + self.positions(positions)[None])
        for layer in self.layers:
            x = layer(x)
        return x


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet50(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for mid, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(count):
                blocks.append(Bottleneck(cin, mid, mid * 4, stride if i == 0 else 1))
                cin = mid * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class MLP(nn.Module):
    def __init__(self, layers=8, width=1024):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def make(name: str):
    torch.manual_seed(0)
    if name == "mlp":
        return MLP().eval()
    if name == "bert_base":
        model = BertBase().eval()
        with torch.no_grad():  # BERT-like weight scale keeps activations in fp16 range
            for parameter in model.parameters():
                if parameter.dim() >= 2:
                    parameter.normal_(0, 0.02)
        return model
    if name == "resnet50":
        model = ResNet50().eval()
        with torch.no_grad():  # non-trivial BN statistics, as after training
            for module in model.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.running_mean.uniform_(-0.1, 0.1)
                    module.running_var.uniform_(0.5, 1.5)
                    module.weight.uniform_(0.5, 1.0)
        return model
    raise ValueError(name)


def export(model, example, path):
    torch.onnx.export(model, example, path, opset_version=17, dynamo=False,
                      input_names=["input"], output_names=["output"])
