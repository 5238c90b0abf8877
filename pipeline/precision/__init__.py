"""Finding and fixing a quantized variant's accuracy (`pipeline sensitivity`, `pipeline plan`).

- ``variant_lab``: the variant's PyTorch model calibrated once, its layers quantized or not at
  will, measured against the FP32 model on evaluation batches kept apart from calibration;
- ``sensitivity``: what each layer's quantization costs and what excluding it buys, ranked, and
  where along the depth the error appears;
- ``plan``: the variant that meets an accuracy floor keeping the least of the model's work in
  high precision, confirmed on batches the search never saw;
- ``where``: each layer's ONNX nodes and engine layers; ``report``: terminal, JSON and HTML;
  ``catalog_edit``: the planned variant written into pipeline.toml, comments and layout kept.
"""
