"""Whether torch and torchvision make a pair, for `pipeline doctor`, and the command that makes one.

torchvision is built against one torch release and one build of it: torchvision 0.(N+15).P goes
with torch 2.N.P (the compatibility table of github.com/pytorch/vision's README: 0.19 ↔ 2.4 …
0.28 ↔ 2.13), and a ``+cpu`` torch needs the ``+cpu`` torchvision of PyTorch's CPU index (PyPI has
no CPU build of torchvision: its wheels link against CUDA torch's libraries). A torch from one index
beside a torchvision from another imports torch and timm (pipeline/models/torch_import.py stubs
torchvision's fake kernels) but not torchvision itself ("operator torchvision::nms does not exist"),
so torchvision's own ops (nms, roi_align, deform_conv2d) do not run.
"""

from __future__ import annotations

import re
import subprocess
import sys

# PyTorch's wheel indexes, one per build: /whl/cpu, /whl/cu128 … (pytorch.org/get-started/locally).
WHEEL_INDEXES = "https://download.pytorch.org/whl"


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release built for ``torch_version`` ("2.13.0+cpu" → "0.28.0"), or None for a torch 1.x or unreadable one."""
    found = re.match(r"2\.(\d+)\.(\d+)", torch_version)
    return f"0.{int(found[1]) + 15}.{found[2]}" if found else None


def build_tag(version: str) -> str | None:
    """A wheel's local build tag ("2.13.0+cpu" → "cpu", "2.13.0+cu128" → "cu128"), or None (PyPI's own build)."""
    return version.partition("+")[2] or None


def fix_command(torch_version: str, python: str | None = None) -> str:
    """The command that reinstalls a matching pair over the installed one, from torch's own index."""
    python = python or sys.executable
    release = torch_version.partition("+")[0]
    tag = build_tag(torch_version)
    command = f"{python} -m pip install --force-reinstall --no-deps torch=={release} torchvision=={matching_torchvision(torch_version)}"
    return command + (f" --index-url {WHEEL_INDEXES}/{tag}" if tag else "")


def torchvision_import_error(python: str | None = None) -> str | None:
    """Why ``import torchvision`` fails in a fresh interpreter (the last line it printed), or None
    where it imports. A fresh one, since this process may hold torchvision already, stubbed."""
    try:
        done = subprocess.run([python or sys.executable, "-c", "import torchvision"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit status {done.returncode}")


def pair_problem(torch_version: str, torchvision_version: str, import_error: str | None) -> str | None:
    """What is wrong with this pair, in words, with what it costs and the fix; None where it is a pair."""
    expected = matching_torchvision(torch_version)
    wrong = []
    if import_error is not None:
        wrong.append(f"`import torchvision` fails ({import_error})")
    if expected is not None and torchvision_version.partition("+")[0] != expected:
        wrong.append(f"torch {torch_version.partition('+')[0]} goes with torchvision {expected}")
    if build_tag(torch_version) != build_tag(torchvision_version) and (build_tag(torch_version) or "").startswith("cpu"):
        wrong.append("torchvision is not the +cpu build (PyPI's links against CUDA torch)")
    if not wrong:
        return None
    return (
        f"torch {torch_version} with torchvision {torchvision_version}: {'; '.join(wrong)}. timm models still export, "
        f"torchvision's own ops (nms, roi_align) do not. Fix: {fix_command(torch_version)}"
    )
