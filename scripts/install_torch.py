"""`make setup`'s torch: the small CPU build from PyTorch's CPU wheel index where that index can be
reached, else whatever pip's own indexes have — said in one line, within seconds.

PyTorch's install instructions (pytorch.org/get-started/locally: Linux or Windows, pip, CPU) name
``--index-url https://download.pytorch.org/whl/cpu``: its wheels are ``+cpu`` builds with no CUDA
libraries, and it carries torch's own dependencies. Without it, pip on Linux takes the CUDA build
from PyPI (``nvidia-cudnn-cu13`` and the rest: several GB). The index is tried first with a
short request on a thread of its own, so an index behind a firewall that drops packets costs
``PROBE_S`` seconds, not pip's retries and time-outs; then pip installs from it, or, where it
cannot be reached (an offline mirror, a machine whose package access is limited to its own
mirrors), from pip's configured indexes as it would without this script.

An index the user named (``--named``: ``make setup TORCH_INDEX=URL``) is used or the set-up fails:
falling back would install another build than the one asked for. On a machine with an NVIDIA GPU
(``nvidia-smi -L`` lists one) the default CPU index is not used: a CUDA build of torch already
installed is kept, else pip's own indexes give one (PyPI's Linux torch wheels are CUDA builds).
Afterwards it says which torch it gave, and whether torchvision imports beside it (a torch from
one index beside a torchvision from another does not: ``pipeline doctor`` prints the fix).

    python scripts/install_torch.py --python .venv/bin/python --index URL torch==2.13.0 torchvision==0.28.0
    python scripts/install_torch.py --python .venv/bin/python --index '' torch   # pip's own indexes
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request

PROBE_S = 5.0


def reachable(index: str, timeout_s: float | None = None) -> str | None:
    """None where ``index`` answers for torch within ``timeout_s`` (PROBE_S); else why not, in a few words."""
    timeout_s = PROBE_S if timeout_s is None else timeout_s
    outcome: list[str | None] = []
    no_answer = f"no answer in {timeout_s:g} s"

    def probe() -> None:
        try:
            with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=timeout_s):  # its page, unread
                outcome.append(None)
        except urllib.error.HTTPError as exc:
            outcome.append(f"HTTP {exc.code}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            # The socket's own time-out and the join below race for a silent index: both say it the same way.
            silent = isinstance(reason, TimeoutError)
            outcome.append(no_answer if silent else str(reason) or type(exc).__name__)

    worker = threading.Thread(target=probe, daemon=True)  # name resolution ignores socket time-outs
    worker.start()
    worker.join(timeout_s)
    return outcome[0] if outcome else no_answer


def pip_command(python: str, packages: list[str], index: str | None) -> list[str]:
    command = [python, "-m", "pip", "install", "-q", *packages]
    return command + ["--index-url", index] if index else command


def nvidia_gpu() -> str | None:
    """The first NVIDIA GPU ``nvidia-smi -L`` lists ("GPU 0: NVIDIA H100 …"), or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((line.strip() for line in listed.stdout.splitlines() if line.startswith("GPU ")), None)


def installed_torch(python: str) -> tuple[str, str | None] | None:
    """(torch's version, its CUDA release or None for a CPU build) in ``python``'s environment, or None."""
    probe = "import torch; print(torch.__version__); print(torch.version.cuda or '')"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split("\n")
    return (lines[0].strip(), lines[1].strip() or None) if done.returncode == 0 and len(lines) > 1 else None


def torchvision_fails(python: str) -> str | None:
    """Why ``import torchvision`` fails beside the torch installed (its last line), or None where it imports."""
    try:
        done = subprocess.run([python, "-c", "import torchvision"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit status {done.returncode}")


def choose_index(index: str | None, named: bool, python: str, packages: list[str]) -> tuple[str | None, bool] | int:
    """(the index pip installs from, None for pip's own; whether to install at all), or an exit status."""
    gpu = nvidia_gpu() if not named else None
    if gpu is not None:
        torch = installed_torch(python)
        if torch is not None and torch[1]:
            print(f"setup: keeping torch {torch[0]}, the CUDA {torch[1]} build already installed ({gpu})", file=sys.stderr)
            return None, False
        print(f"setup: {gpu}: the CUDA build of torch from pip's own indexes (PyPI's Linux wheels are CUDA builds)", file=sys.stderr)
        return None, True
    if index is None:
        return None, True
    why = reachable(index)
    if why is None:
        print(f"setup: torch from {index}", file=sys.stderr)
        return index, True
    if named:
        print(
            f"ERROR TORCH_INDEX={index} cannot be reached ({why}): the set-up stops rather than install torch from another index.\n"
            "TIP check the URL and the network, or leave TORCH_INDEX out for the default (TORCH_INDEX= for pip's own indexes)",
            file=sys.stderr,
        )
        return 1
    print(
        f"setup: the default torch index {index} cannot be reached ({why}); installing {' '.join(packages)} from pip's own "
        "indexes instead (on Linux, PyPI's is the CUDA build: several GB)",
        file=sys.stderr,
    )
    return None, True


def say_what_was_installed(python: str) -> None:
    torch = installed_torch(python)
    if torch is None:
        return
    build = f"the CUDA {torch[1]} build" if torch[1] else "the CPU build"
    failing = torchvision_fails(python)
    if failing is None:
        print(f"setup: torch {torch[0]} ({build}); torchvision imports beside it", file=sys.stderr)
    else:
        print(
            f"setup: WARNING torch {torch[0]} ({build}) with a torchvision that does not import beside it ({failing}): "
            "timm models work, torchvision's own ops do not; `pipeline doctor` prints the command that fixes the pair",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose environment gets torch")
    parser.add_argument("--index", default="", help="PyTorch's CPU wheel index, or another; empty: pip's own indexes")
    parser.add_argument("--named", action="store_true", help="the user named the index: use it or fail, never fall back")
    parser.add_argument("packages", nargs="+")
    args = parser.parse_args(argv)
    chosen = choose_index(args.index.strip() or None, args.named, args.python, args.packages)
    if isinstance(chosen, int):
        return chosen
    index, install = chosen
    status = subprocess.call(pip_command(args.python, args.packages, index)) if install else 0
    if status == 0:
        say_what_was_installed(args.python)
    return status


if __name__ == "__main__":
    sys.exit(main())
