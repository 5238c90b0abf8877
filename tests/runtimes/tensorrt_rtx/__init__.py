"""Tests of the TensorRT-RTX backend (pipeline/runtimes/tensorrt_rtx/)."""
