"""The builds' work ahead of their profiles sized by the run (pipeline/stages/runner.py, jobs_ahead;
pipeline/stages/work_ahead.py): the run counts the points its compiled builds may hand over and
tells each pool so as it opens, before any work, so that the compiling processes share the CPUs out
among as many as will come (pipeline/runtimes/pytorch/compile_sizing.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import DATA, catalog_head, write_catalog

CATALOG = """
[models.m]
python = "models-in/mlp.py:make"
shapes = ["2x4", "2x8", "4x8"]

[models.fixed]
python = "models-in/mlp.py:make"
shapes = ["2x4", "2x8"]
static = true

[variants.fp32]
precision = "fp32"
[variants.fp16]
precision = "fp16"

[toolchains.onnxruntime]
kind = "onnxruntime"
[toolchains.torch-eager]
kind = "torch"
[toolchains.torch-compile]
kind = "torch"
backend = "compile"
[toolchains.torch-compile-max]
kind = "torch"
backend = "compile"
mode = "max-autotune-no-cudagraphs"
"""


def test_the_run_counts_every_point_its_compiled_builds_may_hand_over(tmp_path):
    """Three points of each of two variants on each of two compiled toolchains; none for eager or ONNX
    Runtime, none for a model built as an engine per point, none for the export alone."""
    from pipeline.runtimes import load_catalog
    from pipeline.stages.base import RunContext
    from pipeline.stages.runner import jobs_ahead
    from pipeline.workspace import Workspace

    (tmp_path / "models-in").mkdir()
    shutil.copy(DATA / "python_models" / "mlp.py", tmp_path / "models-in")
    catalog = load_catalog(write_catalog(tmp_path, catalog_head(["m"], ["fp32"]) + CATALOG))
    ctx = RunContext(catalog=catalog, workspace=Workspace(tmp_path))
    engines = catalog.select((), ("m", "fixed"), ("fp32", "fp16"))
    assert jobs_ahead(ctx, engines, ["onnxruntime", "torch-eager", "torch-compile", "torch-compile-max"]) == 2 * 2 * 3
    assert jobs_ahead(ctx, engines, ["onnxruntime", "torch-eager"]) == 0
    assert jobs_ahead(ctx, engines, [None]) == 0


def test_the_compiling_server_is_asked_for_before_the_toolchains_are_checked(tmp_path, run_cli, monkeypatch):
    """The server the compiling processes fork from imports for seconds: a run asks for it first,
    before its toolchains' checks import torch, and only where a compiled build hands points over."""
    from pipeline.running.errors import EnvironmentMissing
    from pipeline.runtimes.pytorch.runtime import TorchRuntime

    said = []

    def refuse(self):
        said.append(("checked", self.name))
        raise EnvironmentMissing("stopped here", hint="-")

    monkeypatch.setattr(TorchRuntime, "expect_ahead_work", lambda self: said.append(("asked", self.name)))
    monkeypatch.setattr(TorchRuntime, "check_usable", refuse)
    (tmp_path / "models-in").mkdir()
    shutil.copy(DATA / "python_models" / "mlp.py", tmp_path / "models-in")
    catalog = write_catalog(tmp_path, catalog_head(["m"], ["fp32"]) + CATALOG)
    assert run_cli(catalog, "run", "--model", "m", "--toolchain", "torch-compile").exit_code != 0
    assert said == [("asked", "torch-compile"), ("checked", "torch-compile")]
    said.clear()
    assert run_cli(catalog, "run", "--model", "m", "--toolchain", "torch-eager").exit_code != 0
    assert said == [("checked", "torch-eager")], "no points handed over: no server"


def test_each_pool_is_told_as_it_opens_before_its_first_work():
    from types import SimpleNamespace

    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.base import AheadPool, AheadWork
    from pipeline.stages.work_ahead import WorkAhead

    events = []

    class Recording(AheadPool):
        def expect(self, jobs):
            events.append(("expect", jobs))

        def submit(self, work):
            events.append(("submit", work.engine_path.name))
            return True

        def finish(self, progress, done=None):
            return [], None

        def close(self):
            pass

    stage = SimpleNamespace(engine=SimpleNamespace(name="m_fp32"), toolchain="torch-compile")
    ahead = WorkAhead(Reporter(), jobs=12)
    for name in ("a.pt", "b.pt"):
        assert ahead.submit(stage, AheadWork(Path(name), [1], Recording))
    assert events == [("expect", 12), ("submit", "a.pt"), ("submit", "b.pt")]
    unsized = WorkAhead(Reporter())  # not told: the pool sizes itself by what it is handed
    events.clear()
    unsized.submit(stage, AheadWork(Path("c.pt"), [1], Recording))
    assert events == [("submit", "c.pt")]
