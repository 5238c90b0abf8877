"""scripts/sample_stacks.py: a command run with its main thread's stack sampled, its exit status kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "sample_stacks.py"


def test_the_main_threads_stack_is_sampled_and_the_exit_status_kept(tmp_path):
    (tmp_path / "sleeper.py").write_text("import sys, time\n\ndef nap():\n    time.sleep(0.6)\n\nnap()\nsys.exit(3)\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "stacks-{pid}.txt"), "0.05", "sleeper"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 3, done.stderr
    (written,) = tmp_path.glob("stacks-*.txt")
    assert written.name != "stacks-{pid}.txt" and written.stem.split("-")[1].isdigit()
    lines = [line.split("\t") for line in written.read_text().splitlines()]
    assert len(lines) >= 5
    assert all(float(seconds) < 5 for seconds, _ in lines)
    assert any(stack.split(";")[-1].startswith(f"{tmp_path.name}/sleeper.py:nap:4") for _, stack in lines), lines[:3]
