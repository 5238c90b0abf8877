"""A point task's share of its node's CPUs (pipeline/cluster/cpu_share.py), on made-up topologies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cluster.cpu_share import claimed_share, shares
from pipeline.machine.environment import physical_cores


def topology(root: Path, cpus: dict[int, tuple[int, int]]) -> Path:
    """A /sys/devices/system/cpu of ``cpus``: CPU -> (socket, core)."""
    for cpu, (socket, core) in cpus.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{socket}\n")
        (folder / "core_id").write_text(f"{core}\n")
    return root


# Two sockets of four cores, two threads each, numbered as Linux numbers them on x86: every
# core's first thread (0-7), then their siblings (8-15).
TWO_SOCKETS = {cpu: (cpu % 8 // 4, cpu % 4) for cpu in range(16)}


def test_hardware_threads_of_one_core_stay_together(tmp_path):
    sys_cpu = topology(tmp_path, TWO_SOCKETS)
    assert physical_cores(list(range(16)), sys_cpu)[:2] == [(0, 8), (1, 9)]
    # Two GPUs: a socket each, never a core's two threads in two shares.
    assert shares(list(range(16)), 2, sys_cpu) == [(0, 8, 1, 9, 2, 10, 3, 11), (4, 12, 5, 13, 6, 14, 7, 15)]
    four = shares(list(range(16)), 4, sys_cpu)
    assert [len(share) for share in four] == [4, 4, 4, 4] and four[0] == (0, 8, 1, 9)


def test_uneven_and_too_few_cores(tmp_path):
    sys_cpu = topology(tmp_path, {cpu: (0, cpu) for cpu in range(5)})
    assert shares(list(range(5)), 2, sys_cpu) == [(0, 1), (2, 3, 4)]
    # One core of two threads for two GPUs: a thread each rather than nothing.
    one_core = topology(tmp_path / "one", {0: (0, 0), 1: (0, 0)})
    assert shares([0, 1], 2, one_core) == [(0,), (1,)]
    assert shares([0], 2, one_core) == []


def test_a_cpu_without_topology_is_a_core_of_its_own(tmp_path):
    assert physical_cores([3, 1], tmp_path) == [(1,), (3,)]


CLAIM = """
import sys
from pathlib import Path
from pipeline.cluster.cpu_share import claimed_share
with claimed_share(2, Path(sys.argv[1])) as share:
    print(list(share) if share else None, flush=True)
    sys.stdin.read()  # held until the test closes our stdin (or kills us)
"""


def claiming(directory: Path) -> tuple[subprocess.Popen, list[int] | None]:
    """A process that claims one of two shares and holds it, and the share it got."""
    process = subprocess.Popen([sys.executable, "-c", CLAIM, str(directory)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return process, json.loads(process.stdout.readline().replace("None", "null"))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process that may run on two CPUs")
def test_two_tasks_at_once_get_different_shares_and_a_killed_ones_is_free_again(tmp_path):
    first, first_share = claiming(tmp_path)
    second, second_share = claiming(tmp_path)
    try:
        assert first_share and second_share and not set(first_share) & set(second_share)
        # A third while both are held: no share left, so it runs where the OS puts it.
        with claimed_share(2, tmp_path) as third:
            assert third is None
        first.kill()  # killed, not finished: the kernel lets its lock go all the same
        first.wait()
        with claimed_share(2, tmp_path) as again:
            assert again is not None and list(again) == first_share
    finally:
        for process in (first, second):
            process.kill()
            process.wait()
    # One GPU on the node: no share to claim, the whole node is its.
    with claimed_share(1, tmp_path) as whole:
        assert whole is None
