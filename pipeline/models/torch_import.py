"""Import torch and timm lazily, with clear errors, on any machine.

PyPI has no CPU build of torchvision: its wheels link against CUDA torch libraries. With the small
CPU torch that `make setup` installs, torchvision's C++ ops fail to load and torchvision's own
import then dies registering fake kernels for those missing ops ("operator torchvision::nms does
not exist"). timm imports torchvision only for transforms and a BatchNorm class, never those ops,
so the fake-kernel registration is skipped in that one situation and everything else is unchanged.
"""

from __future__ import annotations

import sys
import types

from pipeline.running.errors import require_module

_TORCHVISION_OPS_MISSING = "operator torchvision::"


def _import_torchvision() -> None:
    try:
        import torchvision  # noqa: F401
    except RuntimeError as exc:
        if _TORCHVISION_OPS_MISSING not in str(exc):
            raise
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401
    except ImportError:
        pass  # timm's own import error below is the one worth showing


def import_torch():
    """torch, with torchvision's quirk on CPU-only torch handled (transformers imports torchvision
    too). Not timm: importing it costs seconds (1.4 s on the lent H100) that a model of another
    family never uses."""
    torch = require_module("torch", purpose="Exporting models")
    _import_torchvision()
    return torch


def import_timm():
    import_torch()
    return require_module("timm", purpose="Exporting timm models")
