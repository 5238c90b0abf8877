"""Data hooks (`--eval-data scripts/gpu_eval_data.py:FUNCTION`) for the GPU figures of
docs/results/precision.md: what a user's loader yields, in batches — seeded synthetic data of the seed
models' shapes (the lent machines hold no dataset), so the figures show the hook's path at scale
(batches dealt whole to the search and the confirmation, the metric's bound by resample), not a task's
accuracy."""

from __future__ import annotations

import torch

BATCH = 8  # samples a batch: 64 samples are 8 batches, dealt 4 and 4


def vit_batches(batches: int = 8):
    """ViT-B/16's inputs: normalised 224×224 images, smooth noise (seeded)."""
    generator = torch.Generator().manual_seed(101)
    for _ in range(batches):
        coarse = torch.randn(BATCH, 3, 14, 14, generator=generator)
        yield torch.nn.functional.interpolate(coarse, size=(224, 224), mode="bilinear", align_corners=False)


def modernbert_batches(batches: int = 8, sequence: int = 512, vocab: int = 50368):
    """ModernBERT-base's inputs (input_ids, attention_mask) at 512 tokens, the last quarter of
    every other sequence padded."""
    generator = torch.Generator().manual_seed(202)
    for _ in range(batches):
        ids = torch.randint(0, vocab, (BATCH, sequence), generator=generator)
        mask = torch.ones(BATCH, sequence, dtype=torch.int64)
        mask[1::2, 3 * sequence // 4 :] = 0
        yield {"inputs": (ids, mask)}
