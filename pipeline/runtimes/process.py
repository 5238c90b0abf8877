"""Running an outside tool as a child process: output streamed with -v and saved, a time limit,
and nothing left running when the tool is killed, times out, or the user presses Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from pipeline.launchers.child import signal_name
from pipeline.running.errors import EnvironmentMissing, ToolStopped
from pipeline.running.files import atomic_write_text
from pipeline.running.reporting import Reporter


@dataclass
class Finished:
    exit_code: int
    output: str

    @property
    def killed(self) -> bool:
        """Ended by SIGKILL: the out-of-memory killer, or someone stopping it."""
        return self.exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL)

    @property
    def signal(self) -> str | None:
        """The signal that ended it ("SIGSEGV"), or None where it exited (signal_name)."""
        return signal_name(self.exit_code)


def run_logged(
    argv: list[str],
    *,
    log_path: Path,
    timeout_s: float,
    reporter: Reporter,
    what: str,
    env: dict[str, str] | None = None,
) -> Finished:
    """Run ``argv``, stream its output (stdout and stderr together) to -v and to ``log_path``."""
    lines: list[str] = []
    try:
        # Its own process group, so a timeout or Ctrl-C also ends anything the tool started.
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, errors="replace", start_new_session=True
        )
    except OSError as exc:
        raise EnvironmentMissing(f"cannot run {argv[0]}: {exc.strerror or exc}.") from exc

    def follow():
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            reporter.tool_output(what, line.rstrip("\n"))

    # Read in a thread so the time limit holds even when the tool hangs without printing.
    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        exit_code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.wait()
        reader.join(timeout=5)
        atomic_write_text(log_path, "".join(lines))
        raise ToolStopped(
            f"{what} ran past its {timeout_s:g} s limit and was killed.", hint=f"log so far: {log_path}", why="ran past its time limit"
        ) from None
    finally:
        if process.poll() is None:  # Ctrl-C: do not leave the tool running
            _kill_group(process)
            process.wait()
    reader.join(timeout=5)
    text = "".join(lines)
    atomic_write_text(log_path, text)
    return Finished(exit_code, text)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
