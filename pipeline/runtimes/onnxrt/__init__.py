"""The ONNX Runtime backend (kind "onnxruntime"): the embedded default, which needs no GPU and no
Docker (runtime.py)."""
