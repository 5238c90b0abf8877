"""The host memory a new process may still take (pipeline/machine/environment.py,
host_memory_available): the kernel's MemAvailable, or what the process's cgroup leaves where that
is less, read from files laid out as Linux lays them out."""

from __future__ import annotations

from pipeline.machine.environment import host_memory_available

MEMINFO = "MemTotal:       32768000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\nBuffers:          100 kB\n"


def _machine(root, cgroup_line: str = "0::/user.slice/run.scope", limit: str | None = None, current: int = 0):
    proc, cgroups = root / "proc", root / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    if limit is not None:
        group = cgroups / "user.slice" / "run.scope"
        group.mkdir(parents=True)
        (group / "memory.max").write_text(limit + "\n")
        (group / "memory.current").write_text(f"{current}\n")
    return proc, cgroups


def test_memavailable_where_no_cgroup_limits_the_process(tmp_path):
    assert host_memory_available(*_machine(tmp_path / "none")) == 20000000 * 1024
    assert host_memory_available(*_machine(tmp_path / "max", limit="max")) == 20000000 * 1024
    assert host_memory_available(*_machine(tmp_path / "v1", cgroup_line="4:memory:/docker/abc")) == 20000000 * 1024


def test_a_cgroup_that_allows_less_than_memavailable_is_what_is_left(tmp_path):
    proc, cgroups = _machine(tmp_path, limit=str(8 << 30), current=3 << 30)
    assert host_memory_available(proc, cgroups) == 5 << 30
    roomy = _machine(tmp_path / "roomy", limit=str(64 << 30), current=1 << 30)
    assert host_memory_available(*roomy) == 20000000 * 1024


def test_nothing_to_read_says_none(tmp_path):
    assert host_memory_available(tmp_path / "no-proc", tmp_path / "no-cgroup") is None
