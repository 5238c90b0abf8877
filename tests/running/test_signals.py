"""Ctrl-C and SIGTERM end a command as the signals document (exit 130, 143), at any moment:
never an internal error, never a half-written file (pipeline/running/signals.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from pipeline.running.signals import Terminated, sigterm_as_interrupt
from tests.conftest import TINY_CATALOG, write_catalog

TORCH_EAGER = """
[toolchains.torch-eager]
kind = "torch"
backend = "eager"
"""

# An import that takes a moment, signalled by itself in the middle of it.
SLOW_IMPORT = """
import os, signal, time
os.kill(os.getpid(), signal.{name})
time.sleep(0.3)
finished = True
"""


@pytest.mark.parametrize(("name", "raised"), [("SIGTERM", Terminated), ("SIGINT", KeyboardInterrupt)])
def test_a_signal_during_an_import_lands_after_it(tmp_path, monkeypatch, name, raised):
    """Python's import machinery is not safe against an exception at any bytecode (a module left
    half-made in sys.modules): the signal is delivered once the import is done."""
    module = f"signalled_{name.lower()}"
    (tmp_path / f"{module}.py").write_text(SLOW_IMPORT.format(name=name))
    monkeypatch.syspath_prepend(tmp_path)
    # Ctrl-C as an interactive shell leaves it: a shell without job control starts a background
    # job (a CI runner's, say) with SIGINT ignored, and an ignored SIGINT rightly stays ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with sigterm_as_interrupt(), pytest.raises(raised):
            __import__(module)
            imported = sys.modules[module]
            time.sleep(5)  # the signal, sent again, lands here
    finally:
        signal.signal(signal.SIGINT, previous)
    assert imported.finished
    assert sys.modules[module] is imported


def test_sigterm_at_any_moment_of_a_pytorch_build_exits_143(tmp_path):
    """SIGTERM at several moments of `pipeline build` on torch-eager (imports of torch and timm,
    the model made and saved): each run ends with exit 143 and the clean-up's words; nothing is
    left half-written. Once in about 25 tries a signal inside torch's import left numpy.linalg
    half-made, and the command ended in an internal error (a RecursionError)."""
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + TORCH_EAGER)
    command = [sys.executable, "-m", "pipeline.cli", "--catalog", str(catalog)]
    subprocess.run([*command, "export", "--engine", "tiny_fp32"], check=True, capture_output=True)
    codes = []
    for moment in (0.2, 0.35, 0.5, 0.65, 0.8, 1.0, 1.3, 1.6):
        build = subprocess.Popen(
            [*command, "build", "--engine", "tiny_fp32", "--toolchain", "torch-eager", "--force"], stderr=subprocess.PIPE, text=True
        )
        time.sleep(moment)
        build.send_signal(signal.SIGTERM)
        _, err = build.communicate(timeout=120)
        codes.append(build.returncode)
        assert "Traceback" not in err and "INTERNAL ERROR" not in err, (moment, err)
        if build.returncode == 143:
            assert "ERROR terminated (SIGTERM); partial outputs were removed, finished ones are kept." in err, err
        else:
            assert build.returncode == 0, (moment, err)  # it finished before the signal
        half_written = [p for p in catalog.parent.rglob("*") if p.name.endswith(".tmp") or ".partial" in p.name]
        assert half_written == [], (moment, half_written)
    assert codes.count(143) >= 6, codes  # the signal came during the build, not after it
