"""Serving concurrent streams end to end on a CPU (docs/streams.md): a point's engines, after their
rounds, serve 1 and 2 streams — ONNX Runtime by threads on one session, eager PyTorch by threads and
by as many processes started together — and each count's inferences/s and request latencies reach
the manifest, the tables, the JSON (held to docs/compare.schema.json) and `--p99-under`."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import CPU_TOOLCHAINS, REPO_ROOT, catalog_head, write_catalog

CATALOG = (
    catalog_head(["tiny"], ["fp32"]).replace("round_ms = 0", "round_ms = 0\nserve_s = 0.3")
    + """
[models.tiny]
timm = "test_vit"
batch_size = 2

[variants.fp32]
precision = "fp32"
"""
    + CPU_TOOLCHAINS
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("streams"), CATALOG)
    argv = ["--catalog", str(catalog), "run", "--toolchain", "onnxruntime", "--toolchain", "torch-eager"]
    assert main(argv) == 0  # [profile] streams = [1]: nothing served
    first = {chain: _profile(catalog, chain) for chain in ("onnxruntime", "torch-eager")}
    assert main([*argv, "--streams", "2,1"]) == 0
    return catalog, first


def _profile(catalog, toolchain: str):
    return read_manifest(catalog.parent / "manifests" / toolchain / "tiny_fp32.json").profile


def _details(catalog, toolchain: str):
    return _profile(catalog, toolchain).details


def _fake_children(answer, warm=None):
    """A stand-in for launchers' Child, for serve_in_processes: every process prepares well; asked
    to serve (("serve", seconds)) it says its stream is warmed — or, where ``warm(name)`` gives a
    Reply, answers that at once — and, given the instant, answers with the Reply
    ``answer(name, ("serve", start_at, seconds))`` gives. The class keeps the processes it made,
    the names of those that prepared, and every message each was sent (``sent``, by name)."""
    from pipeline.launchers.child import OK, Reply
    from pipeline.stages.serving import WARMED

    class FakeChild:
        made: list = []
        prepared: list = []
        sent: dict = {}

        def __init__(self, *args, name, requests):
            self.name, self.said, self.seconds = name, None, None
            FakeChild.made.append(self)

        def start(self):
            return self

        def send(self, message):
            FakeChild.sent.setdefault(self.name, []).append(message)
            if message == "prepare":
                FakeChild.prepared.append(self.name)
                self.said = Reply("ok", None)
            elif isinstance(message, tuple):  # ("serve", seconds): warm, and say so
                self.seconds = message[1]
                self.said = (warm(self.name) if warm else None) or Reply(OK, WARMED)
            else:  # the instant all start at
                self.said = answer(self.name, ("serve", message, self.seconds))
            return True

        def receive(self):
            return self.said

        def stop_serving(self):
            pass

        def join(self, timeout):
            pass

        def stop(self):
            pass

    return FakeChild


class _FakeStage:
    """A point's stage as serving reads it (hashable, as the point's stages are)."""

    def __init__(self, name, runtime):
        self.runtime, self.engine, self.toolchain = runtime, SimpleNamespace(variant=name), "fake"


_QUIET = SimpleNamespace(measuring=lambda words: None, step=lambda words: None)


def test_one_stream_serves_nothing_and_more_are_served_after_the_rounds(served):
    catalog, first = served
    assert all(profile.details.streams == [] and profile.details.settings.streams == (1,) for profile in first.values())
    # Serving's settings are part of a measurement's fingerprint only where it serves.
    assert all(not {"streams", "serve_s", "serve_rounds"} & set(profile.params["settings"]) for profile in first.values())
    for toolchain in ("onnxruntime", "torch-eager"):
        assert _profile(catalog, toolchain).params["settings"]["serve_rounds"] == 4
    details = _details(catalog, "onnxruntime")
    assert details.settings.streams == (1, 2)
    assert details.rounds  # the rounds are still what the row's figures come from
    assert [(record.streams, record.mode) for record in details.streams] == [(1, "threads"), (2, "threads")]
    for record in details.streams:
        assert record.why_not is None
        assert record.completed == len(record.latencies_ms) > 0
        assert record.span_s >= 0.3  # four takes of 75 ms (serve_rounds), in rounds with torch-eager's
        assert len(record.takes_per_s) == 4 and all(rate > 0 for rate in record.takes_per_s)
        assert record.inferences_per_s == pytest.approx(record.completed / record.span_s, rel=1e-3)
        assert record.samples_per_s == pytest.approx(2 * record.inferences_per_s)
        assert set(record.latency_ms) == {"50", "90", "99"}
        assert record.latency_ms["50"] <= record.latency_ms["90"] <= record.latency_ms["99"]
        low, high = record.interval_ms["50"]
        assert low <= record.latency_ms["50"] <= high
        # The p99 is bounded by requests: 368 of them, or it says it needs them.
        bounded = record.completed >= 368
        assert (record.interval_ms["99"] is not None) == bounded
        assert record.requests_needed["99"] == (None if bounded else 368)
    assert "2 threads on one InferenceSession" in details.streams[1].how


def test_pytorch_serves_by_threads_and_by_processes_started_together(served):
    catalog, _ = served
    details = _details(catalog, "torch-eager")
    assert [(record.streams, record.mode) for record in details.streams] == [
        (1, "threads"),
        (2, "threads"),
        (1, "processes"),
        (2, "processes"),
    ]
    assert all(record.why_not is None and record.completed > 0 for record in details.streams), [r.why_not for r in details.streams]
    together = details.streams[3]
    assert together.how.startswith("2 processes, each its own interpreter")
    assert together.how.endswith("; 4 takes, in rounds with the engine's other counts")
    alone = details.streams[1]
    assert alone.how.endswith("; 4 takes, in rounds with the point's other engines and counts")
    # Both processes served over one span: their requests together, the span no longer than one's
    # serve_s and its last request.
    assert 0.3 <= together.span_s < 1.5


def test_the_tables_show_a_streams_section(served, run_cli):
    catalog, _ = served
    result = run_cli(catalog, "compare")
    assert result.exit_code == 0, result.err
    section = result.out[result.out.index("tiny: serving concurrent streams") :]
    header = section.splitlines()[1].split()
    assert header[4:8] == ["inf/s", "throughput", "takes", "inf/s"]  # each throughput cell in its unit (img/s here, tok/s for tokens)
    lines = [line.split() for line in section.splitlines()[3:9]]
    assert all(line[6] == "img/s" for line in lines)
    # The lowest and highest of each count's four takes, around the count's own figure or not far off.
    for line in lines:
        low, high = (float(value) for value in line[7].split("–"))
        assert 0 < low <= high
    assert [(line[1], line[2], line[3]) for line in lines] == [
        ("onnxruntime", "1", "threads"),
        ("onnxruntime", "2", "threads"),
        ("torch-eager", "1", "threads"),
        ("torch-eager", "2", "threads"),
        ("torch-eager", "1", "processes"),
        ("torch-eager", "2", "processes"),
    ]
    markdown = run_cli(catalog, "compare", "--format", "md").out
    assert "### tiny: serving concurrent streams" in markdown and "| fp32 | onnxruntime | 2 | threads |" in markdown


def test_a_narrow_terminal_leaves_columns_out_in_turn_and_says_so(served, run_cli, monkeypatch):
    catalog, _ = served
    monkeypatch.setenv("COLUMNS", "80")
    result = run_cli(catalog, "compare")
    section = result.out[result.out.index("tiny: serving concurrent streams") :].splitlines()
    table = section[1 : section.index(next(line for line in section if line.startswith("?")))]
    assert table[0].split() == ["variant", "toolchain", "streams", "mode", "inf/s", "p99", "ms", "p99", "95%", "interval"]
    assert all(len(line) <= 80 for line in table)
    assert "left out to fit: takes inf/s, p90 ms, median ms, throughput" in " ".join(" ".join(section[len(table) :]).split())


def test_the_json_holds_each_count_to_its_schema(served, run_cli):
    import jsonschema

    catalog, _ = served
    result = run_cli(catalog, "compare", "--format", "json", "--p99-under", "10s")
    assert result.exit_code == 0, result.err
    data = json.loads(result.out)
    jsonschema.validate(data, json.loads((REPO_ROOT / "docs" / "compare.schema.json").read_text()))
    assert data["schema"] == 19
    row = next(row for row in data["rows"] if row["toolchain"] == "onnxruntime")
    assert [entry["streams"] for entry in row["streams"]] == [1, 2]
    assert all(entry["inferences_per_s"] > 0 and entry["p99_requests_needed"] in (None, 368) for entry in row["streams"])
    assert all(len(entry["takes_inferences_per_s"]) == 4 for entry in row["streams"])  # serve_rounds
    (pick,) = data["serving"]
    assert pick["model"] == "tiny" and pick["budget_ms"] == 10_000
    assert pick["within"] + pick["above"] + pick["unbounded"] == 6


def test_p99_under_says_when_no_p99_could_be_bounded(served, run_cli):
    catalog, _ = served
    result = run_cli(catalog, "compare", "--p99-under", "10ms")
    assert result.exit_code == 0, result.err
    assert "Serving within a p99 of 10 ms" in result.out
    rows = [_details(catalog, chain).streams for chain in ("onnxruntime", "torch-eager")]
    if all(record.completed < 368 for records in rows for record in records):
        assert "no engine is shown to serve with a p99 within 10 ms" in result.out
        assert "a p99 needs 368 requests" in result.out


def test_bad_stream_counts_and_budgets_are_usage_errors(served, run_cli):
    catalog, _ = served
    for given, words in (("0,2", "give stream counts from 1 to 256"), ("1,x", "separated by commas"), ("2,2", "each stream count once")):
        result = run_cli(catalog, "profile", "--engine", "tiny_fp32", "--streams", given)
        assert result.exit_code == 2 and words in result.err, (given, result.err)
    result = run_cli(catalog, "compare", "--p99-under", "fast")
    assert result.exit_code == 2
    assert "ERROR --p99-under 'fast': give a latency budget above 0, in ms, s or us." in result.err


def test_the_html_draws_throughput_against_concurrency(served, run_cli, tmp_path):
    catalog, _ = served
    out = tmp_path / "compare.html"
    result = run_cli(catalog, "compare", "--format", "html", "--out", str(out), "--p99-under", "10ms")
    assert result.exit_code == 0, result.err
    page = out.read_text()
    assert '<img alt="Throughput against concurrent streams" src="data:image/png;base64,' in page
    # A table per point, titled as the terminal's, with its note.
    assert ": serving concurrent streams (inferences/s and each request&#x27;s latency)</h3><table>" in page
    assert "<h2>Serving within a p99 of 10 ms</h2>" in page
    assert "? = too few requests to bound the p99" in page  # the table's marks explained, as in the terminal


def test_the_dry_run_says_what_serving_will_do(served, run_cli):
    catalog, _ = served
    result = run_cli(catalog, "profile", "--engine", "tiny_fp32", "--toolchain", "torch-eager", "--streams", "1,4", "--dry-run")
    assert result.exit_code == 0, result.err
    assert (
        "tiny_fp32: serve: after the rounds, 1, 4 concurrent streams, 0.3 s each in 4 takes interleaved with the point's other engines,"
        " in this process and in as many processes" in result.out
    )


@pytest.mark.parametrize("counts", ["1,,2", "1,2,", "", "abc", "1.5"])
def test_stream_counts_that_are_not_a_list_of_counts_are_refused(served, run_cli, counts):
    catalog, _ = served
    result = run_cli(catalog, "profile", "--engine", "tiny_fp32", "--toolchain", "torch-eager", "--streams", counts, "--dry-run")
    assert result.exit_code == 2 and "give stream counts separated by commas, e.g. 1,2,4" in result.err


def test_processes_are_started_and_prepared_once_for_every_count(monkeypatch):
    """As many processes as the largest count, each preparing (a compiled engine: compiling) once;
    each count served by the first that many, released together; a count whose process fails
    says so and the others are served."""
    from pipeline.launchers.child import Reply
    from pipeline.measuring.serving import ServedRun
    from pipeline.stages import serving

    served = []

    def answer(name, message):
        _, start_at, seconds = message
        served.append((name, start_at))
        if name == "pipeline-stream-2" and len(served) > 3:  # fails at the count of four
            return Reply("error", serving.PipelineError("out of luck"))
        return Reply("ok", ServedRun(1, "threads", seconds, 2, [1.0, 2.0]))

    FakeChild = _fake_children(answer)
    made, prepared = FakeChild.made, FakeChild.prepared
    monkeypatch.setattr(serving, "Child", FakeChild)
    runs = serving.serve_in_processes(None, "torch-eager", None, None, SimpleNamespace(streams=(1, 2, 4), serve_s=0.5, serve_rounds=1))
    assert len(made) == 4 and sorted(prepared) == [f"pipeline-stream-{i}" for i in range(4)]
    assert [(run.streams, run.completed, run.why_not) for run in runs] == [(1, 2, None), (2, 4, None), (4, 0, "failed: out of luck")]
    assert [name for name, _ in served[:3]] == ["pipeline-stream-0", "pipeline-stream-0", "pipeline-stream-1"]
    assert served[1][1] == served[2][1]  # the two of a count released at one instant


def test_the_instant_processes_start_at_is_set_once_every_one_has_warmed_its_stream(monkeypatch):
    """A process whose first request is slow (here 0.3 s to say it is warmed) does not start late:
    the instant is set only once every process has said it is warmed, so that none of them misses
    it; before, it was set before the warming, a margin ahead."""
    from pipeline.launchers.child import Reply
    from pipeline.measuring.serving import ServedRun
    from pipeline.stages import serving

    warmed_at, given = [], []

    def warm(name):
        if name == "pipeline-stream-1":
            time.sleep(0.3)
        warmed_at.append(time.time())

    def answer(name, message):
        given.append(message[1])
        return Reply("ok", ServedRun(1, "threads", message[2], 3, [1.0] * 3))

    monkeypatch.setattr(serving, "Child", _fake_children(answer, warm))
    (run,) = serving.serve_in_processes(None, "torch-eager", None, None, SimpleNamespace(streams=(2,), serve_s=0.5, serve_rounds=1))
    assert (run.why_not, run.completed) == (None, 6)
    assert len(given) == 2 and given[0] == given[1]  # one instant for both
    assert given[0] >= max(warmed_at) + serving.START_MARGIN_S * 0.99


def test_a_process_that_cannot_serve_answers_at_once_and_is_not_given_the_instant(monkeypatch):
    """A process whose runtime cannot serve says why instead of saying it is warmed: the others are
    still given the instant and their answers read (none left for the next count), and the count
    says why it could not be measured."""
    from pipeline.launchers.child import Reply
    from pipeline.measuring.serving import ServedRun
    from pipeline.stages import serving

    def warm(name):
        if name == "pipeline-stream-0":
            return Reply("ok", ServedRun.cannot(1, "threads", "its graphs are one a compiled graph"))
        return None

    def answer(name, message):
        return Reply("ok", ServedRun(1, "threads", message[2], 3, [1.0] * 3))

    FakeChild = _fake_children(answer, warm)
    monkeypatch.setattr(serving, "Child", FakeChild)
    (run,) = serving.serve_in_processes(None, "torch-eager", None, None, SimpleNamespace(streams=(2,), serve_s=0.5, serve_rounds=1))
    assert run.why_not == "its graphs are one a compiled graph"
    assert not any(isinstance(message, float) for message in FakeChild.sent["pipeline-stream-0"])
    assert sum(isinstance(message, float) for message in FakeChild.sent["pipeline-stream-1"]) == 1


def test_each_count_is_served_in_takes_in_rounds_with_the_points_other_engines():
    """serve_rounds = 4: each round serves every engine at every count once, in an order drawn
    from the point's seed, a take a quarter of serve_s; a count pools its takes; a take that fails
    ends its count's takes; a tool's engine (serves_in_rounds false) serves each count in one take."""
    from pipeline.measuring.serving import ServedRun
    from pipeline.stages import serving

    def served_at(seed: int):
        calls = []

        class Runtime:
            kind, serves_in_processes = "fake", None

            def __init__(self, in_rounds=True):
                self.serves_in_rounds = in_rounds

            def serve(self, engine, count, seconds, start_at=None):
                calls.append((engine, count, seconds))
                if (engine, count) == ("b", 2) and calls.count(("b", 2, seconds)) == 2:
                    raise RuntimeError("the stream's kernel failed")
                return ServedRun(count, "threads", seconds, 10 * count, [1.0] * 10 * count, how=f"{count} threads")

        stages = [_FakeStage("a", Runtime()), _FakeStage("b", Runtime()), _FakeStage("t", Runtime(in_rounds=False))]
        settings = SimpleNamespace(serves=True, streams=(1, 2), serve_s=2.0, serve_rounds=4)
        out = serving.serve_point(dict(zip(stages, "abt")), settings, _QUIET, seed=seed)
        return calls, {stage.engine.variant: runs for stage, runs in out.items()}

    calls, out = served_at(seed=7)
    # Rounds of 6, 4, 3 and 3 takes: the tool's counts in the first alone, b's two streams no more once failed.
    rounds = [calls[:6], calls[6:10], calls[10:13], calls[13:]]
    assert len(calls) == 16
    assert sorted(rounds[0]) == [("a", 1, 0.5), ("a", 2, 0.5), ("b", 1, 0.5), ("b", 2, 0.5), ("t", 1, 2.0), ("t", 2, 2.0)]
    assert sorted(rounds[1]) == [("a", 1, 0.5), ("a", 2, 0.5), ("b", 1, 0.5), ("b", 2, 0.5)]
    assert sorted(rounds[2]) == sorted(rounds[3]) == [("a", 1, 0.5), ("a", 2, 0.5), ("b", 1, 0.5)]
    assert len({tuple(batch[:3]) for batch in rounds}) > 1  # the order is drawn again each round
    assert served_at(seed=7)[0] == calls and served_at(seed=8)[0] != calls  # ... from the point's seed
    one, two = out["a"]
    assert (one.streams, one.completed, one.span_s, one.takes_per_s) == (1, 40, 2.0, [20.0] * 4)
    assert (two.streams, two.completed, len(two.latencies_ms)) == (2, 80, 80)
    assert out["b"][0].why_not is None and "the stream's kernel failed" in out["b"][1].why_not
    assert [(run.completed, run.span_s, run.takes_per_s) for run in out["t"]] == [(10, 2.0, []), (20, 2.0, [])]


def test_processes_serve_their_counts_in_rounds():
    """serve_rounds = 2 on processes: the counts take turns, each served twice for half of
    serve_s, by the same processes, prepared once."""
    from pipeline.launchers.child import Reply
    from pipeline.measuring.serving import ServedRun
    from pipeline.stages import serving

    served = []

    def answer(name, message):
        served.append((name, message[2]))
        return Reply("ok", ServedRun(1, "threads", message[2], 5, [1.0] * 5))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving, "Child", _fake_children(answer))
        runs = serving.serve_in_processes(
            None, "torch-eager", None, None, SimpleNamespace(streams=(1, 2), serve_s=1.0, serve_rounds=2), seed=3
        )
    assert [(run.streams, run.completed, run.span_s, run.takes_per_s) for run in runs] == [
        (1, 10, 1.0, [10.0, 10.0]),
        (2, 20, 1.0, [20.0, 20.0]),
    ]
    assert len(served) == 6 and all(seconds == 0.5 for _, seconds in served)


def test_a_gpu_fault_while_serving_in_rounds_is_pinned_to_its_engine_and_ends_the_serving():
    """A fault of the GPU poisons the process: raised at once, pinned to the engine whose take
    saw it, however many takes and engines are left."""
    from pipeline.measuring.serving import ServedRun
    from pipeline.running.errors import DeviceFault
    from pipeline.stages import serving

    calls = []

    class Runtime:
        kind, serves_in_processes, serves_in_rounds = "fake", None, True

        def __init__(self, faults: bool):
            self.faults = faults

        def serve(self, engine, count, seconds, start_at=None):
            calls.append(engine)
            if self.faults and count == 2:
                raise DeviceFault("CUDA error: an illegal memory access was encountered")
            return ServedRun(count, "threads", seconds, 1, [1.0])

    stages = {_FakeStage("fine", Runtime(False)): "fine", _FakeStage("faulty", Runtime(True)): "faulty"}
    settings = SimpleNamespace(serves=True, streams=(1, 2), serve_s=1.0, serve_rounds=4)
    with pytest.raises(DeviceFault) as raised:
        serving.serve_point(stages, settings, _QUIET, seed=1)
    assert raised.value.entrant == "faulty/fake"
    assert calls[-1] == "faulty" and len(calls) <= 4  # nothing served after the fault, not a round more


def test_a_process_take_that_fails_after_one_that_served_speaks_for_its_count():
    """serve_rounds = 3 on processes: the count of two fails at its second take; it takes no more
    and says why, the count of one is served all three times."""
    from pipeline.launchers.child import Reply
    from pipeline.measuring.serving import ServedRun
    from pipeline.stages import serving

    served = []

    def answer(name, message):
        served.append(name)
        if name == "pipeline-stream-1" and served.count(name) == 2:
            return Reply("error", serving.PipelineError("the second process ran out of memory"))
        return Reply("ok", ServedRun(1, "threads", message[2], 4, [1.0] * 4))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving, "Child", _fake_children(answer))
        settings = SimpleNamespace(streams=(1, 2), serve_s=0.9, serve_rounds=3)
        one, two = serving.serve_in_processes(None, "torch-eager", None, None, settings, seed=5)
    assert (one.why_not, one.completed, len(one.takes_per_s)) == (None, 12, 3)
    assert two.why_not == "failed: the second process ran out of memory"
    assert served.count("pipeline-stream-1") == 2  # the count of two took no third take
