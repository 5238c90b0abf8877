"""The one way work leaves the command's process (pipeline/launchers/child.py): a new interpreter
whose reply — a value, or the pipeline's own error — reaches the parent as it was given; a child
that ends without one is a PipelineError naming how it ended; a parent interrupted while it waits
stops its child; a child that answers requests does so one at a time until told to stop."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipeline.launchers.child import Child, ChildEnded, Reply, answer_with, ended_words, inheritable, serve_requests
from pipeline.running.errors import DeviceFault, PipelineError, UsageError


def _replies(channel, what: str) -> None:
    def work():
        if what == "usage":
            raise UsageError("no such model 'vitt'.", hint="`pipeline models` lists them")
        if what == "fault":
            raise DeviceFault("faulted on the GPU: an illegal memory access was encountered", facts={"error": "illegal"})
        if what == "bug":
            raise ZeroDivisionError("division by zero")  # not the pipeline's own: the child's bug
        if what == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        if what == "sleep":
            time.sleep(60)
        return {"pid": os.getpid(), "what": what}

    answer_with(channel, work)


def _what_it_has(channel) -> None:
    import sys

    answer_with(
        channel,
        lambda: {
            "preloaded": PRELOADED in sys.modules,
            "said": os.environ.get("PIPELINE_TEST_SAID"),
            "nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
            "pid": os.getpid(),
        },
    )


# Imported by the compiling processes' preload (one server a process: the suite's compiling tests
# may have started it first, with that list), and by nothing a new interpreter here imports.
PRELOADED = "torch._inductor.compile_fx"


def test_a_child_with_preloaded_modules_has_them_and_this_processes_environment_now(monkeypatch):
    """Forked from a server that imported ``preload`` first: the modules are there before the child
    imports anything, and the environment is this process's as it is when the child starts, not
    as it was when the server started."""
    pytest.importorskip("torch")
    from pipeline.runtimes.pytorch.compile_process import PRELOAD

    monkeypatch.setenv("PIPELINE_TEST_SAID", "first")
    first = Child(_what_it_has, name="pipeline-test", preload=PRELOAD).start().result("testing")
    monkeypatch.setenv("PIPELINE_TEST_SAID", "second")
    second = Child(_what_it_has, name="pipeline-test", preload=PRELOAD).start().result("testing")
    assert first["preloaded"] and second["preloaded"] and first["pid"] != second["pid"] != os.getpid()
    assert (first["said"], second["said"]) == ("first", "second")
    # The server asks NVML whether there is a GPU (preload.py); its children do as this process does.
    assert first["nvml_check"] == second["nvml_check"] == os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    bare = Child(_what_it_has, name="pipeline-test").start().result("testing")
    assert not bare["preloaded"]  # a new interpreter imports only what it needs


def test_a_childs_value_comes_back_from_a_new_interpreter():
    child = Child(_replies, "value", name="pipeline-test").start()
    said = child.result("testing")
    assert said["what"] == "value" and said["pid"] == child.pid != os.getpid()
    assert child.exitcode == 0


@pytest.mark.parametrize(("what", "kind"), [("usage", UsageError), ("fault", DeviceFault)])
def test_the_pipelines_own_error_in_the_child_is_raised_here_as_itself(what, kind):
    with pytest.raises(kind) as raised:
        Child(_replies, what, name="pipeline-test").start().result("testing")
    assert type(raised.value) is kind
    if kind is UsageError:
        assert raised.value.message == "no such model 'vitt'." and raised.value.hint == "`pipeline models` lists them"
    else:
        assert raised.value.facts == {"error": "illegal"}


@pytest.mark.parametrize(("what", "words"), [("bug", r"exit status 1"), ("killed", r"killed by SIGKILL")])
def test_a_child_that_ends_without_a_reply_is_an_error_naming_how_it_ended(what, words):
    with pytest.raises(ChildEnded, match=rf"the process repeating a point ended without a result \({words}\)\.") as raised:
        Child(_replies, what, name="pipeline-test").start().result("repeating a point")
    assert isinstance(raised.value, PipelineError) and raised.value.hint


def test_a_parent_interrupted_while_it_waits_stops_its_child(monkeypatch):
    child = Child(_replies, "sleep", name="pipeline-test").start()

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(child, "reply", interrupted)
    with pytest.raises(KeyboardInterrupt):
        child.result("testing", grace_s=5)
    assert not child.alive() and child.exitcode == -signal.SIGTERM


def _answers(channel) -> None:
    def answer(request):
        if request == "fault":
            return Reply("error, and no more", DeviceFault("faulted on the GPU: unspecified launch failure"))
        if request == "refuse":
            return Reply("error", PipelineError("not here"))
        return Reply("ok", (request, os.getpid()))

    serve_requests(channel, answer)


def test_a_child_answers_requests_one_at_a_time_until_told_to_stop():
    child = Child(_answers, name="pipeline-serving", requests=True).start()
    assert child.ask("one") == ("one", child.pid)
    with pytest.raises(PipelineError, match="not here"):
        child.ask("refuse")
    assert child.ask("two") == ("two", child.pid)  # it serves on after an error
    child.stop_serving()
    child.join(10)
    assert child.exitcode == 0


def test_a_child_that_ends_after_an_answer_is_gone_for_the_next_request():
    child = Child(_answers, name="pipeline-serving", requests=True).start()
    with pytest.raises(DeviceFault):
        child.ask("fault")
    child.join(10)
    assert child.exitcode == 0
    with pytest.raises(ChildEnded, match=r"pipeline-serving ended \(exit status 0\)"):
        child.ask("after")


def _reads(channel, duplicate) -> None:
    fd = duplicate.detach()
    answer_with(channel, lambda: os.read(fd, 5).decode())


def test_a_descriptor_handed_to_a_child_is_open_there():
    read, write = os.pipe()
    try:
        os.write(write, b"held!")
        assert Child(_reads, inheritable(read), name="pipeline-test").start().result("reading") == "held!"
    finally:
        os.close(read)
        os.close(write)


def test_how_a_process_ended_in_words():
    assert ended_words(None) == "still running"
    assert ended_words(0) == "exit status 0" and ended_words(3) == "exit status 3"
    assert ended_words(-signal.SIGTERM) == "killed by SIGTERM"


def _silent(channel) -> None:
    import time

    time.sleep(60)


def test_a_child_that_gives_no_result_in_time_is_stopped_and_said_so():
    began = time.perf_counter()
    child = Child(_silent, name="pipeline-test").start()
    with pytest.raises(ChildEnded, match="gave no result in 2 s"):
        child.result("waiting", grace_s=1, timeout_s=2)
    assert not child.alive() and time.perf_counter() - began < 30
