"""A complete model of the python family: a pre-norm transformer block of your own, with token
embeddings, a padding mask and a classification head.

    [models.my_block]
    python = "examples/my_block.py:make"
    config = { vocab = 1000, width = 128, heads = 4, classes = 10 }
    shapes = ["2x64", "8x256"]

`pipeline run --model my_block` exports it with dynamic batch and sequence, runs it on ONNX
Runtime (and every other toolchain you name) and checks each engine against its FP32 outputs.
"""

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, classes: int):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, ids, mask):
        x = self.embed(ids)
        batch, sequence, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, sequence, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].bool())
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, sequence, width))
        x = x + self.mlp(self.norm2(x))
        # Mean over the real tokens, then class scores: the report shows top-1 agreement for them.
        weights = mask[..., None].to(x.dtype)
        return self.head((x * weights).sum(1) / weights.sum(1))


def make(table):
    config = {"vocab": 1000, "width": 128, "heads": 4, "classes": 10, **table["config"]}
    module = Block(**config)
    inputs = [
        {"name": "ids", "shape": ["batch", "sequence"], "dtype": "int64", "high": config["vocab"]},
        {"name": "mask", "shape": ["batch", "sequence"], "dtype": "int64", "kind": "attention_mask"},
    ]
    return module, inputs
