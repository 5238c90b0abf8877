"""A kernel that faults on the GPU costs one shape point, not the run.

CUDA's sticky errors — a device-side assert, an illegal memory access, a launch failure, an
uncorrectable ECC error — leave the process's CUDA context unusable: every later call fails, and
CUDA's documentation says the process must be terminated and relaunched (cudaErrorAssert,
cudaErrorIllegalAddress, cudaErrorLaunchFailure in the CUDA Runtime API's error types). So a fault
is recorded for the point and toolchain where it happened (every GPU call of a stage is
synchronised before it returns, pipeline/measuring/out_of_memory.py, so the call that launched the
faulting kernel is the one that sees it), and the run goes on in a fresh process with the same
command line (pipeline/launchers/restart.py): what was done is current there and skipped, the fault
is a recorded result, and the other points and toolchains are measured.
"""

from __future__ import annotations

import sys

from pipeline.running.errors import DeviceFault

# CUDA's words for the errors that poison a context (cudaGetErrorString of each), as PyTorch and
# the CUDA libraries pass them on; out of memory is not among them: the context survives it.
STICKY_ERRORS = (
    "device-side assert triggered",
    "an illegal memory access was encountered",
    "an illegal instruction was encountered",
    "misaligned address",
    "unspecified launch failure",
    "uncorrectable ECC error encountered",
    "hardware stack error",
    "the launch timed out and was terminated",
    "CUBLAS_STATUS_EXECUTION_FAILED",
)


def fault_words(exc: BaseException) -> str | None:
    """CUDA's words where ``exc`` is a sticky CUDA error, else None."""
    text = str(exc)
    for words in STICKY_ERRORS:
        if words.lower() in text.lower():
            first = next((line.strip() for line in text.splitlines() if words.lower() in line.lower()), words)
            return first
    return None


def as_fault(exc: BaseException, doing: str | None) -> DeviceFault | None:
    """``exc`` as the DeviceFault it is (None where it is no sticky CUDA error)."""
    words = fault_words(exc)
    if words is None:
        return None
    exc.__traceback__ = None
    where = f" {doing}" if doing else ""
    return DeviceFault(
        f"faulted on the GPU{where}: {words}",
        hint="the kernel's own error: that point alone with CUDA_LAUNCH_BLOCKING=1 shows its call stack",
        facts={"error": words, "during": doing},
    )


def synchronised(doing: str | None) -> None:
    """Wait for the GPU's work of this call, so that a fault it launched is seen here, in the call
    that launched it, not blamed on whichever call would have waited next."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    try:
        torch.cuda.synchronize()
    except Exception as exc:
        fault = as_fault(exc, doing)
        if fault is None:
            raise
        raise fault from exc
