"""Tests of the ONNX Runtime backend (pipeline/runtimes/onnxrt/)."""
