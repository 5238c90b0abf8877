"""What every compiling process imports before its first point (compile_ahead.py), imported here
once, in the server they are started from (launchers/child.py, ``preload``): a process forked
from it has them already. Importing is all this module does; it never touches a GPU, which a
process forked from it could not use after it."""

from __future__ import annotations

import contextlib

from pipeline.runtimes.pytorch.prepared import import_torch

import_torch()  # torch and timm, timm's import quirks handled as everywhere

import torch._dynamo  # noqa: E402, F401 — Dynamo's tracing, the first thing a point's compilation runs
import torch._inductor.compile_fx  # noqa: E402, F401 — and Inductor's lowering after it

with contextlib.suppress(ImportError):  # the transformers families' library, where it is installed
    import transformers.modeling_utils  # noqa: F401
