"""Work split in shares across copies of this process (pipeline/launchers/shares.py): the result is
work(items) in order, an error is the one the work raises here, a copy that dies costs its share's
time only, and no copy is made where one is not safe. Work done beside (``beside``): in a copy while
this process goes on, waited for at the end, done here where the copy could not."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.launchers import shares
from pipeline.launchers.shares import beside, in_shares, share_count

PARENT = os.getpid()  # the test process: work defined here runs in copies of it too


@pytest.fixture
def three_cpus(monkeypatch):
    """Copies made as on a machine with three CPUs whatever this one has, this test process taken
    as forkable (the suite may have imported torch, on the CPU: nothing here touches it)."""
    monkeypatch.setattr(shares.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(shares, "_forkable", lambda: True)


def _squares_with_pids(items: list[int]) -> list[tuple[int, int]]:
    return [(item * item, os.getpid()) for item in items]


def _fails_at_7_and_8(items: list[int]) -> list[int]:
    for item in items:
        if item in (7, 8):
            raise ValueError(f"item {item} is broken")
    return items


def test_the_result_is_the_works_in_order_the_first_share_done_here(three_cpus):
    done = in_shares(_squares_with_pids, list(range(9)), min_share=3)
    assert [square for square, _ in done] == [item * item for item in range(9)]
    readers = [pid for _, pid in done]
    assert readers[:3] == [os.getpid()] * 3 and os.getpid() not in readers[3:]


def test_an_error_in_a_copys_share_is_raised_here_by_the_work_itself(three_cpus):
    with pytest.raises(ValueError, match="item 7 is broken"):  # the last share's: a copy's
        in_shares(_fails_at_7_and_8, list(range(9)), min_share=3)


def test_the_first_error_in_order_is_the_one_raised(three_cpus):
    items = [0, 8, 2, 3, 4, 5, 6, 7, 1]  # 8 in the first share (done here), 7 in the last
    with pytest.raises(ValueError, match="item 8 is broken"):
        in_shares(_fails_at_7_and_8, items, min_share=3)


def _dies_in_a_copy(items: list[int]) -> list[int]:
    if os.getpid() != PARENT:
        os._exit(9)  # as the kernel's OOM killer would end it: no exception, no result
    return [item + 1 for item in items]


def test_a_copy_that_dies_leaves_its_share_to_this_process(three_cpus):
    assert in_shares(_dies_in_a_copy, list(range(8)), min_share=2) == list(range(1, 9))


def test_copies_are_one_per_cpu_each_with_a_share_worth_making(three_cpus):
    assert share_count(19, 10) == 1  # two shares would each be short of ten
    assert share_count(20, 10) == 2
    assert share_count(1000, 10) == 3  # no more than the CPUs this process may use
    assert in_shares(_squares_with_pids, [1, 2, 3], min_share=10) == [(1, os.getpid()), (4, os.getpid()), (9, os.getpid())]


def test_no_copy_while_another_thread_runs(monkeypatch):
    monkeypatch.setattr(shares.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for name in shares._NOT_FORKABLE:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with monkeypatch.context() as alone:
        alone.setattr(shares.threading, "active_count", lambda: 1)
        assert share_count(100, 10) == 2  # with nothing in the way, copies are made
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert share_count(100, 10) == 1
    finally:
        stop.set()
        other.join()


@pytest.mark.parametrize("module", ["torch", "ray"])
def test_no_copy_of_a_process_that_imported_cuda_or_ray(monkeypatch, module):
    monkeypatch.setattr(shares.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(shares.threading, "active_count", lambda: 1)
    monkeypatch.setitem(sys.modules, module, object())
    assert share_count(100, 10) == 1


def test_where_no_copy_can_be_made_the_work_is_done_here(three_cpus, monkeypatch):
    def no_process_left():
        raise BlockingIOError(11, "Resource temporarily unavailable")  # fork under a pids limit

    monkeypatch.setattr(shares.os, "fork", no_process_left)
    assert in_shares(_squares_with_pids, list(range(9)), min_share=3) == [(item * item, os.getpid()) for item in range(9)]


def _interrupted_in_a_copy(items: list[int]) -> list[int]:
    if os.getpid() != PARENT:
        print("a copy's words")
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C to the copy alone
        time.sleep(5)
    return [item * 2 for item in items]


def test_a_copy_interrupted_alone_dies_quietly_and_its_share_is_done_here(three_cpus, capfd):
    assert in_shares(_interrupted_in_a_copy, list(range(9)), min_share=3) == [item * 2 for item in range(9)]
    said = capfd.readouterr()
    assert said.out == "" and said.err == ""  # no traceback, no copy's output


def _interrupted_here(folder: Path, items: list[int]) -> list[int]:
    if os.getpid() != PARENT:
        (folder / str(os.getpid())).touch()
        time.sleep(30)
        return items
    deadline = time.monotonic() + 30
    while len(list(folder.iterdir())) < 2 and time.monotonic() < deadline:  # both copies at work
        time.sleep(0.05)
    raise KeyboardInterrupt


def test_this_process_interrupted_leaves_no_copy_behind(three_cpus, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        in_shares(functools.partial(_interrupted_here, tmp_path), list(range(9)), min_share=3)
    copies = [int(path.name) for path in tmp_path.iterdir()]
    assert len(copies) == 2
    for pid in copies:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # killed and reaped, not left to finish its 30 s


_KILLED_PARENT = """
import os, sys, time
from pipeline.launchers import shares
shares._forkable = lambda: True
shares.os.sched_getaffinity = lambda pid: {0, 1, 2}
folder = sys.argv[1]
def work(items):
    if os.getpid() != parent:
        open(os.path.join(folder, str(os.getpid())), "w").close()
        time.sleep(1)
    else:
        time.sleep(60)
    return items
parent = os.getpid()
shares.in_shares(work, list(range(9)), 3)
"""


def test_copies_do_not_outlive_a_killed_process_by_more_than_their_share(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", _KILLED_PARENT, str(tmp_path)], cwd=Path(__file__).parents[2])
    deadline = time.monotonic() + 30
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    copies = [int(path.name) for path in tmp_path.iterdir()]
    assert len(copies) == 2
    process.kill()  # as SIGKILL or the OOM killer would: no cleanup here
    process.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in copies) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in copies)  # each ended once its share was done and no one read it


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (an orphan's zombie, not yet reaped by init, has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


# --- beside ------------------------------------------------------------------------------------


def _leave_pid_in(path: Path) -> None:
    """Work done for what it leaves behind: the pid of the process that did it, in a file."""
    path.write_text(str(os.getpid()))


def test_work_beside_is_done_in_a_copy_while_the_body_runs_here(three_cpus, tmp_path):
    left = tmp_path / "left"
    started = tmp_path / "started"

    def slow_work():
        started.touch()
        time.sleep(0.5)
        _leave_pid_in(left)

    with beside(slow_work):
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started.exists() and not left.exists()  # the copy at work, the body going on here
    assert int(left.read_text()) not in (os.getpid(), 0)  # waited for at the end, done by the copy


def _fails_in_a_copy(path: Path) -> None:
    if os.getpid() != PARENT:
        raise OSError("no space left on device")
    _leave_pid_in(path)


def test_work_beside_a_copy_failed_at_is_done_here_after_the_body(three_cpus, tmp_path):
    left = tmp_path / "left"
    with beside(functools.partial(_fails_in_a_copy, left)):
        pass
    assert int(left.read_text()) == os.getpid()


def test_work_beside_not_worth_a_copy_is_done_here_before_the_body(three_cpus, tmp_path):
    left = tmp_path / "left"
    with beside(functools.partial(_leave_pid_in, left), worth_a_copy=False):
        assert int(left.read_text()) == os.getpid()


def test_work_beside_is_done_here_first_on_one_cpu_or_where_no_copy_is_safe(monkeypatch, tmp_path):
    left = tmp_path / "left"
    monkeypatch.setattr(shares, "_forkable", lambda: True)
    monkeypatch.setattr(shares.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    with beside(functools.partial(_leave_pid_in, left)):
        assert int(left.read_text()) == os.getpid()  # a copy would only take turns with this process
    left.unlink()
    monkeypatch.setattr(shares.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(shares, "_forkable", lambda: False)
    with beside(functools.partial(_leave_pid_in, left)):
        assert int(left.read_text()) == os.getpid()


def test_an_error_in_the_body_waits_for_the_copys_work_and_is_raised(three_cpus, tmp_path):
    left = tmp_path / "left"

    def slow_work():
        time.sleep(0.3)
        _leave_pid_in(left)

    with pytest.raises(ValueError, match="no engine"), beside(slow_work):
        raise ValueError("no engine")
    assert int(left.read_text()) != os.getpid()  # made by the copy, as it was before the error; not done again


def test_ctrl_c_waits_for_the_copys_work_which_it_does_not_end(three_cpus, tmp_path):
    left, started = tmp_path / "left", tmp_path / "started"

    def slow_work():
        started.write_text(str(os.getpid()))
        time.sleep(0.5)
        _leave_pid_in(left)

    with pytest.raises(KeyboardInterrupt), beside(slow_work):
        deadline = time.monotonic() + 30
        while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(int(started.read_text()), signal.SIGINT)  # as a terminal's Ctrl-C reaches every process of the group
        raise KeyboardInterrupt
    assert left.read_text() == started.read_text()  # the copy finished its file; nothing half made


@pytest.fixture
def interrupted_after():
    """Ctrl-C at each of the given seconds from when it is armed (SIGALRM raising KeyboardInterrupt
    in this process, as SIGINT would): no thread, which would make the process unsafe to copy."""
    pending: list[float] = []  # when each is due (time.monotonic)

    def ctrl_c(*_):
        pending.pop(0)
        if pending:
            signal.setitimer(signal.ITIMER_REAL, max(0.001, pending[0] - time.monotonic()))
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, ctrl_c)

    def arm(*seconds: float):
        now = time.monotonic()
        pending.extend(now + after for after in seconds)
        signal.setitimer(signal.ITIMER_REAL, seconds[0])

    yield arm
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_ctrl_c_while_the_copy_is_awaited_is_raised_once_it_is_done(three_cpus, tmp_path, interrupted_after):
    left = tmp_path / "left"

    def slow_work():
        time.sleep(0.6)
        _leave_pid_in(left)

    with pytest.raises(KeyboardInterrupt), beside(slow_work):
        interrupted_after(0.2)  # the body done at once: Ctrl-C comes while the copy is awaited
    assert int(left.read_text()) != os.getpid()  # finished by the copy, not killed halfway; not done again


def test_a_second_ctrl_c_ends_the_wait_and_the_copy(three_cpus, tmp_path, interrupted_after):
    started = tmp_path / "started"

    def endless_work():
        started.write_text(str(os.getpid()))
        time.sleep(60)

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt), beside(endless_work):
        interrupted_after(0.3, 0.6)
    assert time.monotonic() - began < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(int(started.read_text()), os.WNOHANG)  # killed and reaped


def test_an_error_in_the_body_after_a_copy_failed_has_the_work_done_here(three_cpus, tmp_path):
    left = tmp_path / "left"
    with pytest.raises(ValueError, match="no engine"), beside(functools.partial(_fails_in_a_copy, left)):
        raise ValueError("no engine")
    assert int(left.read_text()) == os.getpid()
