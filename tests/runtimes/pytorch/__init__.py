"""Tests of the torch backend (pipeline/runtimes/pytorch/): eager, torch.compile, CUDA graphs, their compiling and serving processes."""
