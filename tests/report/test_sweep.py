"""A sweep: one model at several shape points on several toolchains in one command, the answer
first (pipeline/report/sweep.py), attention implementations and SDPA kernels as torch toolchain
settings, a point that runs out of memory recorded while the others run, and torch.compile
compiled once for a dynamic range with its recompilations counted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.catalog.floor import AccuracyFloor
from pipeline.manifest import read_manifest
from pipeline.report.rows import ComparisonRow
from pipeline.report.sweep import sweeps
from pipeline.report.verdict import verdicts
from tests.conftest import CPU_TOOLCHAINS, render_in_chromium, tiny_bert_catalog, write_catalog
from tests.runtimes.pytorch.test_pytorch_runtime import needs_inductor

pytest.importorskip("transformers", reason="the transformers family needs the transformers package (`make setup` installs it)")

SWEEP_CATALOG = (
    tiny_bert_catalog(["2x8", "2x32", "4x32"], ["fp32"], defaults=["fp32"])
    + CPU_TOOLCHAINS
    + """
[toolchains.torch-eager-attn]
kind = "torch"
backend = "eager"
attn_implementation = "eager"

[toolchains.torch-efficient]
kind = "torch"
backend = "eager"
sdpa_backend = "efficient"

[toolchains.torch-compile-dynamic]
kind = "torch"
backend = "compile"
dynamic = true
"""
)
POINTS = ["2x8", "2x32", "4x32"]
SWEPT = ("onnxruntime", "torch-eager", "torch-eager-attn")


def point_manifest(workspace: Path, toolchain: str, shape: str):
    return read_manifest(workspace / "manifests" / toolchain / f"bert_fp32@{shape}.json")


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """bert_fp32 on ONNX Runtime, eager PyTorch with SDPA and with its own attention, at three
    points: one command."""
    from pipeline.cli.main import main

    workspace = tmp_path_factory.mktemp("sweep")
    (workspace / "pipeline.toml").write_text(SWEEP_CATALOG)
    argv = ["--catalog", str(workspace / "pipeline.toml"), "run", "--model", "bert"]
    for toolchain in SWEPT:
        argv += ["--toolchain", toolchain]
    assert main(argv) == 0
    return workspace


def test_a_sweep_is_one_command_and_every_point_of_every_toolchain_is_measured(swept):
    for toolchain in SWEPT:
        for shape in POINTS:
            profile = point_manifest(swept, toolchain, shape).profile
            assert profile.status == "done", (toolchain, shape, profile.reason)
            batch, sequence = map(int, shape.split("x"))
            assert profile.details.tokens_per_s == pytest.approx(profile.details.throughput_qps * batch * sequence)
    settings = point_manifest(swept, "torch-eager-attn", "2x32").profile.details.execution
    assert settings["attn_implementation"] == "eager" and settings["sdpa_backend"] is None
    assert point_manifest(swept, "torch-eager", "2x32").profile.details.execution["attn_implementation"] is None  # the model's own


def test_the_sweep_table_has_a_column_per_point_and_the_answer_comes_first(swept, run_cli):
    catalog = swept / "pipeline.toml"
    table = run_cli(catalog, "compare", "--metric", "tokens")
    assert table.exit_code == 0, table.err
    lines = table.out.splitlines()
    assert lines[0] == "The answer: the fastest engine that meets the accuracy floor"
    assert [line.split(":")[0] for line in lines if line.startswith("bert at ")] == [f"bert at {p.replace('x', '×')}" for p in POINTS]
    title = next(i for i, line in enumerate(lines) if line.startswith("bert: tokens/s at each shape point"))
    assert lines[title + 1].split() == ["variant", "toolchain", "2×8", "2×32", "4×32"]
    sweep_lines = {tuple(line.split()[:2]): line.split()[2:] for line in lines[title + 3 : title + 6]}
    assert set(sweep_lines) == {("fp32", toolchain) for toolchain in SWEPT}
    data = json.loads(run_cli(catalog, "compare", "--format", "json", "--metric", "tokens").out)
    rows = {(r["toolchain"], r["shape"]): r for r in data["rows"]}
    for (_, toolchain), cells in sweep_lines.items():
        for shape, cell in zip(POINTS, cells):
            assert float(cell.lstrip("*").replace(",", "")) == pytest.approx(rows[(toolchain, shape)]["tokens_per_s"], rel=1e-3, abs=1)
    for verdict in data["verdicts"]:  # the fastest of the point's rows, marked in its column
        left_out = {entry["toolchain"] for entry in verdict["excluded"]} if not verdict["untrusted"] else set()
        at_point = [r for r in data["rows"] if r["shape"] == verdict["shape"] and r["toolchain"] not in left_out]
        assert verdict["fastest"]["median_ms"] == min(r["median_ms"] for r in at_point)
        column = POINTS.index(verdict["shape"])
        assert sweep_lines[("fp32", verdict["fastest"]["toolchain"])][column].startswith("*")
    (sweep,) = data["sweeps"]
    assert sweep["shapes"] == POINTS and len(sweep["crossovers"]) == 3  # every two of the three toolchains
    # Each end says a lead only where its interval shows one.
    said = (" is faster than ", " cannot be told apart ", " are the same within the tie width ")
    assert all(sentence.startswith("fp32: ") and any(words in sentence for words in said) for sentence in sweep["crossovers"])


def test_the_html_report_opens_with_the_answer_and_draws_the_sweep(swept, run_cli):
    result = run_cli(swept / "pipeline.toml", "compare", "--format", "html")
    assert result.exit_code == 0, result.err
    text = (swept / "reports" / "compare.html").read_text()
    assert text.index('<div class="verdict">') < text.index('<table class="sweep">') < text.index('<table class="comparison">')
    assert "latency, tokens/s and memory against sequence length" in text
    assert '<ul class="crossovers">' in text
    # The rows' throughput in the model's unit, as in the terminal and markdown.
    rows_table = text[text.index('<table class="comparison">') :]
    assert "<th>seq/s</th>" in rows_table and "<th>img/s</th>" not in rows_table


def test_the_sweep_html_renders_in_chromium(swept, run_cli, tmp_path):
    assert run_cli(swept / "pipeline.toml", "compare", "--format", "html").exit_code == 0
    dom = render_in_chromium(swept / "reports" / "compare.html", tmp_path).dom
    assert 'class="verdict"' in dom and 'class="sweep"' in dom and "is faster than" in dom and dom.count("<img") >= 3


def test_a_point_out_of_gpu_memory_is_recorded_and_the_rest_still_run(tmp_path, run_cli, monkeypatch):
    """As on a GPU that cannot hold the largest point: PyTorch's OutOfMemoryError, with the GPU's
    free and total memory named, for that point only."""
    import torch

    from pipeline.measuring.out_of_memory import out_of_memory_as_error
    from pipeline.runtimes.pytorch.runtime import TorchRuntime

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (512 * 2**20, 81_559 * 2**20))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H100 80GB HBM3")
    prepare = TorchRuntime.prepare

    def prepare_until_the_largest(self, engine_path, workload=None):
        if workload is not None and workload.shape == "4x32":
            with out_of_memory_as_error(4, shape=workload.shape):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
        return prepare(self, engine_path, workload)

    monkeypatch.setattr(TorchRuntime, "prepare", prepare_until_the_largest)
    (tmp_path / "pipeline.toml").write_text(SWEEP_CATALOG)
    catalog = tmp_path / "pipeline.toml"
    result = run_cli(catalog, "run", "--model", "bert", "--toolchain", "torch-eager", "--toolchain", "onnxruntime")
    assert result.exit_code == 0  # out of memory is a result, said with a WARNING
    assert (
        "WARNING bert_fp32 on torch-eager at 4x32: out of GPU memory at shape 4×32: 512 MiB free of 81,559 MiB on NVIDIA H100 80GB HBM3"
        in result.err
    )
    assert "1 did not fit in memory, recorded as results" in result.err
    failed = point_manifest(tmp_path, "torch-eager", "4x32").profile
    assert failed.status == "out_of_memory" and failed.reason.startswith("out of GPU memory at shape 4×32: 512 MiB free of 81,559 MiB")
    assert failed.out_of_memory.free_bytes == 512 * 2**20 and failed.out_of_memory.requested_bytes == 3 * 2**30
    assert point_manifest(tmp_path, "torch-eager", "2x32").profile.status == "done"
    assert point_manifest(tmp_path, "onnxruntime", "4x32").profile.status == "done"  # the next toolchain still ran
    assert "The answer" in result.out  # the comparison of what did run, printed anyway

    table = run_cli(catalog, "compare").out
    eager = next(line for line in table.splitlines() if line.startswith("fp32     torch-eager "))
    assert eager.endswith("out of memory")
    verdict = next(line for line in table.splitlines() if line.startswith("bert at 4×32"))
    assert "fastest is fp32 on onnxruntime" in verdict or "fastest of them is fp32 on onnxruntime" in verdict
    (largest,) = [v for v in json.loads(run_cli(catalog, "compare", "--format", "json").out)["verdicts"] if v["shape"] == "4x32"]
    (did_not_fit,) = largest["out_of_memory"]
    assert did_not_fit["toolchain"] == "torch-eager" and did_not_fit["why"] == failed.reason
    assert "Did not fit: fp32 on torch-eager (out of GPU memory at shape 4×32: 512 MiB free" in largest["text"]
    assert run_cli(catalog, "compare", "--format", "html").exit_code == 0
    html = (tmp_path / "reports" / "compare.html").read_text()
    assert '<td class="failed">out of memory</td>' in html and "out of GPU memory at shape 4×32" in html


def test_an_sdpa_kernel_pytorch_cannot_use_is_a_recorded_refusal_with_its_reason(tmp_path, run_cli):
    (tmp_path / "pipeline.toml").write_text(SWEEP_CATALOG)
    result = run_cli(tmp_path / "pipeline.toml", "build", "--engine", "bert_fp32", "--toolchain", "torch-efficient")
    assert result.exit_code == 1
    build = read_manifest(tmp_path / "manifests" / "torch-efficient" / "bert_fp32.json").build
    assert build.status == "failed"
    assert build.reason.startswith("PyTorch cannot run scaled-dot-product attention with the efficient kernel here: ")
    assert build.details.compiler["sdpa_backend"] == "efficient" and build.details.compiler["error"]


def test_a_toolchain_switches_the_attention_of_each_family(tmp_path):
    from pipeline.models import model_source, spec_class
    from pipeline.models.transformers import import_transformers

    import_transformers()
    spec = spec_class({"transformers": "BertModel"}).model_validate(
        {
            "transformers": "BertModel",
            "config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64},
            "shapes": ["1x8"],
        }
    )
    source = model_source("bert", spec, tmp_path)
    model = source.runnable(source.create())
    source.use_attention(model, "eager")
    assert model.model.config._attn_implementation == "eager"
    source.use_attention(model, "sdpa")
    assert model.model.config._attn_implementation == "sdpa"

    vit = model_source("vit", spec_class({"timm": "x"}).model_validate({"timm": "vit_tiny_patch16_224", "batch_size": 1}), tmp_path)
    created = vit.create()
    vit.use_attention(created, "eager")
    blocks = [m for m in created.modules() if hasattr(m, "fused_attn")]
    assert blocks and not any(m.fused_attn for m in blocks)


@needs_inductor
def test_torch_compile_dynamic_compiles_once_and_counts_what_each_point_recompiles(tmp_path, run_cli):
    (tmp_path / "pipeline.toml").write_text(SWEEP_CATALOG)
    result = run_cli(tmp_path / "pipeline.toml", "run", "--model", "bert", "--toolchain", "torch-compile-dynamic")
    assert result.exit_code == 0, result.err
    first, *others = (point_manifest(tmp_path, "torch-compile-dynamic", shape).profile.details.execution for shape in POINTS)
    assert first["dynamic"] is True and first["recompiles"] == 0 and "compiled_at_another_point" not in first
    for execution in others:
        assert execution["compiled_at_another_point"] is True and execution["compile_s"] == first["compile_s"]
        assert isinstance(execution["recompiles"], int) and execution["warm_s"] >= 0
    for execution in (first, *others):
        assert execution["recompiles_during_measurement"] == 0  # every point was warmed before it was timed


@needs_inductor
def test_a_run_compiles_every_point_of_every_compiled_engine_side_by_side_and_times_each_where_it_was_compiled(
    tmp_path, run_cli, monkeypatch
):
    """Two compiled engines, three points each, in a run that profiles them: each build writes its
    engine and hands every point over, its own first point too, so the six compile in one set of
    processes rather than each build's first in this process one after the other; each process
    keeps the points it compiled, and once all are compiled serves them to their profiles: this
    process traces none of them, and each point is checked and timed in the process that
    compiled it, in rounds as any other. The processes end with the run."""
    import multiprocessing
    import os

    from pipeline.runtimes.pytorch import compile_ahead
    from pipeline.runtimes.pytorch.preparing import TorchPreparation
    from pipeline.stages.work_ahead import WorkAhead

    # Two processes (this machine's CPUs may be too few to choose that on their own); the cache is
    # this test's alone.
    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 4)
    events = []  # what this process did, in order: each build's hand-over, each preparation and the wait
    handing_over, preparing, finishing = WorkAhead.submit, TorchPreparation.prepare, WorkAhead.finish
    monkeypatch.setattr(WorkAhead, "submit", lambda self, stage, work: events.append(stage.toolchain) or handing_over(self, stage, work))
    monkeypatch.setattr(
        TorchPreparation, "prepare", lambda *args, **kwargs: events.append(f"prepared at {args[6]}") or preparing(*args, **kwargs)
    )
    monkeypatch.setattr(
        WorkAhead, "finish", lambda self, **given: events.append("waiting") or finishing(self, **given) or events.append("waited")
    )
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    compiled = ("torch-compile", "torch-compile-eager-attn")
    (tmp_path / "pipeline.toml").write_text(
        SWEEP_CATALOG
        + '\n[toolchains.torch-compile]\nkind = "torch"\nbackend = "compile"\n'
        + '\n[toolchains.torch-compile-eager-attn]\nkind = "torch"\nbackend = "compile"\nattn_implementation = "eager"\n'
    )
    result = run_cli(
        tmp_path / "pipeline.toml",
        "run",
        "--model",
        "bert",
        "--toolchain",
        "torch-eager",
        *(arg for name in compiled for arg in ("--toolchain", name)),
    )
    assert result.exit_code == 0, result.err
    assert "ahead of profiles" in result.err, result.err
    # Neither compiled build compiled or prepared anything in this process, before the wait or
    # after it: the eager engine is the only one, prepared here by its build at the first point
    # and, while the run waited for the compilations, at the others.
    assert events == ["torch-compile", "torch-compile-eager-attn", f"prepared at {POINTS[0]}", "waiting"] + [
        f"prepared at {shape}" for shape in POINTS[1:]
    ] + ["waited"], events
    aheads = [read_manifest(tmp_path / "manifests" / name / "bert_fp32.json").build.details.compiler["compiled_ahead"] for name in compiled]
    for ahead in aheads:
        assert ahead["processes"] == 2 and ahead["engines"] == 2 and sorted(ahead["points"]) == sorted(POINTS), ahead
        assert all(point["compile_s"] > 0 and point["graphs"] >= 1 for point in ahead["points"].values()), ahead
        assert ahead["served"] == 6 and 0 < ahead["compiled_s"] <= ahead["wall_s"], ahead
    assert aheads[0]["wall_s"] == aheads[1]["wall_s"]  # one set of processes for both
    assert not list((tmp_path / "engines").rglob("*.ahead"))  # the engines' second names went with the work
    servers = set()
    for name, ahead in zip(compiled, aheads, strict=True):
        for shape in POINTS:
            profile = point_manifest(tmp_path, name, shape).profile
            assert profile.status == "done", (name, shape, profile.reason)
            execution = profile.details.execution
            served_by = execution["served_by"]
            assert served_by["process"].startswith("pipeline-compile-") and served_by["pid"] != os.getpid(), execution
            servers.add(served_by["pid"])
            # What that process compiled, as it compiled it: its graphs, on its threads, and
            # nothing compiled again while it was timed.
            assert execution["compile_s"] == ahead["points"][shape]["compile_s"] and execution["graphs"] >= 1, (name, shape, execution)
            assert execution["threads"] == ahead["points"][shape]["threads"] >= 1, (name, shape, execution)
            assert execution["recompiles_during_measurement"] == 0
            rounds = profile.details.rounds[0]
            assert rounds.rounds >= 6 and len(rounds.entrants) == 3 and all(take.median_ms > 0 for take in rounds.takes), rounds
            # Checked there too, against FP32, and as close as the eager engine checked here.
            accuracy = profile.details.accuracy
            assert served_by["process"] in accuracy["checked_by"] and accuracy["cosine_similarity"] > 0.999, accuracy
            eager = point_manifest(tmp_path, "torch-eager", shape).profile.details
            assert "this process" in eager.accuracy["checked_by"] and eager.rounds[0].group == rounds.group
            # Prepared (its build's model taken as it was, at the first point) and checked ahead of its point.
            assert eager.prepared_ahead is True and eager.preparation_s["check"] > 0, (shape, eager.preparation_s)
            assert profile.details.prepared_ahead is False  # the compiled engines: served, ready at their point
    assert len(servers) == 2, servers  # both processes served
    assert multiprocessing.active_children() == []  # they ended with the run


@needs_inductor
def test_a_compiled_build_asked_for_alone_compiles_its_first_point_itself(tmp_path, run_cli, monkeypatch):
    """`pipeline build` has no profiles to prepare for: the build compiles its own first point
    (a refusal there is the build's), the other points beside it."""
    from pipeline.runtimes.pytorch import compile_ahead

    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 4)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "pipeline.toml").write_text(SWEEP_CATALOG + '\n[toolchains.torch-compile]\nkind = "torch"\nbackend = "compile"\n')
    result = run_cli(tmp_path / "pipeline.toml", "build", "--model", "bert", "--toolchain", "torch-compile")
    assert result.exit_code == 0, result.err
    compiler = read_manifest(tmp_path / "manifests" / "torch-compile" / "bert_fp32.json").build.details.compiler
    assert compiler["graphs"] >= 1 and compiler["compile_s"] > 0, compiler  # its own point, compiled by the build
    assert sorted(compiler["compiled_ahead"]["points"]) == sorted(POINTS[1:]), compiler


@needs_inductor
def test_a_compiled_engine_built_alone_compiles_its_points_beside_its_own_first(tmp_path, monkeypatch):
    """A build outside a run of several engines (a cluster's build task) has no run's pool: it
    opens its own as soon as it has written the engine, compiles its first point meanwhile, and
    waits for the rest before it ends, their facts in its manifest."""
    from pipeline.runtimes import load_catalog
    from pipeline.runtimes.pytorch import compile_ahead
    from pipeline.runtimes.pytorch.preparing import TorchPreparation
    from pipeline.stages.base import RunContext
    from pipeline.stages.build import BuildStage
    from pipeline.stages.export import ExportStage
    from pipeline.stages.point import profile_point
    from pipeline.stages.runner import stage_for
    from pipeline.workspace import Workspace

    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 4)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    events = []
    handing_over, preparing = compile_ahead.CompilePool.submit, TorchPreparation.prepare
    monkeypatch.setattr(compile_ahead.CompilePool, "submit", lambda self, work: events.append("handed over") or handing_over(self, work))
    monkeypatch.setattr(TorchPreparation, "prepare", lambda *args, **kwargs: events.append("compiled") or preparing(*args, **kwargs))
    (tmp_path / "pipeline.toml").write_text(SWEEP_CATALOG + '\n[toolchains.torch-compile]\nkind = "torch"\nbackend = "compile"\n')
    catalog = load_catalog(tmp_path / "pipeline.toml")
    ctx = RunContext(catalog=catalog, workspace=Workspace(tmp_path))
    assert ctx.ahead is None
    (engine,) = catalog.select((), ("bert",), ("fp32",))
    ExportStage(ctx, engine).run()
    BuildStage(ctx, engine, "torch-compile").run()
    ahead = read_manifest(tmp_path / "manifests" / "torch-compile" / "bert_fp32.json").build.details.compiler["compiled_ahead"]
    assert ahead["processes"] == 2 and sorted(ahead["points"]) == sorted(POINTS[1:]), ahead  # the first is the build's own
    assert all(point["graphs"] >= 1 for point in ahead["points"].values()), ahead
    assert events[:2] == ["handed over", "compiled"], events
    assert not list((tmp_path / "engines").rglob("*.ahead"))
    # Profiled by runtimes that kept nothing of the build (a point worker, or a run's runtime that
    # has built another engine since), every point finds its graphs in the cache: the first one's
    # from the build itself, prepared with other tensors of the same shapes than its profile's.
    fresh = RunContext(catalog=catalog, workspace=Workspace(tmp_path))
    for shape in POINTS:
        profile_point([stage_for(fresh, "profile", engine, "torch-compile", shape)])
        execution = read_manifest(tmp_path / "manifests" / "torch-compile" / f"bert_fp32@{shape}.json").profile.details.execution
        assert execution["inductor_cache_hits"] == execution["graphs"] >= 1, (shape, execution)


def test_work_ahead_of_profiles_goes_on_in_one_pool_per_kind_and_a_failure_only_costs_time(capsys):
    """The builds' work ahead of their profiles: each handed over as its build ends (it runs from
    then on), the works of one kind in one pool, all of it waited for once and each engine's
    evidence recorded for it; a kind whose pool fails is a warning, and the run goes on."""
    from types import SimpleNamespace

    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.base import AheadPool, AheadWork
    from pipeline.stages.work_ahead import WorkAhead

    events, recorded = [], {}

    class Together(AheadPool):
        def __init__(self):
            events.append("open")
            self.works = []

        def submit(self, work):
            events.append(f"submit {work.engine_path.name}")
            self.works.append(work)
            return True

        def finish(self, progress, done=None):
            events.append("finish")
            return [{"compiler": {"compiled_ahead": {"points": len(work.jobs)}}} for work in self.works], None

        def close(self):
            events.append("close")

    class Failing(Together):
        def submit(self, work):
            raise OSError("no processes here")

    def stage(name):
        return SimpleNamespace(
            engine=SimpleNamespace(name=name), toolchain="t", record_ahead=lambda facts: recorded.setdefault(name, facts)
        )

    ahead = WorkAhead(Reporter())
    assert ahead.submit(stage("a"), AheadWork(Path("a.pt"), [1, 2], Together))
    assert events == ["open", "submit a.pt"]  # started as its build ended, not after the others
    assert not ahead.submit(stage("b"), AheadWork(Path("b.pt"), [1, 2, 3], Failing))
    assert ahead.submit(stage("c"), AheadWork(Path("c.pt"), [1], Together))
    assert not ahead.submit(stage("d"), AheadWork(Path("d.pt"), [1], Failing))  # that pool is not tried again
    # The failing pool is opened, fails, and is closed at once: nothing it started runs on.
    assert events == ["open", "submit a.pt", "open", "close", "submit c.pt"]
    ahead.finish()
    ahead.close()
    assert events[5:] == ["finish", "close"]
    assert recorded == {"a": {"compiler": {"compiled_ahead": {"points": 2}}}, "c": {"compiler": {"compiled_ahead": {"points": 1}}}}
    err = capsys.readouterr().err
    assert "WARNING nothing done ahead of profiles for b on t: OSError: no processes here" in err
    assert "WARNING nothing done ahead of profiles for d on t: OSError: no processes here" in err
    assert "2 engines" in err and "done" in err


def _row(toolchain, shape, median, spread=0.01, **extra) -> ComparisonRow:
    """A measured row whose median's interval is ± ``spread`` (measured apart from the others)."""
    row = ComparisonRow(
        model="m",
        variant="fp16",
        toolchain=toolchain,
        status="measured (GPU time)",
        shape=shape,
        median_ms=median,
        median_ci_ms=(median * (1 - spread), median * (1 + spread)),
    )
    for key, value in extra.items():
        setattr(row, key, value)
    return row


def test_the_verdict_skips_the_inaccurate_and_says_the_speedup_over_the_baseline():
    rows = [
        _row("torch-eager", "2x512", 20.0),
        _row("trt", "2x512", 2.0, accuracy_source="measured", accuracy_cosine=0.97),
        _row("inductor", "2x512", 5.0, accuracy_source="measured", accuracy_cosine=0.9999),
        ComparisonRow(model="m", variant="fp16", toolchain="rtx", status="build refused: no kernel", shape="2x512"),
        ComparisonRow(model="m", variant="fp16", toolchain="ort", status="skipped: needs CUDA", shape="2x512"),
    ]
    (verdict,) = verdicts(rows, "torch-eager", {"m": AccuracyFloor((("cos", 0.99),))})
    assert verdict.fastest.toolchain == "inductor" and verdict.speedup == pytest.approx(4.0)
    text = " ".join(verdict.sentences())
    assert text.startswith(
        "m at 2×512: fastest meeting cosine ≥ 0.99 is fp16 on inductor, 5.000 ms, faster than the other with 95% confidence "
        "(by their own intervals) — 4.00× fp16 on torch-eager (20.000 ms), [3.92–4.08], unpaired."
    )
    assert "fp16 on trt (below the accuracy floor: cosine 0.9700 < 0.99)" in text and "fp16 on rtx (build refused: no kernel)" in text
    assert "1 not run" in text


def test_an_engine_refused_at_its_build_is_left_out_at_every_point_not_answered_on_its_own():
    """A build that failed before any shape point has a row without a point: each point's verdict
    names it as left out; there is no verdict of its own saying no engine was measured."""
    rows = [
        _row("torch-eager", "2x512", 20.0),
        _row("torch-eager", "4x2048", 80.0),
        ComparisonRow(model="m", variant="fp16", toolchain="graphs", status="build refused: the capture failed", shape=None),
    ]
    found = verdicts(rows, "torch-eager")
    assert [verdict.shape for verdict in found] == ["2x512", "4x2048"]
    for verdict in found:
        assert verdict.fastest.toolchain == "torch-eager"
        assert "Left out: fp16 on graphs (build refused: the capture failed)" in " ".join(verdict.sentences())
    # A model of one shape keeps its one verdict.
    (alone,) = verdicts([_row("torch-eager", None, 20.0), rows[2]], "torch-eager")
    assert alone.shape is None and alone.fastest.toolchain == "torch-eager"


def test_a_speedup_over_a_launch_bound_baseline_says_it_follows_the_host():
    launch_bound = ["launch-bound: the host needs 97% of a run's GPU time to issue it; its time is the host's speed"]
    rows = [_row("torch-eager", "2x512", 20.0, flags=launch_bound), _row("graphs", "2x512", 3.0)]
    (verdict,) = verdicts(rows, "torch-eager")
    assert verdict.fastest.toolchain == "graphs"  # a flag, not a reason to leave it out
    assert "fp16 on torch-eager (20.000 ms), launch-bound: the speedup follows the host's speed" in " ".join(verdict.sentences())
    near = ["near launch-bound: the host needs 55% of a run's GPU time to issue it"]
    (steady,) = verdicts([_row("torch-eager", "2x512", 20.0, flags=near), _row("graphs", "2x512", 3.0)], "torch-eager")
    assert "follows the host" not in " ".join(steady.sentences())


def test_a_noisy_measurement_is_no_reason_to_leave_an_engine_out_and_an_inaccurate_one_never_answers():
    noisy = ["noisy: interquartile CV 40.0% is above 10%"]
    rows = [
        _row("torch-eager", "2x512", 20.0, flags=noisy),
        _row("trt", "2x512", 2.0, accuracy_source="measured", accuracy_cosine=0.97, flags=noisy),
        _row("inductor", "2x512", 5.0, accuracy_source="measured", accuracy_cosine=0.9999, flags=noisy),
    ]
    (verdict,) = verdicts(rows, "torch-eager", {"m": AccuracyFloor((("cos", 0.99),), "pipeline.toml")})
    assert not verdict.untrusted and verdict.fastest.toolchain == "inductor"
    assert [(row.toolchain, why) for row, why in verdict.excluded] == [("trt", "below the accuracy floor: cosine 0.9700 < 0.99")]
    assert "fastest meeting cosine ≥ 0.99 (pipeline.toml) is fp16 on inductor" in " ".join(verdict.sentences())
    (nothing,) = verdicts(rows[1:2], "torch-eager", {"m": AccuracyFloor((("cos", 0.99),), "pipeline.toml")})
    assert nothing.sentences()[0] == "m at 2×512: no engine was measured and met the accuracy floor, cosine ≥ 0.99 (pipeline.toml)."
    busy = ["busy: runnable tasks waited for a CPU 30% of the measurement"]
    (untrusted,) = verdicts([_row("torch-eager", "2x512", 20.0, flags=busy), _row("inductor", "2x512", 5.0, flags=busy)], "torch-eager")
    assert untrusted.untrusted and untrusted.fastest.toolchain == "inductor"  # a busy machine still excludes, and says so


def test_a_floor_given_replaces_each_precisions_own_check():
    """nvfp4's own check wants cosine 0.95; a user who accepts 0.9 gets the engine at 0.93."""
    rows = [
        _row("torch-eager", "2x512", 20.0),
        _row("trt", "2x512", 2.0, accuracy_source="measured", accuracy_cosine=0.93, flags=["inaccurate: cosine 0.9300 < 0.95"]),
    ]
    (own,) = verdicts(rows, "torch-eager")
    assert own.fastest.toolchain == "torch-eager" and own.excluded[0][1].startswith("inaccurate")
    (looser,) = verdicts(rows, "torch-eager", {"m": AccuracyFloor((("cos", 0.9),), "--fail-accuracy-below")})
    assert looser.fastest.toolchain == "trt" and not looser.excluded


def test_a_crossover_is_said_where_the_lead_changes():
    rows = [
        _row("eager", "2x512", 20.0),
        _row("eager", "2x2048", 22.0),
        _row("eager", "2x4096", 40.0),
        _row("inductor", "2x512", 6.0),
        _row("inductor", "2x2048", 25.0),
        _row("inductor", "2x4096", 60.0),
    ]
    (sweep,) = sweeps(rows, verdicts(rows, "eager"))
    (sentence,) = sweep.crossovers()
    assert sentence == (
        "fp16: inductor is faster than eager by 3.33× [3.27–3.40] at 2×512; eager is faster than inductor by 1.50× [1.47–1.53] "
        "at 2×4096; eager takes the lead between 2×512 and 2×2048."
    )
    assert [sweep.cell(("fp16", "eager"), shape, "ms") for shape in ("2x512", "2x2048")] == ["20.000", "*22.000"]


def test_a_crossover_claims_no_lead_its_intervals_do_not_show():
    """Two lines whose medians swap between points but whose intervals cannot tell them apart: the
    sentence says so at each end and names no change of lead (a lead read off the medians alone
    was a claim no interval backed)."""
    rows = [
        _row("eager", "2x512", 20.0, spread=0.05),
        _row("eager", "2x2048", 20.4, spread=0.05),
        _row("inductor", "2x512", 20.3, spread=0.05),
        _row("inductor", "2x2048", 20.1, spread=0.05),
    ]
    (sweep,) = sweeps(rows, verdicts(rows, "eager"))
    (sentence,) = sweep.crossovers()
    assert sentence == (
        "fp16: eager and inductor cannot be told apart [0.92–1.12] at 2×512; inductor and eager cannot be told apart [0.92–1.12] at 2×2048."
    )
    assert "lead" not in sentence and "faster" not in sentence


# --- the verdict by confidence ------------------------------------------------------------------


def _paired(toolchain: str, medians: list[float], pooled_median: float | None = None, **extra) -> ComparisonRow:
    """A row timed in the rounds of one group ("g"), its take median in each round given."""
    median = pooled_median if pooled_median is not None else sorted(medians)[len(medians) // 2]
    extra.setdefault("rounds_stop", "decided")
    return _row(toolchain, "2x2048", median, round_medians={"g": list(medians)}, rounds=len(medians), **extra)


def test_a_noisy_engine_faster_with_confidence_is_the_answer():
    """The seed workload at 2×2048 on the lent H100: eager SDPA's runs spread widely (the host
    stalls), yet in every round it beat eager attention; it is named, never the slower one."""
    host = [1.0, 1.7, 1.8, 1.0, 1.1, 1.75, 1.0, 1.8]
    eager = _paired("torch-eager", [22.8 * h for h in host], flags=["noisy: interquartile CV 21.5% is above 10%"])
    attention = _paired("torch-eager-attn", [40.3 * h for h in host])
    (verdict,) = verdicts([eager, attention], "torch-eager")
    assert verdict.fastest is eager and not verdict.tied and not verdict.untrusted
    (a, b, estimate) = verdict.comparisons[0]
    assert (a, b, estimate.outcome, estimate.rounds) == (eager, attention, "faster", 8)
    assert "fastest is fp16 on torch-eager" in verdict.sentences()[0]


def test_a_slower_engine_is_never_named_over_one_faster_with_confidence():
    """B's pooled median is the lower (it ran more of its runs while the host was fast), but A
    was faster in every round: the answer is A."""
    a = _paired("a", [10.0, 18.0, 10.0, 18.0, 10.0, 18.0], pooled_median=14.0)
    b = _paired("b", [11.0, 19.8, 11.0, 19.8, 11.0, 19.8], pooled_median=12.0)
    (verdict,) = verdicts([a, b], "b")
    assert verdict.fastest is a and verdict.speedup == pytest.approx(1.1)
    assert "[1.10–1.10], 6 rounds" in verdict.sentences()[0]


def test_engines_within_the_tie_width_tie_and_the_verdict_names_both():
    compiled = _paired("torch-compile", [3.10, 3.12, 3.08, 3.11, 3.09, 3.10])
    graphs = _paired("torch-cudagraphs", [3.14, 3.13, 3.12, 3.15, 3.13, 3.12])
    eager = _paired("torch-eager", [9.6, 9.8, 9.5, 9.9, 9.7, 9.6])
    (verdict,) = verdicts([eager, compiled, graphs], "torch-eager")
    assert verdict.fastest is compiled and verdict.tied == [graphs] and not verdict.undecided
    assert verdict.sentences()[0].startswith(
        "m at 2×2048: fp16 on torch-compile and fp16 on torch-cudagraphs tie within ±3% (3.100 and 3.130 ms) — both 3.04–3.18× fp16 on torch-eager (9.700 ms)."
    )
    public = verdict.public()
    assert public["decided"] is False and public["undecided"] is False and [t["toolchain"] for t in public["tied"]] == ["torch-cudagraphs"]
    outcomes = {(c["a"]["toolchain"], c["b"]["toolchain"]): c["outcome"] for c in public["comparisons"]}
    assert outcomes == {
        ("torch-eager", "torch-compile"): "slower",
        ("torch-eager", "torch-cudagraphs"): "slower",
        ("torch-compile", "torch-cudagraphs"): "same",
    }


def test_a_group_holding_the_baseline_sets_only_its_others_against_it():
    """The baseline's own 1.00× is no speedup: where it ties with the answer, the words give the
    others' ratios to it, paired or (rows without rounds) by their medians."""
    compiled = _paired("torch-compile", [3.10, 3.12, 3.08, 3.11, 3.09, 3.10])
    graphs = _paired("torch-cudagraphs", [3.14, 3.13, 3.12, 3.15, 3.13, 3.12])
    (verdict,) = verdicts([compiled, graphs], "torch-cudagraphs")
    assert verdict.tied == [graphs]
    assert verdict.sentences()[0].endswith("— the other 1.01× fp16 on torch-cudagraphs (3.130 ms), [1.00–1.01], 6 rounds.")
    unpaired = [
        ComparisonRow(model="m", variant="fp16", toolchain=t, status="measured (GPU time)", median_ms=m)
        for t, m in (("a", 10.0), ("b", 10.1), ("c", 12.0))
    ]
    (verdict,) = verdicts(unpaired, "a")
    assert verdict.undecided
    assert verdict.sentences()[0].endswith("— the others 0.83×–0.99× fp16 on a (10.000 ms).")


def test_too_few_rounds_for_an_interval_are_said_so_not_shown_as_one():
    """Four rounds of two engines, B slower in each: no interval reaches 95 % (six rounds do).
    The crossovers give the rounds' range as a range, and the answer's speedup is the medians'."""
    a = _paired("a", [1.0, 1.1, 1.0, 1.2], rounds_stop="budget")
    b = _paired("b", [2.0, 2.4, 2.1, 2.6], rounds_stop="budget")
    (verdict,) = verdicts([a, b], "b")
    assert verdict.undecided and verdict.sentences()[0].endswith("— the other 2.18× fp16 on b (2.400 ms).")
    (sweep,) = sweeps([a, b], [verdict])
    (sentence,) = sweep.crossovers()
    assert sentence == "fp16: a and b cannot be told apart in 4 rounds, too few for an interval (their ratios ranged 2.00–2.18) at 2×2048."
    # The JSON keeps the range apart from the interval keys, which a script reads as an interval.
    public = verdict.public()
    (pair,) = public["comparisons"]
    assert pair["bounded"] is False and pair["low"] is pair["high"] is pair["confidence"] is None
    assert pair["ratios_range"] == [pytest.approx(1.1 / 2.4), pytest.approx(0.5)]  # a over b, each round
    assert public["speedup_interval"] is None and public["speedup_over_baseline"] == pytest.approx(2.18, abs=0.01)


def test_too_few_rounds_for_an_interval_mark_no_difference_in_the_table(tmp_path):
    """The table's speedup columns read the same pairs: too few rounds tell nothing apart ("~"),
    where the range of four rounds, excluding 1, marked it as beyond the runs' spread."""
    from pipeline.report.row_cache import RowCache
    from pipeline.report.row_comparisons import compare_rows
    from pipeline.runtimes import load_catalog

    catalog = load_catalog(write_catalog(tmp_path, tiny_bert_catalog(POINTS, ["fp16"], ["fp16"]) + CPU_TOOLCHAINS))
    few = [_paired("onnxruntime", [1.0, 1.1, 1.0, 1.2]), _paired("torch-eager", [2.0, 2.4, 2.1, 2.6])]
    enough = [_paired("onnxruntime", [1.0, 1.1, 1.0, 1.2] * 3), _paired("torch-eager", [2.0, 2.4, 2.1, 2.6] * 3)]
    for rows, told_apart in ((few, False), (enough, True)):
        for row in rows:
            row.model, row.samples_ms = "bert", list(row.round_medians["g"])
            row.round_entrants = {"g": (f"fp16/{row.toolchain}", ("fp16/onnxruntime", "fp16/torch-eager"))}
        compare_rows(catalog, rows, None, RowCache(None, 0.1))
        (fast,) = [row for row in rows if row.toolchain == "onnxruntime"]
        assert fast.vs_baseline_toolchain_significant is told_apart


def test_overlapping_intervals_that_are_not_a_tie_are_undecided_and_say_after_how_many_rounds():
    a = _paired("a", [1.0, 1.3, 1.0, 1.3, 1.0, 1.3], rounds_stop="budget")
    b = _paired("b", [1.2, 1.0, 1.2, 1.0, 1.2, 1.0])
    (verdict,) = verdicts([a, b], "a")
    assert verdict.tied and verdict.undecided
    assert "undecided: fp16 on b and fp16 on a (1.200 and 1.300 ms)" in verdict.sentences()[0]
    assert "cannot be told apart after 6 rounds (the point's budget_s ran out)" in verdict.sentences()[0]


def test_a_lead_by_less_or_more_than_the_tie_width_decides_by_its_interval():
    """Two H100 runs of the same matrix at 4×2048: torch-compile over reduce-overhead 1.011 in
    every round but a few, with its launch-bound spread reaching 1.06. The interval excludes 1 and
    reaches across the band's edge: reduce-overhead is faster by it, and the answer names it (a run
    whose interval lies inside the band says "the same", which this interval does not contradict);
    the JSON marks the comparison at the band's edge."""
    overhead = [9.64, 9.63, 9.65, 9.64, 9.62, 9.64, 9.65, 9.63, 9.64]
    compiled = _paired("torch-compile", [a * r for a, r in zip(overhead, [1.011, 1.012, 1.058, 1.013, 1.011, 1.05, 1.012, 1.04, 1.013])])
    reduce = _paired("torch-reduce-overhead", overhead, rounds_stop="budget")
    (verdict,) = verdicts([compiled, reduce], "torch-compile")
    estimate = verdict.ratio(compiled, reduce)
    assert estimate.outcome == "slower" and 1.0 < estimate.low < 1.03 < estimate.high  # apart, across the edge
    assert verdict.fastest is reduce and not verdict.tied
    assert "fastest is fp16 on torch-reduce-overhead" in verdict.sentences()[0]
    assert "faster than the other with 95% confidence (paired over 9 rounds)" in verdict.sentences()[0]
    public = verdict.public()
    assert public["decided"] is True and public["undecided"] is False
    assert [c["at_band_edge"] for c in public["comparisons"]] == [True]

    # The same lead with every round beyond the band: decided, and not at the edge.
    clear = _paired("torch-compile", [a * 1.06 for a in overhead])
    (verdict,) = verdicts([clear, reduce], "torch-compile")
    assert verdict.fastest is reduce and not verdict.tied
    assert [c["at_band_edge"] for c in verdict.public()["comparisons"]] == [False]


def test_rows_measured_apart_are_compared_by_their_own_intervals():
    narrow = _row("trt", "2x512", 10.0, spread=0.01)
    overlapping = _row("rtx", "2x512", 10.3, spread=0.05)
    clearly = _row("ort", "2x512", 14.0, spread=0.01)
    (verdict,) = verdicts([narrow, overlapping, clearly], "ort")
    assert verdict.fastest is narrow and verdict.tied == [overlapping] and verdict.undecided
    outcomes = {(a.toolchain, b.toolchain): e.outcome for a, b, e in verdict.comparisons}
    assert outcomes[("trt", "ort")] == "faster" and outcomes[("trt", "rtx")] == "ambiguous"
    assert all(not e.paired for _, _, e in verdict.comparisons)


def test_rows_timed_apart_that_follow_the_host_are_told_apart_only_beyond_its_swing():
    """An engine launch-bound or timed by the host's clock, profiled in a run of its own, may have
    run in a slow spell of its host (1.8x on the lent GPUs): compared with a row of another run,
    their ratio's interval is widened by HOST_SWING each way, whichever of the two follows it.
    Intervals far narrower than the spells decide nothing within the swing, and still decide
    beyond it."""
    from pipeline.measuring.pace import HOST_SWING
    from pipeline.report.confidence import time_ratio

    launch_bound = ["launch-bound: the host needs 95% of a run's GPU time to issue it"]
    gpu = _row("trt", "2x512", 10.0, spread=0.01)
    alone = _row("eager", "2x512", 15.0, spread=0.01, flags=launch_bound)
    assert alone.follows_the_host and not gpu.follows_the_host
    estimate = time_ratio(gpu, alone, 0.03)
    unwidened = (9.9 / 15.15, 10.1 / 14.85)
    assert (estimate.low, estimate.high) == pytest.approx((unwidened[0] / HOST_SWING, unwidened[1] * HOST_SWING))
    assert estimate.outcome == "ambiguous" and not estimate.paired
    (verdict,) = verdicts([gpu, alone], "eager")
    assert verdict.undecided and verdict.tied == [alone]
    said = " ".join(verdict.sentences())
    assert "fp16 on eager follows the host's speed, timed apart from the rest" in said and "up to 2x slower" in said
    (written,) = verdict.public()["comparisons"]
    assert written["widened_by"] == HOST_SWING and not written["paired"] and written["outcome"] == "ambiguous"
    # Two CPU runs, each timed by the host's clock: both named once, in the sentence's list.
    cpu = [_row(name, "2x512", median, status="measured (host latency)") for name, median in (("ort", 10.0), ("ort-b", 10.5))]
    (verdict,) = verdicts(cpu, "ort")
    said = " ".join(verdict.sentences())
    assert verdict.undecided and "(each follows the host's speed, timed apart from another: the host may have run up to 2x" in said
    # Timed by the host's clock (a CPU run), near launch-bound: the same.
    for follower in (
        _row("ort", "2x512", 15.0, spread=0.01, status="measured (host latency)"),
        _row("eager", "2x512", 15.0, spread=0.01, flags=["near launch-bound: the host needs 60% of a run's GPU time"]),
    ):
        assert follower.follows_the_host and time_ratio(gpu, follower, 0.03).outcome == "ambiguous"
    # Beyond the swing: decided, by the widened interval.
    far = _row("eager", "2x512", 25.0, spread=0.01, flags=launch_bound)
    (verdict,) = verdicts([gpu, far], "eager")
    assert verdict.fastest is gpu and not verdict.tied and not verdict.undecided
    assert time_ratio(gpu, far, 0.03).high == pytest.approx(10.1 / 24.75 * HOST_SWING)
    # Two GPU-timed rows apart keep their own intervals.
    assert time_ratio(gpu, _row("rtx", "2x512", 15.0, spread=0.01), 0.03).outcome == "faster"
    # Timed together, a launch-bound row is paired round by round: no widening.
    a = _paired("eager", [15.0, 15.1, 14.9, 15.0, 15.2, 15.1, 14.8, 15.0, 15.1, 15.0, 15.0], flags=launch_bound)
    b = _paired("trt", [10.0] * 11)
    assert time_ratio(b, a, 0.03).paired and time_ratio(b, a, 0.03).outcome == "faster"


def test_the_rows_beaten_apart_are_those_apart_ratio_calls_slower():
    """pairs.beaten_apart's two sweeps against every pair read one by one (confidence.apart_ratio):
    the same rows on 300 random points of rows timed apart or in one of two sets of rounds, a third
    following the host, 1-5x apart."""
    import random

    from pipeline.report.confidence import apart_ratio
    from pipeline.report.pairs import beaten_apart

    rng = random.Random(11)
    widened_pairs = 0
    for _ in range(300):
        rows = [row for row in _random_rows(rng, rng.randint(2, 30)) if row.median_ci_ms is not None]
        expected = set()
        for a in rows:
            for b in rows:
                if a is not b and not set(a.round_medians) & set(b.round_medians):
                    if apart_ratio(a, b, 0.03).outcome == "faster":
                        expected.add(id(b))
                        widened_pairs += a.follows_the_host and b.follows_the_host
        assert beaten_apart(rows, 0.03) == expected
    assert widened_pairs > 20  # pairs of two rows that follow the host, decided beyond HOST_SWING


def test_a_machine_too_small_to_compile_side_by_side_declines_and_says_why(tmp_path, monkeypatch):
    """Two CPUs: no compiling processes start, the build is not told its points compile in the
    background, and each build manifest records why (each profile then compiles its own)."""
    from pipeline.runtimes.base import AheadWork
    from pipeline.runtimes.pytorch import compile_ahead

    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 2)
    monkeypatch.setattr(compile_ahead, "_gpu_free_bytes", lambda: None)
    engine = tmp_path / "m.pt"
    engine.write_bytes(b"weights")
    jobs = [compile_ahead.CompileJob("torch-compile", None, tmp_path, engine, None) for _ in range(3)]
    pool = compile_ahead.CompilePool()
    assert pool.submit(AheadWork(engine, jobs, compile_ahead.CompilePool)) is False
    evidence, why = pool.finish(lambda line: None)
    pool.close()
    assert "too few CPUs" in why and evidence == [{"compiler": {"compiled_ahead": {"skipped": why}}}]
    assert not pool._children


# --- the verdict at scale -----------------------------------------------------------------------


def _reference_verdict(rows: list[ComparisonRow], tie: float):
    """The answer by its definition, every pair of the close ones compared: (fastest, tied, undecided)."""
    from pipeline.report.confidence import time_ratio

    def outcome(a, b):
        """Each pair's own outcome: faster or slower wherever its interval excludes 1."""
        estimate = time_ratio(a, b, tie)
        return "ambiguous" if estimate is None else estimate.outcome

    least = min(rows, key=lambda r: r.median_ms)
    close = [row for row in rows if row is least or outcome(least, row) != "faster"]
    beaten = {id(b) for a in close for b in close if a is not b and outcome(a, b) == "faster"}
    front = [row for row in close if id(row) not in beaten] or close
    fastest = min(front, key=lambda r: r.median_ms)
    tied = sorted((row for row in front if row is not fastest), key=lambda r: r.median_ms)
    group = [fastest, *tied]
    undecided = any(outcome(a, b) != "same" for i, a in enumerate(group) for b in group[i + 1 :])
    return fastest, tied, undecided


def _random_rows(rng, count: int) -> list[ComparisonRow]:
    """Rows at one point: some timed apart (an interval each, or none), some in one of two sets of
    rounds, with medians and spreads that make every outcome happen; a third of them follow the
    host (timed by its clock, or launch-bound), some 2.5-5x slower than the rest, so that pairs
    timed apart are decided beyond HOST_SWING and within it."""
    rows = []
    for index in range(count):
        median = rng.uniform(10.0, 12.0) * rng.choice([1.0, 1.0, 1.0, 2.5, 5.0])
        kind = rng.random()
        if kind < 0.4:
            rows.append(_row(f"t{index}", "2x64", median, spread=rng.uniform(0.001, 0.06)))
        elif kind < 0.5:
            rows.append(_row(f"t{index}", "2x64", median, median_ci_ms=None))
        else:
            takes = [median * rng.uniform(0.97, 1.03) for _ in range(6)]
            row = _paired(f"t{index}", takes, spread=0.02)
            row.shape, row.round_medians = "2x64", {rng.choice(["g1", "g2"]): takes}
            rows.append(row)
        follows = rng.random()
        if follows < 0.15:
            rows[-1].status = "measured (host latency)"
        elif follows < 0.3:
            rows[-1].flags = ["launch-bound: the host needs 95% of a run's GPU time to issue it"]
    return rows


def test_the_verdict_is_its_definition_without_comparing_every_pair():
    """Against the answer computed from every pair of the engines the least one does not beat:
    the same fastest, tied and undecided on 400 random points (rows timed apart, rows without an
    interval, rows in two sets of rounds)."""
    import random

    rng = random.Random(7)
    decided_apart = 0
    for _ in range(400):
        rows = _random_rows(rng, rng.randint(2, 25))
        (verdict,) = verdicts(rows, "t0")
        fastest, tied, undecided = _reference_verdict(rows, verdict.tie)
        assert verdict.fastest is fastest
        assert verdict.tied == tied
        assert verdict.undecided == undecided
        decided_apart += any(
            not e.paired and e.outcome in ("faster", "slower") and (a.follows_the_host or b.follows_the_host)
            for a, b, e in verdict.comparisons
            if e is not None
        )
    assert decided_apart > 50  # rows that follow the host, timed apart, were told apart beyond HOST_SWING


def test_two_rows_timed_together_compare_as_paired_ratio_of_their_rounds():
    """time_ratio reads the per-round ratios off the two rows' lists (ComparisonRow.round_ratios);
    the estimate is paired_ratio's of the rounds keyed one by one, whatever rounds were dropped,
    missing at the end, zero or spread over several sets of rounds."""
    import random

    from pipeline.measuring.stats import paired_ratio
    from pipeline.report.confidence import pair_confidence, time_ratio

    rng = random.Random(3)
    apart = time_ratio(_row("a", "2x64", 10.0), _row("b", "2x64", 10.5), 0.03)

    def takes() -> list[float | None]:
        return [rng.choice([None, 0.0, *[rng.uniform(9.0, 11.0)] * 8]) for _ in range(rng.randint(0, 14))]

    for _ in range(300):
        groups = rng.sample(["g1", "g2", "g3"], rng.randint(1, 3))
        a, b = _row("a", "2x64", 10.0), _row("b", "2x64", 10.5)
        a.round_medians = {group: takes() for group in groups}
        b.round_medians = {group: takes() for group in rng.sample(groups, rng.randint(1, len(groups)))}
        shared = set(a.round_medians) & set(b.round_medians)
        keyed = paired_ratio(a.medians_by_round(shared), b.medians_by_round(shared), 0.03, pair_confidence(a, shared))
        assert time_ratio(a, b, 0.03) == (keyed if keyed is not None else apart)  # no round both have: by their intervals


def test_the_verdicts_comparisons_grow_linearly_with_the_engines_of_a_point(monkeypatch):
    """Counted, not timed: the verdict, the sweep and its crossovers at one point of n engines
    (every build distinct, or all alike) make about n comparisons, not n²/2."""
    from pipeline.report import sweep, verdict

    counted = []

    def counting(a, b, tie):
        counted.append(1)
        return time_ratio(a, b, tie)

    time_ratio = verdict.time_ratio
    for module in (verdict, sweep):  # the verdict's comparisons and the sweep's crossovers
        monkeypatch.setattr(module, "time_ratio", counting)

    def comparisons(count: int, alike: bool) -> int:
        rows = [_row(f"build{i:05d}", "2x64", 10.0 if alike else 10.0 + 0.05 * i, spread=0.02) for i in range(count)]
        counted.clear()
        verdict_list = verdicts(rows, "build00000")
        (sweep,) = sweeps(rows, verdict_list, baseline_toolchain="build00000")
        sweep.crossovers()
        sweep.public()
        return len(counted)

    for alike in (False, True):
        small, large = comparisons(100, alike), comparisons(3000, alike)
        assert large <= 31 * small, (alike, small, large)
        assert large < 10 * 3000, (alike, large)  # a few for each engine; n²/2 would be 4.5 million


def test_the_verdict_in_words_looks_up_about_as_many_pairs_as_it_compared(monkeypatch):
    """Counted, not timed: n copies of one engine's manifest, timed in sets of ten, all tie with
    the answer; saying so reads the comparisons made — a few for each engine — not each of the
    n²/2 pairs of the tied."""
    from pipeline.report.verdict import Verdict

    looked_up = []
    ratio = Verdict.ratio

    def counting(self, a, b):
        looked_up.append(1)
        return ratio(self, a, b)

    monkeypatch.setattr(Verdict, "ratio", counting)

    def lookups(count: int) -> int:
        takes = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8]
        rows = [_paired(f"build{i:05d}", takes, spread=0.02) for i in range(count)]
        for index, row in enumerate(rows):
            row.round_medians = {f"set{index // 10}": list(takes)}
        (verdict,) = verdicts(rows, "build00000")
        assert len(verdict.tied) == count - 1 and verdict.undecided  # the copies of other sets are not paired with the answer
        looked_up.clear()
        verdict.public()
        return len(looked_up)

    small, large = lookups(100), lookups(3000)
    assert large <= 31 * small, (small, large)
    assert large < 10 * 3000, large  # n²/2 would be 4.5 million


def test_a_point_timed_in_one_set_of_rounds_reports_the_pairs_its_answer_rests_on():
    """Schema 9: the report lists the least against every engine and every two close ones (in the
    candidates' order); two engines both beaten by the least are not compared, since each
    comparison is a claim the point's confidence must cover (scripts/simulate_confidence.py)."""
    rows = [_paired("t0", [10.0 + 0.01 * r for r in range(6)]), _paired("t1", [10.0 + 0.011 * r for r in range(6)])]
    rows += [_paired(f"t{i}", [10.0 + i + 0.01 * r for r in range(6)]) for i in range(2, 5)]
    (verdict,) = verdicts(rows, "t0")
    assert verdict.fastest is rows[0] and verdict.tied == [rows[1]]
    pairs = [(a.toolchain, b.toolchain) for a, b, _ in verdict.comparisons]
    assert pairs == [("t0", "t1"), ("t0", "t2"), ("t0", "t3"), ("t0", "t4")]


GPU_0 = {"index": 0, "uuid": "GPU-aaaa1111-0000", "name": "NVIDIA H100 80GB HBM3"}
GPU_1 = {"index": 1, "uuid": "GPU-bbbb2222-0000", "name": "NVIDIA H100 80GB HBM3"}


def test_points_and_engines_measured_on_different_gpus_are_said_to_be_so():
    """Two GPUs of one type: the sweep names which GPU measured which point, and a point whose
    engines were measured on different GPUs says its comparisons there are unpaired."""
    rows = [
        _row("torch-eager", "2x512", 20.0, gpu_device=GPU_0),
        _row("inductor", "2x512", 5.0, gpu_device=GPU_0),
        _row("torch-eager", "2x2048", 80.0, gpu_device=GPU_1),
        _row("inductor", "2x2048", 20.0, gpu_device=GPU_0),
    ]
    at_512, at_2048 = verdicts(rows, "torch-eager")
    assert not any("GPUs" in sentence for sentence in at_512.sentences())  # one GPU there
    apart = next(sentence for sentence in at_2048.sentences() if "GPUs" in sentence)
    assert apart.startswith(
        "Its engines were measured on 2 GPUs (GPU 0 (GPU-aaaa1111…): fp16 on inductor; GPU 1 (GPU-bbbb2222…): fp16 on torch-eager)"
    )
    assert "unpaired" in apart
    (sweep,) = sweeps(rows, [at_512, at_2048], baseline_toolchain="torch-eager")
    assert (
        sweep.notes()[-1] == "m's points were measured on 2 GPUs: GPU 0 (GPU-aaaa1111…) at 2×512, 2×2048; GPU 1 (GPU-bbbb2222…) at 2×2048."
    )
    assert sweep.public()["gpus"] == [{**GPU_0, "points": ["2x512", "2x2048"]}, {**GPU_1, "points": ["2x2048"]}]


def test_a_sweep_measured_on_one_gpu_says_nothing_of_gpus():
    rows = [_row("torch-eager", shape, 10.0, gpu_device=GPU_1) for shape in ("2x512", "2x2048")]
    (sweep,) = sweeps(rows, verdicts(rows, "torch-eager"), baseline_toolchain="torch-eager")
    assert sweep.notes() == sweep.crossovers() and sweep.public()["gpus"] == [{**GPU_1, "points": ["2x512", "2x2048"]}]


def test_an_engine_without_a_gpu_type_is_judged_with_the_gpu_engines_it_was_timed_beside():
    """A cluster's point task on an H200 times ONNX Runtime (no GPU type: its manifests are
    onnxruntime's) beside torch-cudagraphs@H200 in one set of rounds: one verdict, one sweep."""
    rounds = {"g1": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}
    rows = [
        _row("onnxruntime", "2x16", 0.41, round_medians=dict(rounds)),
        _row("torch-cudagraphs", "2x16", 0.11, gpu_type="H200", round_medians={"g1": [0.11] * 6}),
        _row("onnxruntime", "2x64", 0.80, round_medians={"g2": [0.8] * 6}),  # timed beside no GPU engine
    ]
    found = verdicts(rows, None)
    assert [(v.shape, v.gpu_type) for v in found] == [("2x64", None), ("2x16", "H200")]
    at_2x16 = next(v for v in found if v.shape == "2x16")
    assert at_2x16.fastest.toolchain == "torch-cudagraphs" and {r.toolchain for r in at_2x16.candidates} == {
        "onnxruntime",
        "torch-cudagraphs",
    }
    assert {(s.model, s.gpu_type) for s in sweeps(rows, found)} == {("m", None), ("m", "H200")}


def test_a_run_builds_the_engines_that_compile_at_every_point_first(tmp_path, monkeypatch, run_cli):
    """Their other points compile in the background from the moment each is built: built first,
    that goes on beside every other build of the run, not only beside those listed after them."""
    from pipeline.runtimes import load_catalog
    from pipeline.stages import runner
    from pipeline.stages.base import RunContext
    from pipeline.workspace import Workspace
    from tests.conftest import write_catalog

    built = []
    monkeypatch.setattr(runner, "run_engine", lambda ctx, engine, toolchain, until, points: built.append((engine.variant, toolchain)))
    extra = "".join(
        f'\n[toolchains.{name}]\nkind = "torch"\n{settings}\n'
        for name, settings in (
            ("torch-compile", 'backend = "compile"'),
            ("torch-compile-full", 'backend = "compile"\nfullgraph = true'),
            ("torch-compile-dynamic", 'backend = "compile"\ndynamic = true'),  # compiled once, for every point
        )
    )
    catalog = load_catalog(write_catalog(tmp_path, tiny_bert_catalog(POINTS, ["fp32", "fp16"], ["fp32"]) + CPU_TOOLCHAINS + extra))
    engines = catalog.select((), ("bert",), ("fp32", "fp16"))
    toolchains = ["torch-eager", "torch-compile-dynamic", "torch-compile", "onnxruntime", "torch-compile-full"]
    runner.run_engines(RunContext(catalog=catalog, workspace=Workspace(tmp_path)), engines, toolchains, "build")
    order = [toolchain for _, toolchain in built]
    assert order[:4] == ["torch-compile", "torch-compile", "torch-compile-full", "torch-compile-full"], built
    rest = ["torch-eager", "torch-compile-dynamic", "onnxruntime"]  # in the run's order, each variant's
    assert order[4:] == [toolchain for toolchain in rest for _ in ("fp32", "fp16")], built
    # --dry-run says the same order.
    args = [arg for toolchain in toolchains for arg in ("--toolchain", toolchain)]
    dry = run_cli(tmp_path / "pipeline.toml", "build", "--model", "bert", "--variant", "fp32", *args, "--dry-run")
    assert dry.exit_code == 0, dry.err
    assert [line[2:] for line in dry.out.splitlines() if line.startswith("# ")] == ["torch-compile", "torch-compile-full", *rest], dry.out


def test_rows_that_claim_one_set_of_rounds_they_cannot_share_are_read_as_timed_apart():
    """3000 manifests copied by hand, all claiming the one set of rounds a single engine was measured
    in: their pairing means nothing, and pairing them all would take minutes. They are read as
    timed apart and flagged so; the answer is decided with a bounded number of comparisons."""
    from pipeline.report.rows import trusted_rounds

    def row(index: int) -> ComparisonRow:
        medians = [1.0 + 0.001 * index + 0.0001 * r for r in range(6)]
        made = ComparisonRow(model="m", variant=f"v{index:04d}", toolchain="onnxruntime", status="measured (host latency)", shape="2x8")
        made.median_ms, made.median_ci_ms = medians[3], (medians[0], medians[-1])
        made.round_medians = {"g1": medians}
        made.round_entrants = {"g1": ("fp32/onnxruntime", ("fp32/onnxruntime",))}
        made.outcome = "measured"
        return made

    rows = [row(index) for index in range(3000)]
    trusted_rounds(rows)
    assert all(not r.round_medians for r in rows)
    assert rows[0].flags == ["timed apart: 3000 manifests claim one set of rounds of 1 engines (copied or merged by hand)"]
    (verdict,) = verdicts(rows, None)
    assert verdict.fastest is rows[0] and len(verdict.comparisons) < 2 * len(rows)
    # The engines of a real set of rounds keep their pairing.
    real = [row(0), row(1)]
    for made, name in zip(real, ("fp32/onnxruntime", "fp16/onnxruntime")):
        made.variant = name.split("/")[0]
        made.round_entrants = {"g1": (name, ("fp32/onnxruntime", "fp16/onnxruntime"))}
    trusted_rounds(real)
    assert all(r.round_medians and not r.flags for r in real)
