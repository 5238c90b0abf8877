"""A measurement whose own CPUs are slowed part-way — a cgroup CPU quota put on the measuring process
while its rounds run, nothing queued beside it, so the busy flag has nothing to see — is flagged
`host slowed` and left out of the answer; the same measurement unslowed is not, on a host whose
CPUs change speed in spells of their own (a 2-vCPU KVM guest of an AMD EPYC)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import DATA, REPO_ROOT, catalog_head, write_catalog

pytest.importorskip("torch", reason="the python model family needs torch (`make setup` installs it)")

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
# 1 ms of CPU every 10 ms: a tenth of one CPU.
PERIOD_US, QUOTA_US = 10_000, 1_000


class Quota:
    """A cgroup whose CPU quota is a tenth of a CPU (v1's cpu controller, or v2's), or a reason
    there is none to make here."""

    def __init__(self):
        self.path, self.why_not = None, None
        name = f"pipeline-test-{uuid.uuid4().hex[:8]}"
        try:
            if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
                self.path = CGROUP_V1 / name
                self.path.mkdir()
                (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
            elif "cpu" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
                self.path = CGROUP_V2 / name
                self.path.mkdir()
                (self.path / "cpu.max").write_text(f"{QUOTA_US} {PERIOD_US}")
            else:
                self.why_not = "no cgroup CPU controller on this machine"
        except OSError as exc:
            self.why_not = f"cannot make a cgroup with a CPU quota here ({exc.strerror}; it needs root)"
            self.path = None

    def hold(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        if self.path is not None:
            for _ in range(50):  # its processes have to leave it first
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


@pytest.fixture
def quota():
    made = Quota()
    if made.path is None:
        pytest.skip(f"needs a cgroup CPU quota: {made.why_not}")
    yield made
    made.remove()


def workspace(root: Path) -> Path:
    text = (
        catalog_head(["mlp"], ["fp32"], baseline="onnxruntime")
        + f'\n[models.mlp]\npython = "{DATA / "python_models" / "memory_bound.py"}:make"\n'
        + 'config = { features = 64, budget = 100000000 }\nshapes = ["8x32"]\n'
        + '\n[variants.fp32]\nprecision = "fp32"\n\n[toolchains.onnxruntime]\nkind = "onnxruntime"\nbaselines = ["fp32"]\n'
    )
    path = write_catalog(root, text)
    # Long enough rounds to slow part-way: 60 takes of at least 20 ms.
    path.write_text(path.read_text().replace("take_ms = 5", "take_ms = 20\nmin_rounds = 60\nbudget_s = 120"))
    return path


def pipeline(catalog: Path, *args: str, cache: Path, background: bool = False):
    env = {**os.environ, "PIPELINE_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "pipeline", "--catalog", str(catalog), *args]
    if background:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def held_whole(lock: Path) -> bool:
    """Whether a point's rounds hold the host whole (pipeline/measuring/host_rounds.py): from then on the
    rounds it keeps are under way."""
    if not lock.exists():
        return False
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def measured(root: Path, quota: Quota | None):
    catalog, cache = workspace(root), root / "cache"
    prepared = pipeline(catalog, "build", cache=cache)
    assert prepared.returncode == 0, prepared.stderr
    profile = pipeline(catalog, "profile", cache=cache, background=True)
    if quota is not None:
        deadline = time.monotonic() + 120
        while not held_whole(cache / "host-rounds.lock"):
            assert profile.poll() is None and time.monotonic() < deadline, profile.communicate()
            time.sleep(0.02)
        time.sleep(0.3)  # a dozen takes at the host's own speed, then a tenth of a CPU
        quota.hold(profile.pid)
    _, err = profile.communicate(timeout=600)
    assert profile.returncode == 0, err
    compared = pipeline(catalog, "compare", "--format", "json", cache=cache)
    assert compared.returncode == 0, compared.stderr
    report = json.loads(compared.stdout)
    (row,) = [row for row in report["rows"] if row["toolchain"] == "onnxruntime"]
    manifest = json.loads((root / "manifests" / "onnxruntime" / "mlp_fp32@8x32.json").read_text())
    return row, report["verdicts"][0], manifest["profile"]["details"]["rounds"][0]


def test_a_measurement_slowed_by_a_cpu_quota_part_way_is_flagged_host_slowed_and_left_out(quota, tmp_path):
    row, verdict, rounds = measured(tmp_path / "slowed", quota)
    slowed = [flag for flag in row["flags"] if flag.startswith("host slowed")]
    assert slowed, row["flags"]
    assert "its cgroup's CPU quota held it off" in slowed[0]  # the evidence of who slowed it
    assert not any(flag.startswith("busy") for flag in row["flags"]), row["flags"]  # nothing queued beside it
    assert [entry["why"] for entry in verdict["excluded"]] == slowed
    slowdowns = [take["host_slowdown"] for take in rounds["takes"]]
    assert slowdowns[0] < 1.5 and max(slowdowns) > 3  # part-way: the first take at the host's own speed
    assert rounds["host_held"] == "whole"  # a CPU engine's time is the host's: its rounds held the host


def test_the_same_measurement_unslowed_is_not_flagged(tmp_path):
    row, verdict, rounds = measured(tmp_path / "alone", None)
    assert not any(flag.startswith("host slowed") for flag in row["flags"]), row["flags"]
    assert verdict["excluded"] == [] and rounds["host_alone_probe_ms"] > 0
    assert all(take["host_throttled"] == 0 and take["host_others_cpus"] is not None for take in rounds["takes"])
