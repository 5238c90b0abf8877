"""A tiny pre-norm attention block with token embeddings and a padding mask: integer inputs,
fused attention (scaled_dot_product_attention) and Linear layers, returning a dict."""

import torch
import torch.nn.functional as F


class AttentionBlock(torch.nn.Module):
    def __init__(self, vocab: int, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, ids, mask):
        x = self.embed(ids)
        batch, sequence, width = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, sequence, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        keep = mask[:, None, None, :].bool()
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return {"hidden": x + self.out(attended.transpose(1, 2).reshape(batch, sequence, width)), "unused": mask}


def make(table):
    vocab = table["config"].get("vocab", 100)
    module = AttentionBlock(vocab, width=32, heads=4)
    inputs = [
        {"name": "ids", "shape": ["batch", "sequence"], "dtype": "int64", "high": vocab},
        {"name": "mask", "shape": ["batch", "sequence"], "dtype": "int64", "kind": "attention_mask"},
    ]
    # 4·b·h·S²·d for the two attention matrix products, 2·b·S·(3w·w + w·w) for the projections.
    flops = lambda sizes: 4 * sizes["batch"] * 32 * sizes["sequence"] ** 2 + 8 * sizes["batch"] * sizes["sequence"] * 32 * 32  # noqa: E731
    return {"module": module, "inputs": inputs, "flops": flops}
