"""Turn PyTorch models into inference engines, profile them, and compare them with evidence.

The library is usable without the CLI: build a :class:`~pipeline.catalog.Catalog`, then call the
stage functions in :mod:`pipeline.stages`. Heavy dependencies (torch, timm, onnxruntime, docker)
are imported only by the code that needs them, so importing this package is cheap.
"""

__version__ = "0.1.0"
