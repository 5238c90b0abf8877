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

    python scripts/install_torch.py --python .venv/bin/python --index URL torch==2.13.0 torchvision==0.28.0
    python scripts/install_torch.py --python .venv/bin/python --index '' torch   # pip's own indexes
"""

from __future__ import annotations

import argparse
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

    def probe() -> None:
        try:
            with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=timeout_s):  # its page, unread
                outcome.append(None)
        except urllib.error.HTTPError as exc:
            outcome.append(f"HTTP {exc.code}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            outcome.append(str(reason) or type(exc).__name__)

    worker = threading.Thread(target=probe, daemon=True)  # name resolution ignores socket time-outs
    worker.start()
    worker.join(timeout_s)
    return outcome[0] if outcome else f"no answer in {timeout_s:g} s"


def pip_command(python: str, packages: list[str], index: str | None) -> list[str]:
    command = [python, "-m", "pip", "install", "-q", *packages]
    return command + ["--index-url", index] if index else command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose environment gets torch")
    parser.add_argument("--index", default="", help="PyTorch's CPU wheel index, or another; empty: pip's own indexes")
    parser.add_argument("packages", nargs="+")
    args = parser.parse_args(argv)
    index = args.index.strip() or None
    if index is not None:
        why = reachable(index)
        if why is None:
            print(f"setup: torch from {index}", file=sys.stderr)
        else:
            print(
                f"setup: {index} cannot be reached ({why}); installing {' '.join(args.packages)} from pip's own indexes "
                "(on Linux, PyPI's is the CUDA build: several GB)",
                file=sys.stderr,
            )
            index = None
    return subprocess.call(pip_command(args.python, args.packages, index))


if __name__ == "__main__":
    sys.exit(main())
