"""Regenerate the small PyTorch-exported ONNX fixtures in this folder (opset 17, dynamic batch axis).

    .venv/bin/pip install torch==2.13.0   # not a project dependency
    .venv/bin/python tests/data/torch/export.py

TorchScript exporter (dynamo=False) always; the dynamo exporter too when onnxscript is installed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.norm(self.fc1(x))))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.head(y.mean(dim=(2, 3)))


class Attention(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5, dim=-1)
        return x + self.out((att @ v).transpose(1, 2).reshape(b, t, d))


MODELS = {"mlp_ln_gelu": (MLP, (2, 32)), "convnet": (ConvNet, (2, 3, 16, 16)), "attention": (Attention, (2, 8, 32))}


def export(name: str, dynamo: bool) -> Path:
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    path = HERE / f"{name}{'.dynamo' if dynamo else ''}.onnx"
    args = dict(input_names=["x"], output_names=["y"], opset_version=17)
    if dynamo:
        torch.onnx.export(model, (torch.randn(shape),), str(path), dynamo=True, external_data=False,
                          dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}}, **args)
    else:
        torch.onnx.export(model, (torch.randn(shape),), str(path), dynamo=False,
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, **args)
    return path


if __name__ == "__main__":
    try:
        import onnxscript  # noqa: F401

        dynamo = True
    except ImportError:
        dynamo = False
    for name in MODELS:
        print(export(name, False))
        if dynamo:
            try:
                print(export(name, True))
            except Exception as err:  # the dynamo exporter is optional here
                print(f"dynamo export of {name} failed: {type(err).__name__}: {err}")
