"""The command again, in a fresh process: after a kernel fault poisoned this one's CUDA context.

CUDA's documentation says a process whose context a sticky error poisoned must be terminated and
relaunched (pipeline/running/faults.py names the errors). The fault is recorded for its point and
toolchain before this runs, so the fresh process finds what was done current, skips it, and goes on
with the rest; what this run's --force already redid is handed over so that it is not redone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

# How many times one command replaces its process after faults before it gives up: each fault is
# recorded, so each replacement makes progress; a bound all the same, against a fault that is not.
MAX_REPLACEMENTS = 32
# What a replaced process is told by its predecessor (environment variables).
REPLACED = "PIPELINE_REPLACED_AFTER_FAULTS"
FORCED_DONE = "PIPELINE_FORCED_DONE"


def go_on_in_fresh_process(args: list[str], done: set, replace: bool) -> int:
    """Run the same command again in a fresh process: ``replace`` this process with it (exec; the
    command line's own run), or wait for it as a child (a caller that called main() in its own
    process). ``done``: what this run's --force already redid. The exit status is the fresh
    process's."""
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
