"""Attention on its own, at the shapes of a 1024×1024 Flux image: batch × 24 heads × sequence ×
128, the sequence 4096 image tokens plus a text of 128–512 tokens. The module is PyTorch's
scaled_dot_product_attention alone, so a toolchain's `sdpa_backend` picks the kernel that is
measured (flash, efficient, cudnn, math), eager or compiled.

    [models.flux_attention]
    python = "examples/flux_attention.py:make"
    shapes = ["1x4224", "1x4352", "1x4416", "1x4480", "1x4544", "1x4608"]

Its FLOPs are attention's two matrix products, 4·batch·heads·sequence²·head_dim, so `pipeline
compare --columns …,tflops` gives each kernel's TFLOP/s and share of the GPU's dense peak, and the
error columns its distance from the FP32 reference (computed with the math kernel).
"""

import torch
import torch.nn.functional as F


class Attention(torch.nn.Module):
    def forward(self, query, key, value):
        return F.scaled_dot_product_attention(query, key, value)


def make(table):
    heads = table["config"].get("heads", 24)
    head_dim = table["config"].get("head_dim", 128)
    shape = ["batch", heads, "sequence", head_dim]
    inputs = [{"name": name, "shape": shape} for name in ("query", "key", "value")]

    def flops(sizes):
        return 4 * sizes["batch"] * heads * sizes["sequence"] ** 2 * head_dim

    return {"module": Attention(), "inputs": inputs, "flops": flops}
