"""nvidia-smi, asked in one place: the GPUs (name, driver, compute capability, memory), what they
are doing (utilisation, clocks, temperature), and the processes on them.

Standard library only, and importing nothing of the product: the cluster's probe
(pipeline/cluster/probe.py) is sent to the nodes by value with this module, so that it answers even
on a node where the product is not installed.
"""

from __future__ import annotations

import shutil
import subprocess

# Seconds nvidia-smi has to answer: a driver in trouble can hang it.
TIMEOUT_S = 20


def present() -> bool:
    """Whether nvidia-smi is on PATH (the NVIDIA driver is installed)."""
    return shutil.which("nvidia-smi") is not None


def query(fields: str, what: str = "gpu") -> list[list[str]]:
    """``nvidia-smi --query-<what>=<fields>``: a row of values per GPU (or per process, with
    ``what="compute-apps"``), without units; [] where nvidia-smi is missing, fails or hangs."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, f"--query-{what}={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [[value.strip() for value in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]
