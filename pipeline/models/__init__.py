"""Where the PyTorch models engines come from: one module per model family."""
