"""What every compiling process imports before its first point (compile_ahead.py), imported here
once, in the server they are started from (launchers/child.py, ``preload``): a process forked
from it has them already. Importing is all this module does, and nothing it imports may touch the
GPU, which a process forked from it could not use after it: PyTorch marks every process forked
after CUDA's driver was initialised as unable to use CUDA ("Cannot re-initialize CUDA in forked
subprocess"), and ``torch.cuda.is_available()`` initialises it, unless PYTORCH_NVML_BASED_CUDA_CHECK
is set, when it asks NVML instead (torch/cuda/__init__.py, is_available). Some of these imports
ask it: on the lent H100 every compiling process forked from a server that imported them so found
CUDA unusable. Set here, in the server alone: each process forked from it runs with the run's own
environment (launchers/child.py, _in_environment). Whether they can use CUDA is asked of one of
them before any compiles (compile_process.forking_usable)."""

from __future__ import annotations

import contextlib
import os

os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

from pipeline.runtimes.pytorch.prepared import import_torch  # noqa: E402

import_torch()  # torchvision's quirk on a CPU-only torch handled as everywhere

with contextlib.suppress(ImportError):  # timm's models' library, where it is installed
    import timm  # noqa: F401

import torch._dynamo  # noqa: E402, F401 — Dynamo's tracing, the first thing a point's compilation runs
import torch._inductor.compile_fx  # noqa: E402, F401 — and Inductor's lowering after it

with contextlib.suppress(ImportError):  # the transformers families' library, where it is installed
    import transformers.modeling_utils  # noqa: F401
