"""Jobs handed to children one at a time over each child's own channel (pipeline/launchers/handout.py):
every job is reported once; a child that ends with a job owes it, said with how it ended, while
the others do the jobs still to hand out; a child that ends between jobs owes nothing and stops
nobody; and once no job is left, each child's channel is its own again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from pipeline.launchers.child import OK, Child, Reply, serve_requests
from pipeline.launchers.handout import Handout, Owed, Reported, report_job, take_job

# Seconds a handout may take to say it is over once its last child has reported or ended.
PROMPT_S = 5.0


def _takes_jobs(channel, stall_on: str | None, marker: str | None) -> None:
    """Do each job handed over (say who did it), stalling on ``stall_on`` after saying so in
    ``marker``; then answer requests over the same channel until told to stop."""
    while (job := take_job(channel)) is not None:
        if job == stall_on:
            Path(marker).write_text(str(os.getpid()))
            time.sleep(60)  # killed here
        report_job(channel, (job, os.getpid()))
    serve_requests(channel, lambda request: Reply(OK, ("still here", request)))


def _start(handout: Handout, count: int, stall_on: str | None = None, marker: Path | None = None) -> list[Child]:
    children = []
    for index in range(count):
        child = Child(_takes_jobs, stall_on, str(marker) if marker else None, name=f"pipeline-test-{index}", requests=True).start()
        handout.add_child(child)
        children.append(child)
    return children


def _stop(handout: Handout, children: list[Child]) -> None:
    handout.close()
    for child in children:
        child.stop_serving()
        child.join(5)
        child.stop(1)


def _wait_for(marker: Path) -> int:
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()):
        assert time.monotonic() < deadline, "no child stalled"
        time.sleep(0.1)
    return int(marker.read_text())


def test_every_job_is_reported_once_and_each_childs_channel_is_its_own_again():
    handout = Handout()
    children = _start(handout, 2)
    try:
        for job in "abcdef":
            handout.add(job)
        handout.last()
        events = list(handout.reports())
        assert all(isinstance(event, Reported) for event in events), events
        assert sorted(event.job for event in events) == list("abcdef")
        assert all(event.value == (event.job, event.child.pid) for event in events)  # done by the child it was handed to
        assert handout.unhanded() == []
        for child in children:  # told there are no more jobs: it answers requests now
            assert child.ask("hello") == ("still here", "hello")
    finally:
        _stop(handout, children)


def test_a_child_killed_with_a_job_owes_it_and_the_other_does_the_rest(tmp_path):
    """One child stalls on "b" and is killed with SIGKILL: "b" is owed, with how that child ended,
    every other job is done by the other child — those not yet handed out too — and the handout
    says it is over as soon as the last of them is reported, the killed child's job never."""
    handout = Handout()
    marker = tmp_path / "stalled"
    children = _start(handout, 2, stall_on="b", marker=marker)
    try:
        handout.add("a")
        handout.add("b")
        pid = _wait_for(marker)
        for job in "cdef":  # added while that child stalls: for the other
            handout.add(job)
        handout.last()
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        events = list(handout.reports())
        over_s = time.monotonic() - killed_at
        (owed,) = [event for event in events if isinstance(event, Owed)]
        assert owed.job == "b" and owed.child.pid == pid and owed.ended == "killed by SIGKILL", owed
        reported = [event for event in events if isinstance(event, Reported)]
        assert sorted(event.job for event in reported) == list("acdef")
        assert {event.child.pid for event in reported if event.job != "a"} == {child.pid for child in children} - {pid}
        assert over_s < PROMPT_S, over_s
        (survivor,) = [child for child in children if child.pid != pid]
        assert survivor.ask("hello") == ("still here", "hello")
    finally:
        _stop(handout, children)


def test_a_child_killed_between_jobs_owes_nothing_and_stops_nobody():
    """Killed while it waits for a job (as a child waiting on a shared queue would have died holding
    its lock): the other child does every job, and nothing is owed."""
    handout = Handout()
    children = _start(handout, 2)
    try:
        handout.add("a")
        handout.add("b")
        first = [next(iter(handout.reports())) for _ in range(2)]  # both jobs done: both children wait for more
        assert sorted(event.job for event in first) == ["a", "b"]
        os.kill(children[0].pid, signal.SIGKILL)
        children[0].join(5)
        for job in "cde":
            handout.add(job)
        handout.last()
        events = list(handout.reports())
        assert sorted(event.job for event in events) == list("cde") and all(isinstance(event, Reported) for event in events), events
        assert {event.child.pid for event in events} == {children[1].pid}
    finally:
        _stop(handout, children)


def test_the_jobs_no_child_lived_to_take_are_left_over():
    handout = Handout()
    children = _start(handout, 1)
    try:
        os.kill(children[0].pid, signal.SIGKILL)
        children[0].join(5)
        started = time.monotonic()
        for job in "ab":
            handout.add(job)
        handout.last()
        events = list(handout.reports())
        assert time.monotonic() - started < PROMPT_S
        # Handed to the child before it was seen to end ("a"), or never handed out ("b").
        assert [(type(event), event.job) for event in events] in ([], [(Owed, "a")]), events
        assert sorted([event.job for event in events] + handout.unhanded()) == ["a", "b"]
    finally:
        _stop(handout, children)
