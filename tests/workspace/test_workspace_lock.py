"""One run at a time per workspace, tested with real concurrent `pipeline` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import TINY_CATALOG, write_catalog

# Long enough a profile that a second process certainly starts while the first holds the lock.
CATALOG = TINY_CATALOG.replace("duration_s = 0.05", "duration_s = 4")


def pipeline(catalog, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "--catalog", str(catalog), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def holder(catalog) -> dict:
    """Who holds the lock, once a process has taken it."""
    path = catalog.parent / "manifests" / ".workspace.lock"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise AssertionError("no process took the workspace lock")


@pytest.fixture
def catalog(tmp_path):
    return write_catalog(tmp_path / "ws", CATALOG)


def test_a_second_run_fails_at_once_naming_the_first(catalog):
    first = pipeline(catalog, "run", "--variant", "fp32", start_new_session=True)
    try:
        assert holder(catalog)["pid"] == first.pid
        os.killpg(first.pid, signal.SIGSTOP)  # holds the lock however slow the second's start
        code, err = finish(pipeline(catalog, "run", "--variant", "fp32"), timeout=120)
        assert first.poll() is None  # the second gave up while the first was still running
        assert code == 1
        assert (
            f"ERROR another pipeline run holds this workspace (pid {first.pid}, `pipeline --catalog {catalog} run --variant fp32`, since "
            in err
        )
        assert "TIP" in err and "--wait" in err
    finally:
        os.killpg(first.pid, signal.SIGCONT)
        assert finish(first)[0] == 0


def test_wait_queues_behind_the_first_and_then_finds_nothing_to_redo(catalog):
    first = pipeline(catalog, "run", "--variant", "fp32")
    holder(catalog)
    second = pipeline(catalog, "run", "--variant", "fp32", "--wait")
    code, err = finish(second)
    first_code, _ = finish(first)
    assert first_code == 0 and code == 0
    assert "waiting for the run holding this workspace to finish (pid" in err
    assert err.count("didn't change, skipping") == 3  # export, build and profile were the first's


def test_a_holder_killed_with_sigkill_is_taken_over_with_a_warning(catalog):
    first = pipeline(catalog, "run", "--variant", "fp32")
    holder(catalog)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    code, err = finish(pipeline(catalog, "run", "--variant", "fp32"))
    assert code == 0, err
    assert f"WARNING the previous run on this workspace (pid {first.pid}, " in err and "stopped without releasing it" in err
    # Released normally this time: the next run has nothing to warn about.
    code, err = finish(pipeline(catalog, "run", "--variant", "fp32"))
    assert code == 0 and "WARNING" not in err


def test_read_only_commands_take_no_lock(catalog):
    # The run is stopped (SIGSTOP, its whole session) while the read-only commands run, so that it
    # certainly still holds the lock whatever the host's speed; a command that asked for the lock
    # would fail at once naming it, or hang with --wait until `finish` times out.
    first = pipeline(catalog, "run", "--variant", "fp32", start_new_session=True)
    try:
        assert holder(catalog)["pid"] == first.pid
        os.killpg(first.pid, signal.SIGSTOP)
        for args in (("models",), ("doctor",), ("profile", "--variant", "fp32", "--dry-run")):
            code, err = finish(pipeline(catalog, *args), timeout=120)
            assert code == 0, (args, err)
        assert first.poll() is None
        assert holder(catalog)["pid"] == first.pid
    finally:
        os.killpg(first.pid, signal.SIGCONT)
        assert finish(first)[0] == 0


def test_sigterm_mid_run_cleans_up_like_ctrl_c(tmp_path):
    """What `docker stop`, a scheduler or a CI timeout sends: exit 143, nothing half-written, the
    workspace released normally."""
    catalog = write_catalog(tmp_path / "ws", CATALOG)
    run = pipeline(catalog, "run", "--variant", "fp32", "--variant", "fp16")
    holder(catalog)
    time.sleep(1.5)  # inside the first export
    run.send_signal(signal.SIGTERM)
    code, err = finish(run)
    assert code == 143, err
    assert "ERROR terminated (SIGTERM); partial outputs were removed, finished ones are kept." in err
    leftovers = [p for p in (catalog.parent).rglob("*") if p.name.endswith(".tmp") or ".partial" in p.name]
    assert leftovers == []
    code, err = finish(pipeline(catalog, "run", "--variant", "fp32"))
    assert code == 0 and "stopped without releasing it" not in err


def test_the_next_run_removes_the_half_written_file_of_a_run_killed_mid_export(catalog):
    first = pipeline(catalog, "run", "--variant", "fp32")
    models = catalog.parent / "models"
    deadline = time.monotonic() + 120
    leftovers = []
    while not leftovers and time.monotonic() < deadline and first.poll() is None:
        leftovers = list(models.rglob(".*.tmp")) if models.is_dir() else []
        time.sleep(0.005)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert leftovers, "the export finished before it could be killed mid-write"
    assert [p for p in leftovers if p.exists()], "the kill left no half-written file to clean up"
    code, err = finish(pipeline(catalog, "run", "--variant", "fp32"))
    assert code == 0, err
    assert "removed 1 half-written file(s) a killed run left behind: models/" in err
    assert not list(catalog.parent.rglob(".*.tmp"))
