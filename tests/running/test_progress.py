"""Progress inside long work: in a terminal the running stage's spinner says what it is doing
(calibration batches, the export's parts, the rounds of a measurement); piped, one line per
stage, and a line a minute for a stage that runs longer."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time

import pytest
from rich.console import Console

from pipeline.running.reporting import Reporter, _shortened
from tests.conftest import REPO_ROOT, TINY_CATALOG, write_catalog


def test_the_spinner_says_the_step_what_is_under_way_and_the_time_taken():
    reporter = Reporter(console=Console(file=io.StringIO(), force_terminal=True))
    reporter.progress("ignored: no stage is running")
    with reporter.working("profile", "vit_fp16"):
        assert reporter.activity.text() == "profile vit_fp16 … 0:00"
        reporter.step("measurement 2 of 3")
        reporter.progress("measuring: 1.2 s left, 48 runs")
        assert reporter.activity.text() == "profile vit_fp16 … measurement 2 of 3: measuring: 1.2 s left, 48 runs · 0:00"
        reporter.activity.started -= 75
        reporter.step("checking its outputs on the reference batch")  # a new step clears what the last one was doing
        assert reporter.activity.text() == "profile vit_fp16 … checking its outputs on the reference batch · 1:15"
        reporter.tool_output("trtexec build", "[11/23/2026-20:01:02] [I] [TRT] Detected 1 inputs and 1 output network tensors.")
        assert reporter.activity.doing == "trtexec build: Detected 1 inputs and 1 output network tensors."
    assert reporter.activity is None


def test_once_a_stage_measures_nothing_redraws_its_spinner_but_the_measuring_thread_between_takes():
    """rich's status redraws on a thread of its own 12.5 times a second, which beside a take slows
    a launch-bound engine; once the stage measures, the spinner is drawn when the thread that
    measures says how far it has got, and no more often than MEASURING_REDRAW_S."""
    out = io.StringIO()
    reporter = Reporter(console=Console(file=out, force_terminal=True, width=100))
    before = set(threading.enumerate())
    with reporter.working("profile", "vit_fp16"):
        (redrawing,) = set(threading.enumerate()) - before  # the spinner's redrawing thread
        drawn = len(out.getvalue())
        reporter.measuring("4 engine(s) in rounds")
        assert not redrawing.is_alive() and not set(threading.enumerate()) - before
        assert "profile vit_fp16 … 4 engine(s) in rounds · 0:00" in out.getvalue()[drawn:]  # the step, drawn at once
        drawn = len(out.getvalue())
        reporter.progress("round 1 (2 of at most 30 s)")  # within MEASURING_REDRAW_S of the last drawing: kept
        elsewhere = threading.Thread(target=reporter.progress, args=("round 1 (said by another thread)",))
        elsewhere.start()
        elsewhere.join()
        reporter._spinner.drawn_at -= Reporter.MEASURING_REDRAW_S
        elsewhere = threading.Thread(target=reporter.progress, args=("round 1 (said by another thread)",))
        elsewhere.start()
        elsewhere.join()  # due, but not the measuring thread: not drawn
        time.sleep(0.1)
        assert len(out.getvalue()) == drawn
        reporter.activity.started -= 1
        reporter.progress("round 2 (3 of at most 30 s)")
        assert "4 engine(s) in rounds: round 2 (3 of at most 30 s) · 0:01" in out.getvalue()[drawn:]
    assert not set(threading.enumerate()) - before and reporter._spinner is None


def test_piped_a_long_stage_says_what_it_does_once_a_minute_and_a_quick_one_nothing(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)  # the reporter's own console writes to whatever stderr is
    reporter = Reporter()
    with reporter.working("export", "modernbert_bf16"):
        reporter.step("accuracy and reference")
    assert out.getvalue() == ""  # done within the minute: the log holds only the stage's own line
    monkeypatch.setattr(Reporter, "HEARTBEAT_S", 0.05)
    with reporter.working("export", "modernbert_bf16"):
        reporter.step("accuracy and reference")
        reporter.progress("4×2048 (4 of 6)")
        with reporter.captured("torch.onnx.export"):  # a tool's output held back: these lines are not
            deadline = time.monotonic() + 10
            while "4×2048" not in out.getvalue() and time.monotonic() < deadline:
                time.sleep(0.02)
    said = out.getvalue().splitlines()
    assert said and said[0] == "export   modernbert_bf16            … accuracy and reference: 4×2048 (4 of 6) · 0:00"
    settled = out.getvalue()
    time.sleep(0.2)
    assert out.getvalue() == settled  # nothing once the stage is done


def test_the_export_says_which_shape_point_it_is_at(tmp_path, run_cli, monkeypatch):
    from tests.conftest import tiny_bert_catalog

    said: list[str] = []
    monkeypatch.setattr(Reporter, "progress", lambda self, text: said.append(text))
    toolchains = '[toolchains.onnxruntime]\nkind = "onnxruntime"\n[toolchains.torch-eager]\nkind = "torch"\nbackend = "eager"\n'
    catalog = write_catalog(tmp_path / "ws", tiny_bert_catalog(["2x8", "2x16"], ["fp16"], defaults=["fp16"]) + toolchains)
    result = run_cli(catalog, "export", "--variant", "fp16")
    assert result.exit_code == 0, result.err
    # The FP32 reference, the variant's outputs, then parity in ONNX Runtime: each point in turn.
    assert said == ["2×8 (1 of 2)", "2×16 (2 of 2)"] * 3


def test_tool_lines_are_shortened_to_what_they_say():
    assert _shortened("[I] GPU Compute Time: min = 0.1 ms") == "GPU Compute Time: min = 0.1 ms"
    assert _shortened("   [W] [TRT] Make sure input input_ids has Int64 binding.") == "Make sure input input_ids has Int64 binding."
    long = _shortened("Collecting tensorrt-rtx-cu13-libs==1.7.1.116 " + "x" * 100)
    assert len(long) == 70 and long.endswith("…")


def test_a_run_reports_calibration_batches_export_parts_and_measurements(tmp_path, run_cli, monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(Reporter, "step", lambda self, text: said.append(f"step {text}"))
    monkeypatch.setattr(Reporter, "progress", lambda self, text: said.append(text))
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG)
    result = run_cli(catalog, "run", "--variant", "int8", "--repeat", "2")
    assert result.exit_code == 0, result.err
    calibrating = [text for text in said if text.startswith("calibrating: batch")]
    assert calibrating and calibrating[0] == f"calibrating: batch 1 of {len(calibrating)}"
    for step in (
        "step onnx export",
        "step quantize",
        "step parity",
        "step preparing int8/onnxruntime",
        "step measurement 2 of 2, in a fresh process",
    ):
        assert step in said, step
    assert "step checking int8/onnxruntime's outputs on the reference batch" in said
    # A line per round: which one, the time spent of the budget, and what is still undecided.
    rounds = [(int(m.group(1)), m.group(2)) for text in said if (m := re.match(r"round (\d+) \(\d+ of at most 30 s\): (.+)", text))]
    assert [number for number, _ in rounds] == [1, 2, 3, 4, 5, 6]
    assert rounds[0][1] == "at least 6 rounds" and rounds[-1][1] == "decided"
    # Piped, as here: one line per stage, none of the above.
    assert "calibrating" not in result.err and "round 1" not in result.err


def in_a_terminal(catalog, *args: str) -> str:
    """The command run in a pseudo-terminal, as a user at a terminal sees it: its screen's text,
    without the terminal's control sequences."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "--catalog", str(catalog), *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "160", "TERM": "xterm"},
        close_fds=True,
    )
    os.close(follower)
    screen = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            screen += chunk
        elif process.poll() is not None:
            break
    os.close(leader)
    assert process.wait(timeout=60) == 0, screen.decode(errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))


def test_in_a_real_terminal_the_spinner_shows_the_rounds(tmp_path):
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG.replace("take_ms = 5", "take_ms = 400"))
    text = in_a_terminal(catalog, "run", "--variant", "fp32")
    assert re.search(r"profile tiny \(1 engine in rounds\) … 1 engine\(s\) in rounds: round \d+ \(\d+ of at most 30 s\)", text), text
    assert "profile  tiny_fp32" in text and "done in" in text  # the stage's own line, as when piped


def test_in_a_real_terminal_every_line_names_the_engine_the_toolchain_and_the_point(tmp_path):
    """The lines the piped test below reads, as a terminal shows them once the spinner is gone."""
    from tests.conftest import CPU_TOOLCHAINS, tiny_bert_catalog

    pytest.importorskip("transformers", reason="bert is a transformers model")
    catalog = write_catalog(tmp_path / "ws", tiny_bert_catalog(["2x8", "3x16"], ["fp32"], ["fp32"]) + CPU_TOOLCHAINS)
    text = in_a_terminal(catalog, "run", "--engine", "bert_fp32", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    said = [" ".join(line.split()) for line in text.splitlines()]
    for toolchain in ("onnxruntime", "torch-eager"):
        assert any(line.startswith(f"build bert_fp32 on {toolchain} done in") for line in said), text
        for point in ("2x8", "3x16"):
            assert any(
                re.match(rf"profile bert_fp32 on {toolchain} at {point} done in [\d.]+s of rounds: .* rounds beside 1 other engine", line)
                for line in said
            ), text
    assert sum(line.startswith("export bert_fp32 done in") for line in said) == 1, text


def test_every_line_names_the_engine_the_toolchain_and_the_point(tmp_path, run_cli):
    """Two toolchains at two shape points, piped: each build and profile line says which toolchain
    and point it is about, an export that did not change is said once (and not at all where the
    run did it), and a profile measured in rounds reports the rounds' time, not its own instant."""
    from tests.conftest import CPU_TOOLCHAINS, tiny_bert_catalog

    pytest.importorskip("transformers", reason="bert is a transformers model")
    catalog = write_catalog(tmp_path / "ws", tiny_bert_catalog(["2x8", "3x16"], ["fp32"], ["fp32"]) + CPU_TOOLCHAINS)
    args = ("run", "--engine", "bert_fp32", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    first = run_cli(catalog, *args)
    assert first.exit_code == 0, first.err
    # Words as said, without the padding that lines up the columns.
    lines = [" ".join(line.split()) for line in first.err.splitlines() if line.startswith(("export ", "build ", "profile "))]
    assert sum(line.startswith("export ") for line in lines) == 1  # done once, for both toolchains
    for toolchain in ("onnxruntime", "torch-eager"):
        assert any(line.startswith(f"build bert_fp32 on {toolchain} done in") for line in lines), lines
        for point in ("2x8", "3x16"):
            line = next(line for line in lines if line.startswith(f"profile bert_fp32 on {toolchain} at {point} done in "))
            seconds = float(re.search(r"done in ([\d.]+)s of rounds", line).group(1))
            manifest = json.loads((tmp_path / "ws" / "manifests" / toolchain / f"bert_fp32@{point}.json").read_text())
            rounds = manifest["profile"]["details"]["rounds"]
            # The rounds' time, shared with the other engine, not the instant it took to record them.
            assert seconds == round(sum(record["elapsed_s"] for record in rounds), 1) and "rounds beside 1 other engine" in line, line
    said = " ".join(run_cli(catalog, *args).err.split())
    assert said.count("export bert_fp32 didn't change, skipping") == 1, said
    assert said.count("build bert_fp32 on onnxruntime didn't change") == 1
