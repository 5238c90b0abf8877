"""A kernel that faults on the GPU costs one shape point, not the run.

CUDA's sticky errors — a device-side assert, an illegal memory access, a launch failure, an
uncorrectable ECC error — leave the process's CUDA context unusable: every later call fails, and
CUDA's documentation says the process must be terminated and relaunched (cudaErrorAssert,
cudaErrorIllegalAddress, cudaErrorLaunchFailure in the CUDA Runtime API's error types). So a fault
is recorded for the point and toolchain where it happened (every GPU call of a stage is
synchronised before it returns, pipeline/runtimes/torch_memory.py, so the call that launched the
faulting kernel is the one that sees it), and the run goes on in a fresh process with the same
command line: what was done is current there and skipped, the fault is a recorded result, and the
other points and toolchains are measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

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
# How many times one command replaces its process after faults before it gives up: each fault is
# recorded, so each replacement makes progress; a bound all the same, against a fault that is not.
MAX_REPLACEMENTS = 32
# What a replaced process is told by its predecessor (environment variables).
REPLACED = "PIPELINE_REPLACED_AFTER_FAULTS"
FORCED_DONE = "PIPELINE_FORCED_DONE"


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


def go_on_in_fresh_process(args: list[str], done: set, replace: bool) -> int:
    """Run the same command again in a fresh process, after a fault poisoned this one: ``replace``
    this process with it (exec; the command line's own run), or wait for it as a child (a caller
    that called main() in its own process). ``done``: what this run's --force already redid, so the
    next process does not redo it. The exit status is the fresh process's."""
    from pipeline.running.reporting import print_error

    count = int(os.environ.get(REPLACED, "0") or 0)
    if count >= MAX_REPLACEMENTS:
        print_error(
            f"{count} faults in one run: stopping rather than starting another process.",
            "each fault is recorded in its point's manifest; run the same command again to go on",
        )
        return 1
    with tempfile.NamedTemporaryFile("w", prefix="pipeline-done-", suffix=".json", delete=False) as handle:
        json.dump(sorted([list(key) for key in done]), handle)
    env = {**os.environ, REPLACED: str(count + 1), FORCED_DONE: handle.name}
    command = [sys.executable, "-m", "pipeline", *args]
    sys.stdout.flush()
    sys.stderr.flush()
    if replace:
        os.execve(sys.executable, command, env)
    return subprocess.run(command, env=env, check=False).returncode


def forced_done_before() -> set:
    """What the processes this one replaced had already redone under --force (none for a fresh run)."""
    path = os.environ.pop(FORCED_DONE, None)
    if not path:
        return set()
    try:
        with open(path, encoding="utf-8") as handle:
            return {tuple(key) for key in json.load(handle)}
    except (OSError, ValueError):
        return set()
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
