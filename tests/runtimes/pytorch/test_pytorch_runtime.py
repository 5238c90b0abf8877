"""The torch toolchains: PyTorch eager, torch.compile and CUDA graphs, timed like engines.

On the CPU with timm's test_vit (Inductor compiles it in seconds); the CUDA-graph backend and
CUDA-event timing have GPU tests at the end, skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import TINY_CATALOG, write_catalog

torch = pytest.importorskip("torch")
# The same tests run on GPU machines, where the torch toolchains run on the GPU.
ON_GPU = torch.cuda.is_available()


def _why_no_inductor() -> str | None:
    """Why torch.compile cannot compile here, as the toolchain itself says (on a plain machine:
    no C++ compiler, or no Python headers), or None. `.ci/run` installs both and sets
    PIPELINE_REQUIRE_COMPILER=1, so there these tests run, or fail saying what is missing."""
    if os.environ.get("PIPELINE_REQUIRE_COMPILER") == "1":
        return None
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime, spec_class

    spec = spec_class("torch").model_validate({"kind": "torch", "backend": "compile"})
    status = create_runtime("torch-inductor", spec, Reporter(), Path.cwd()).status()
    return None if status.usable else f"{status.detail} (.ci/run installs what it needs)"


NO_INDUCTOR = _why_no_inductor()
needs_inductor = pytest.mark.skipif(NO_INDUCTOR is not None, reason=NO_INDUCTOR or "")
# The torch.compile toolchain where it can compile; the tests of the others run everywhere.
COMPILED = () if NO_INDUCTOR else ("torch-inductor",)

TORCH_TOOLCHAINS = """
[variants.bf16]
precision = "bf16"

[toolchains.torch-eager]
kind = "torch"
baselines = ["fp32"]

[toolchains.torch-inductor]
kind = "torch"
backend = "compile"
mode = "default"
baselines = ["fp32"]

[toolchains.torch-cudagraphs]
kind = "torch"
backend = "cudagraphs"
"""
# A top-level key: before the tables, or TOML puts it in the last one.
CATALOG = 'baseline_toolchain = "torch-eager"\n' + TINY_CATALOG + TORCH_TOOLCHAINS


def register_graph_break_model() -> str:
    """A timm model whose forward() breaks Dynamo's graph in the middle."""
    from timm.models import register_model

    from pipeline.models.torch_import import import_timm

    timm = import_timm()
    name = "graph_break_net"
    if name in timm.list_models(name):
        return name

    class GraphBreakNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 8, 3)
            self.head = torch.nn.Linear(8, 10)
            self.pretrained_cfg = {"input_size": (3, 32, 32)}

        def forward(self, x):
            features = self.stem(x).mean((2, 3))
            torch._dynamo.graph_break()  # a no-op outside Dynamo, so the ONNX export is unaffected
            return self.head(features)

    def graph_break_net(pretrained=False, **kwargs):
        return GraphBreakNet()

    register_model(graph_break_net)
    return name


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """fp32 on ONNX Runtime, torch-eager and torch-inductor, and the variants torch skips."""
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("torch"), CATALOG)
    for toolchain in ("onnxruntime", "torch-eager", *COMPILED):
        assert main(["--catalog", str(catalog), "run", "--variant", "fp32", "--toolchain", toolchain]) == 0
    assert main(["--catalog", str(catalog), "build", "--variant", "int8", "--variant", "fp16_sparse", "--toolchain", "torch-eager"]) == 0
    return catalog


def manifest(catalog, toolchain: str, engine: str = "tiny_fp32"):
    return read_manifest(catalog.parent / "manifests" / toolchain / f"{engine}.json")


def test_eager_and_compile_build_the_runnable_model_and_time_it_on_the_cpu(workspace):
    for toolchain, backend in (("torch-eager", "eager"), ("torch-inductor", "compile"))[: 1 + len(COMPILED)]:
        m = manifest(workspace, toolchain)
        assert m.build.status == "done" and m.profile.status == "done"
        assert m.build.details.runtime == "torch" and m.build.details.settings["backend"] == backend
        assert m.build.details.settings["dtype"] == "float32" and m.build.details.settings["device"] == ("cuda" if ON_GPU else "cpu")
        # The engine file pins exactly what is timed: the architecture and its weights.
        engine = next(a for a in m.build.outputs if a.role == "engine")
        saved = torch.load(workspace.parent / engine.path, weights_only=True)
        assert saved["source"]["family"] == "timm" and saved["source"]["spec"]["timm"] == "test_vit"
        assert saved["input_shapes"] == [[2, 3, 160, 160]]
        assert all(t.dtype == torch.float32 for t in saved["state_dict"].values() if t.is_floating_point())
        profile = m.profile.details
        assert profile.accuracy["cosine_similarity"] > 0.9999 and profile.accuracy["top1_agreement"] == 1.0  # FP32 vs FP32
        if ON_GPU:
            assert profile.metric == "GPU time (CUDA events)" and profile.device == f"torch {backend} on {torch.cuda.get_device_name()}"
        else:
            assert profile.metric == "host latency" and profile.device == f"torch {backend} on CPU"
        assert profile.iterations == len(profile.per_iteration_ms) >= 5
        assert profile.execution["torch"] == torch.__version__ and profile.execution["backend"] == backend


def test_same_weights_as_the_export(workspace):
    """The torch engines hold the weights the ONNX was exported from (same seed, same model)."""
    import onnx
    from onnx import numpy_helper

    saved = torch.load(workspace.parent / "engines" / "torch-eager" / "tiny_fp32.pt", weights_only=True)
    graph = onnx.load(str(workspace.parent / "models" / "tiny" / "fp32.onnx"))
    initializers = {init.name: numpy_helper.to_array(init) for init in graph.graph.initializer}
    weight = saved["state_dict"]["head.weight"].numpy()
    assert any(value.shape == weight.shape and (value == weight).all() for value in initializers.values())


# Compiles a small model with the compiled toolchain's preparation and prints what it found in
# Inductor's cache. "early": a module enters sys.modules before torch and then holds it, as a
# process spawned by multiprocessing holds its parent's main module as __mp_main__.
COMPILE_IN_A_PROCESS = """
import json, pickle, sys, types
if sys.argv[1] == "early":
    sys.modules["imported_before_torch"] = early = types.ModuleType("imported_before_torch")
import torch
if sys.argv[1] == "early":
    early.torch = torch
from pipeline.running.reporting import Reporter
from pipeline.runtimes import spec_class
from pipeline.runtimes.pytorch.preparing import TorchPreparation

spec = spec_class("torch").model_validate({"kind": "torch", "backend": "compile"})
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
examples = (torch.randn(2, 8, generator=torch.Generator().manual_seed(0)),)
prepared = TorchPreparation(spec, Reporter()).prepare(model, examples, torch.float32, "cpu", (0, 0, 0), "2x8")
named_by = pickle.whichmodule(torch.contiguous_format, "torch.contiguous_format")
print(json.dumps({"facts": prepared.facts, "named_by": named_by}))
"""


@needs_inductor
def test_a_graph_compiled_in_one_process_is_found_by_one_that_imported_otherwise(tmp_path):
    """Inductor's cache keys hold each input's memory format, pickled under the first module in
    sys.modules through which pickle reaches it: another in a process that imported otherwise (a
    spawned compile-ahead process, a Ray worker). The compiled toolchain keys it alike in every
    process, or a point's profile never finds the graph compiled for it ahead."""
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONPATH": str(Path.cwd())}
    found = {}
    for history in ("plain", "early"):
        done = subprocess.run([sys.executable, "-c", COMPILE_IN_A_PROCESS, history], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        found[history] = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["early"]["named_by"] == "imported_before_torch" != found["plain"]["named_by"], found
    assert found["plain"]["facts"]["inductor_cache_hits"] == 0, found
    assert found["early"]["facts"]["inductor_cache_hits"] == found["early"]["facts"]["graphs"] >= 1, found


@needs_inductor
def test_the_key_recorder_names_what_differs_between_two_processes_keys(tmp_path):
    """scripts/inductor_keys: every process started with it records each key it looks up, and
    compare.py says which lookups no earlier process's key matched, and in what their keys
    differ (here the thread count, which Inductor's key holds for CPU code)."""
    import subprocess
    import sys

    scripts = Path.cwd() / "scripts" / "inductor_keys"
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "INDUCTOR_KEYS_DIR": str(tmp_path / "keys"),
        "PYTHONPATH": f"{scripts}{os.pathsep}{Path.cwd()}",
    }
    for threads in ("2", "1"):
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_IN_A_PROCESS, "plain"], env={**env, "OMP_NUM_THREADS": threads}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((tmp_path / "keys").glob("*-fx_graph.json"))) == 2
    report = subprocess.run([sys.executable, str(scripts / "compare.py"), str(tmp_path / "keys")], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    assert "fx_graph: 2 lookups; 0 had an earlier process's key" in report.stdout, report.stdout
    assert "1x fx_graph differs in: cpp_runtime_thread_count" in report.stdout, report.stdout


@needs_inductor
def test_compile_time_and_graphs_are_recorded(workspace):
    compiler = manifest(workspace, "torch-inductor").build.details.compiler
    assert compiler["compile_s"] > 0
    assert compiler["graphs"] == 1 and compiler["graph_breaks"] == 0
    assert compiler["inductor_cache_dir"]
    settings = manifest(workspace, "torch-inductor").build.details.settings
    assert settings["mode"] == "default" and settings["fullgraph"] is False and settings["dynamic"] is False


def test_pytorch_toolchains_alone_export_no_onnx_and_a_run_that_reads_it_exports_again(tmp_path, run_cli):
    """The torch toolchains build from the PyTorch model and are checked against the references:
    a run of them alone writes no ONNX (nor checks its parity); a run with a toolchain that reads
    the ONNX exports again, writing it; and that export serves the torch toolchains unchanged."""
    catalog = write_catalog(tmp_path, CATALOG)
    onnx = tmp_path / "models" / "tiny" / "fp32.onnx"
    dry = run_cli(catalog, "build", "--variant", "fp32", "--toolchain", "torch-eager", "--dry-run")
    assert "tiny_fp32: export → references only, no ONNX (no toolchain of the run reads it)" in dry.out, dry.out
    alone = run_cli(catalog, "run", "--variant", "fp32", "--toolchain", "torch-eager")
    assert alone.exit_code == 0, alone.err
    export = read_manifest(tmp_path / "manifests" / "export" / "tiny_fp32.json").export
    assert export.details.onnx_skipped == "no toolchain of the run reads it" and export.details.parity is None
    assert "no ONNX written" in export.details.parity_skipped and export.params["onnx"].startswith("not written")
    assert not onnx.exists() and "onnx" not in {artifact.role for artifact in export.outputs}
    assert manifest(catalog, "torch-eager").profile.details.accuracy is not None  # checked against the references

    both = run_cli(catalog, "run", "--variant", "fp32", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    assert both.exit_code == 0, both.err
    export = read_manifest(tmp_path / "manifests" / "export" / "tiny_fp32.json").export
    assert export.details.onnx_skipped is None and export.details.parity is not None and "onnx" not in export.params
    assert onnx.is_file() and manifest(catalog, "onnxruntime").profile.status == "done"

    dry = run_cli(catalog, "build", "--variant", "fp32", "--toolchain", "torch-eager", "--dry-run")
    assert "tiny_fp32: export → models/tiny/fp32.onnx" in dry.out, dry.out
    again = run_cli(catalog, "run", "--variant", "fp32", "--toolchain", "torch-eager")
    assert again.exit_code == 0, again.err
    assert any(line.split()[:2] == ["export", "tiny_fp32"] and "didn't change" in line for line in again.err.splitlines()), again.err
    assert onnx.is_file()


def test_quantized_and_sparse_variants_are_recorded_as_skipped(workspace):
    int8 = manifest(workspace, "torch-eager", "tiny_int8").build
    assert int8.status == "skipped" and "fake quantization" in int8.reason
    sparse = manifest(workspace, "torch-eager", "tiny_fp16_sparse").build
    assert sparse.status == "skipped" and "pruned dense model" in sparse.reason


def test_compare_shows_torch_rows_beside_onnxruntime_with_the_speedup_over_eager(workspace, run_cli):
    result = run_cli(workspace, "compare", "--format", "json")
    assert result.exit_code == 0, result.err
    rows = {(r["engine"], r["toolchain"]): r for r in json.loads(result.out)["rows"]}
    eager = rows[("tiny_fp32", "torch-eager")]
    assert eager["vs_baseline_toolchain"] == 1.0 and eager["baseline_toolchain"] == "torch-eager"
    for toolchain in ("onnxruntime", *COMPILED):
        row = rows[("tiny_fp32", toolchain)]
        assert row["vs_baseline_toolchain"] == pytest.approx(eager["median_ms"] / row["median_ms"])
    table = run_cli(workspace, "compare", "--format", "md").out
    assert "x vs torch-eager" in table


@needs_inductor
def test_a_warm_rerun_does_nothing_and_a_new_mode_recompiles(workspace, run_cli):
    before = manifest(workspace, "torch-inductor")
    again = run_cli(workspace, "run", "--variant", "fp32", "--toolchain", "torch-inductor")
    assert again.exit_code == 0, again.err
    assert manifest(workspace, "torch-inductor") == before  # nothing compiled, nothing measured
    assert again.err.count("didn't change, skipping") == 3  # export, build, profile

    workspace.write_text(workspace.read_text().replace('mode = "default"', 'mode = "max-autotune-no-cudagraphs"'))
    try:
        changed = run_cli(workspace, "run", "--variant", "fp32", "--toolchain", "torch-inductor")
        assert changed.exit_code == 0, changed.err
        after = manifest(workspace, "torch-inductor")
        assert after.build.fingerprint != before.build.fingerprint
        assert after.build.details.settings["mode"] == "max-autotune-no-cudagraphs"
        assert after.build.details.compiler["compile_s"] > 0
        assert after.profile.finished_at > before.profile.finished_at
    finally:
        workspace.write_text(workspace.read_text().replace('mode = "max-autotune-no-cudagraphs"', 'mode = "default"'))


def test_repeat_measures_several_times_and_records_each_median(workspace, run_cli):
    result = run_cli(workspace, "profile", "--engine", "tiny_fp32", "--toolchain", "torch-eager", "--repeat", "3")
    assert result.exit_code == 0, result.err
    details = manifest(workspace, "torch-eager").profile.details
    assert len(details.repeat_medians_ms) == 3 and details.repeats_pooled == 3
    # The row's median is the pooled runs' median, which lies between the measurements' own.
    medians = details.repeat_medians_ms
    assert details.latency_ms.median == pytest.approx(statistics.median(details.per_iteration_ms))
    assert min(medians) <= details.latency_ms.median <= max(medians)
    assert details.repeat_cv == pytest.approx(statistics.stdev(medians) / statistics.fmean(medians))
    assert "of 3 measurements pooled" in result.err


def test_bf16_runs_on_torch_and_is_skipped_by_onnxruntime_with_the_reason(workspace, run_cli):
    result = run_cli(workspace, "run", "--variant", "bf16", "--toolchain", "torch-eager")
    assert result.exit_code == 0, result.err
    m = manifest(workspace, "torch-eager", "tiny_bf16")
    assert m.build.details.settings["dtype"] == "bfloat16" and m.profile.status == "done"
    export = read_manifest(workspace.parent / "manifests" / "export" / "tiny_bf16.json").export.details
    assert export.input_dtype == "bfloat16" and export.parity is None
    skipped = run_cli(workspace, "build", "--variant", "bf16", "--toolchain", "onnxruntime")
    assert skipped.exit_code == 0
    assert "no bfloat16 Conv or MatMul kernels" in manifest(workspace, "onnxruntime", "tiny_bf16").build.reason
    # `pipeline export` writes the ONNX (the torch run wrote none), whose parity ONNX Runtime's CPU provider cannot check.
    exported = run_cli(workspace, "export", "--variant", "bf16")
    assert exported.exit_code == 0, exported.err
    export = read_manifest(workspace.parent / "manifests" / "export" / "tiny_bf16.json").export.details
    assert export.onnx_skipped is None and export.parity is None and "no bfloat16 Conv or MatMul kernels" in export.parity_skipped


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without CUDA")
def test_cuda_graphs_without_a_gpu_is_a_clear_error(workspace, run_cli):
    result = run_cli(workspace, "run", "--variant", "fp32", "--toolchain", "torch-cudagraphs")
    assert result.exit_code == 3
    assert "ERROR toolchain torch-cudagraphs captures CUDA graphs, which need an NVIDIA GPU" in result.err
    assert "TIP" in result.err and "Traceback" not in result.err


# fp32, ONNX Runtime, and torch.compile with and without fullgraph: a model with a graph break's catalog.
GRAPH_BREAK_TOOLCHAINS = """
[variants.fp32]
precision = "fp32"

[toolchains.onnxruntime]
kind = "onnxruntime"

[toolchains.torch-compile]
kind = "torch"
backend = "compile"

[toolchains.torch-fullgraph]
kind = "torch"
backend = "compile"
fullgraph = true
"""


@needs_inductor
def test_graph_breaks_are_counted_and_fullgraph_refuses_them(tmp_path, run_cli):
    model = register_graph_break_model()
    catalog = write_catalog(
        tmp_path / "ws",
        f"""
        [models.net]
        timm = "{model}"
        batch_size = 2
        [defaults]
        models = ["net"]
        variants = ["fp32"]
        """
        + GRAPH_BREAK_TOOLCHAINS,
    )
    pieces = run_cli(catalog, "build", "--engine", "net_fp32", "--toolchain", "torch-compile")
    assert pieces.exit_code == 0, pieces.err
    build = manifest(catalog, "torch-compile", "net_fp32").build
    assert build.status == "done"
    assert build.details.compiler["graph_breaks"] >= 1 and build.details.compiler["graphs"] >= 2
    assert "graph break" in build.details.notes[0]
    assert "graph break" in pieces.err  # warned, with the setting that refuses them

    refused = run_cli(catalog, "build", "--engine", "net_fp32", "--toolchain", "torch-fullgraph")
    assert refused.exit_code == 1
    assert "ERROR torch.compile failed:" in refused.err and "fullgraph = true" in refused.err
    record = manifest(catalog, "torch-fullgraph", "net_fp32").build
    assert record.status == "failed" and record.reason.startswith("torch.compile failed:")
    assert record.details.compiler["error_type"] and "graph_break" in record.details.compiler["error"].lower().replace(" ", "_")
    assert not list((catalog.parent / "engines" / "torch-fullgraph").glob("*"))  # no engine, nothing half-written


@needs_inductor
def test_in_a_run_graph_breaks_are_said_and_fullgraph_refuses_at_each_point(tmp_path, run_cli, monkeypatch):
    """In a run that profiles, a compiled build hands every point, its own first too, to the
    compiling processes and compiles nothing itself: what a build would have said of its first
    point is said when the run prepares the points — graph breaks once, as a warning — and a
    fullgraph toolchain's refusal is each point's, recorded in its profile, its build done."""
    import shutil

    from pipeline.runtimes.pytorch import compile_ahead
    from tests.conftest import DATA, catalog_head

    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 4)  # two processes
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "models-in").mkdir()
    shutil.copy(DATA / "python_models" / "graph_break.py", tmp_path / "models-in")
    text = (
        catalog_head(["m"], ["fp32"])
        + """
[models.m]
python = "models-in/graph_break.py:make"
config = { features = 8 }
shapes = ["2x4", "2x8"]

[toolchains.torch-eager]
kind = "torch"
"""
        + GRAPH_BREAK_TOOLCHAINS
    )
    catalog = write_catalog(tmp_path, text)
    result = run_cli(catalog, "run", "--model", "m", "--toolchain", "torch-compile", "--toolchain", "torch-fullgraph")
    assert result.exit_code == 1, result.err
    assert result.err.count("graph break(s): the model runs as 2 compiled graphs") == 1, result.err
    compiled = manifest(catalog, "torch-compile", "m_fp32").build.details.compiler["compiled_ahead"]
    assert sorted(compiled["points"]) == ["2x4", "2x8"] and all(p["graph_breaks"] >= 1 for p in compiled["points"].values()), compiled
    full = manifest(catalog, "torch-fullgraph", "m_fp32").build
    assert full.status == "done" and all("error" in p for p in full.details.compiler["compiled_ahead"]["points"].values()), full
    for shape in ("2x4", "2x8"):
        measured = manifest(catalog, "torch-compile", f"m_fp32@{shape}").profile
        assert measured.status == "done" and measured.details.execution["graphs"] == 2, measured
        assert measured.details.execution["prepared_ahead"] is True
        assert measured.details.execution["served_by"]["process"].startswith("pipeline-compile-")  # timed where it was compiled
        refused = manifest(catalog, "torch-fullgraph", f"m_fp32@{shape}").profile
        assert refused.status == "failed" and refused.reason.startswith("torch.compile failed:"), refused
        assert f"m_fp32 on torch-fullgraph at {shape}: torch.compile failed:" in result.err


def test_a_point_is_not_prepared_ahead_where_the_gpu_has_little_memory_free(tmp_path, monkeypatch):
    """What is kept prepared holds GPU memory: under a quarter free, the point is left to its profile."""
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime, spec_class
    from pipeline.runtimes.pytorch import runtime as pytorch

    spec = spec_class("torch").model_validate({"kind": "torch", "backend": "compile"})
    runtime = create_runtime("torch-compile", spec, Reporter(), tmp_path)
    monkeypatch.setattr(pytorch.TorchRuntime, "_cuda_available", staticmethod(lambda: True))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (10 * 2**30, 80 * 2**30))
    monkeypatch.setattr(pytorch.TorchRuntime, "load", lambda *args: pytest.fail("prepared with 10 GiB of 80 GiB free"))
    why = runtime.prepare_ahead(tmp_path / "m.pt", _Point("2x8"))
    assert why == "10.0 GiB of 80.0 GiB GPU memory free: left to its profile"
    assert runtime.prepare_ahead(tmp_path / "m.pt", None) == "nothing to prepare ahead"


class _Point:
    def __init__(self, shape):
        self.shape = shape


@needs_inductor
def test_ctrl_c_during_a_compile_leaves_nothing_that_looks_valid(tmp_path, run_cli, monkeypatch):
    tiny_catalog = write_catalog(tmp_path / "ws", CATALOG)
    assert run_cli(tiny_catalog, "export", "--engine", "tiny_fp32").exit_code == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "compile", interrupted)
    result = run_cli(tiny_catalog, "build", "--engine", "tiny_fp32", "--toolchain", "torch-inductor")
    assert result.exit_code == 130
    assert "ERROR interrupted" in result.err
    engines = tiny_catalog.parent / "engines" / "torch-inductor"
    assert not engines.exists() or not list(engines.iterdir())
    assert not (tiny_catalog.parent / "manifests" / "torch-inductor" / "tiny_fp32.json").exists()


def test_out_of_memory_names_the_batch_and_the_free_memory(monkeypatch):
    from pipeline.measuring.out_of_memory import out_of_memory_as_error
    from pipeline.running.errors import PipelineError

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (512 * 2**20, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    with pytest.raises(PipelineError) as info:
        with out_of_memory_as_error(batch_size=4096):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    assert (
        info.value.message == "out of GPU memory at batch size 4096: 512 MiB free of 81,920 MiB on NVIDIA H100 80GB HBM3 after the attempt."
    )
    assert "batch_size" in info.value.hint
    with pytest.raises(ValueError):  # anything else passes through untouched
        with out_of_memory_as_error(batch_size=1):
            raise ValueError("not memory")


def test_catalog_keeps_compile_settings_to_the_compile_backend(tmp_path, run_cli):
    catalog = write_catalog(
        tmp_path / "ws", TINY_CATALOG + '\n[toolchains.bad]\nkind = "torch"\nbackend = "eager"\nmode = "max-autotune"\n'
    )
    result = run_cli(catalog, "models")
    assert result.exit_code == 2
    assert 'toolchains.bad: mode, fullgraph, dynamic and capture are torch.compile settings: they need backend = "compile"' in result.err


def test_dry_run_says_what_would_be_compiled_without_importing_torch(workspace, run_cli):
    result = run_cli(workspace, "profile", "--engine", "tiny_fp32", "--toolchain", "torch-inductor", "--dry-run")
    assert result.exit_code == 0
    assert "torch.compile(mode='default', fullgraph=False, dynamic=False)" in result.out
    assert "≥1 runs and ≥5 ms" in result.out


# --- on a GPU ----------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA: CUDA graphs and CUDA-event timing")


@pytest.fixture(scope="module")
def gpu_workspace(tmp_path_factory):
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("torch-gpu"), CATALOG)
    for toolchain in ("torch-eager", "torch-cudagraphs", "torch-inductor"):
        assert main(["--catalog", str(catalog), "run", "--variant", "fp16", "--variant", "bf16", "--toolchain", toolchain]) == 0
    return catalog


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("toolchain", ["torch-eager", "torch-cudagraphs", "torch-inductor"])
@pytest.mark.parametrize("variant", ["fp16", "bf16"])
def test_every_backend_is_timed_by_cuda_events_on_the_gpu(gpu_workspace, toolchain, variant):
    m = manifest(gpu_workspace, toolchain, f"tiny_{variant}")
    details = m.profile.details
    assert details.metric == "GPU time (CUDA events)"
    assert details.gpu == torch.cuda.get_device_name()
    execution = details.execution
    assert execution["cuda"] == torch.version.cuda and execution["device"] == "cuda"
    # The weights stay on the GPU while it runs (a captured graph holds no reference to them).
    weights_mib = (
        sum(
            t.numel() * t.element_size()
            for t in torch.load(gpu_workspace.parent / m.build.outputs[0].path, weights_only=True)["state_dict"].values()
        )
        / 2**20
    )
    memory = execution["peak_memory_mib"]  # this engine's own: several live in the process while a point is timed
    assert memory["weights"] == pytest.approx(weights_mib, abs=0.05)
    assert memory["allocated"] == pytest.approx(memory["weights"] + memory["one_inference"], abs=0.15)  # each rounded to 0.1 MiB
    assert memory["one_inference"] >= 0
    # The second figure: runs the host waits for, at least 3.
    assert execution["host_latency_ms"]["runs"] >= 3 and execution["host_latency_ms"]["median_ms"] > 0
    assert all(math.isfinite(v) and v > 0 for v in details.per_iteration_ms)
    # Its own outputs on the reference batch (through the captured graph's fixed input for CUDA graphs).
    accuracy = details.accuracy
    assert accuracy["checked_by"].startswith("torch ") and "on cuda, in this process" in accuracy["checked_by"]
    assert accuracy["cosine_similarity"] >= accuracy["cosine_floor"] and accuracy["nonfinite_values"] == 0


# PyTorch's warnings when the flash kernel alone may run and the batch is padded, as recorded on
# the H100 (torch 2.11.0+cu130, bert_tiny bf16 at 2x16 on torch-sdpa-flash).
FLASH_REFUSAL_WARNINGS = [
    "Memory efficient kernel not used because: (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:986.)",
    "Memory Efficient attention has been runtime disabled. (Triggered internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils_cpp.h:552.)",
    "Flash attention kernel not used because: (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:988.)",
    "Flash Attention does not support non-null attn_mask. (Triggered internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils_cpp.h:262.)",
    "cuDNN attention kernel not used because: (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:990.)",
    "cuDNN attention has been runtime disabled. (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:706.)",
]


def test_a_kernel_refusal_gives_pytorchs_reason_not_the_restriction_it_restates():
    from pipeline.runtimes.pytorch.preparing import _kernel_reasons

    assert _kernel_reasons(FLASH_REFUSAL_WARNINGS, "flash") == ["Flash Attention does not support non-null attn_mask."]
    # The kernel asked for, disabled by PyTorch itself: that is the reason.
    assert _kernel_reasons(FLASH_REFUSAL_WARNINGS, "cudnn") == [
        "Flash Attention does not support non-null attn_mask.",
        "cuDNN attention has been runtime disabled.",
    ]
    assert _kernel_reasons(["some other warning", "Flash attention kernel not used because:"], "flash") == []


def test_a_sweep_reads_no_engine_back_that_its_builds_prepared_at_the_first_point(tmp_path, run_cli, monkeypatch):
    """Each toolchain's builds of several variants keep the models they prepared at the first shape
    point, which that point's profile times next: a run reads no engine file back, at that point
    or (each model kept and prepared again at the next shape) after it."""
    from pipeline.runtimes.pytorch import runtime as pytorch
    from tests.conftest import CPU_TOOLCHAINS, tiny_bert_catalog

    catalog = write_catalog(tmp_path, tiny_bert_catalog(["2x8", "2x16"], ["fp32", "fp16"], ["fp32"]) + CPU_TOOLCHAINS)
    read = []
    real_read = pytorch.read_engine
    monkeypatch.setattr(pytorch, "read_engine", lambda path: read.append(Path(path).name) or real_read(path))
    result = run_cli(catalog, "run", "--model", "bert", "--variant", "fp32", "--variant", "fp16", "--toolchain", "torch-eager")
    assert result.exit_code == 0, result.err
    for variant in ("fp32", "fp16"):
        for shape in ("2x8", "2x16"):
            profile = read_manifest(tmp_path / "manifests" / "torch-eager" / f"bert_{variant}@{shape}.json").profile
            assert profile.status == "done", (variant, shape, profile.reason)
        first = read_manifest(tmp_path / "manifests" / "torch-eager" / f"bert_{variant}@2x8.json").profile
        assert first.details.execution["prepare_s"] == 0.0, first.details.execution  # its build's model, ready
    assert read == [], read
