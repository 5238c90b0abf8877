"""Attention scores over a whole sequence, materialised: samples × length² floats, so a long enough
point runs out of GPU memory for real (70,000 positions: 19.6 GB per sample and matrix in FP32)."""

import torch


class Scores(torch.nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.project = torch.nn.Linear(features, features)

    def forward(self, x):
        q = self.project(x)
        weights = torch.softmax(q @ x.transpose(1, 2) / x.shape[-1] ** 0.5, dim=-1)
        return weights @ x


def make(table):
    features = table["config"].get("features", 8)
    return Scores(features), [{"name": "x", "shape": ["batch", "sequence", features]}]
