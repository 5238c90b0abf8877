"""Each graph compiled once, and compiled work kept (pipeline/runtimes/pytorch/compile_ahead.py,
pytorch/cache.py): two compiled toolchains that differ only by ``capture`` share each point's
compilation, the caches live in the workspace, and `pipeline cache export` / `import` carry them
to another workspace, whose compiles are then cache hits.

On a CPU ``capture`` has no CUDA graph to capture (the toolchain is refused there: it needs a GPU),
so the tests let it run as the plain compilation it shares; the capture itself is checked on the
lent GPU (scripts/check_gpus_speedup.sh)."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest

from pipeline.runtimes.pytorch.spec import TorchSpec
from tests.conftest import DATA, catalog_head, write_catalog
from tests.runtimes.pytorch.test_pytorch_runtime import manifest, needs_inductor

TOOLCHAINS = """
[variants.fp32]
precision = "fp32"

[toolchains.onnxruntime]
kind = "onnxruntime"

[toolchains.torch-eager]
kind = "torch"

[toolchains.torch-compile]
kind = "torch"
backend = "compile"

[toolchains.torch-captured]
kind = "torch"
backend = "compile"
capture = true
"""


def mlp_catalog(root):
    (root / "models-in").mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / "python_models" / "mlp.py", root / "models-in")
    text = catalog_head(["m"], ["fp32"]) + '\n[models.m]\npython = "models-in/mlp.py:make"\nshapes = ["2x4", "2x8"]\n' + TOOLCHAINS
    return write_catalog(root, text)


@pytest.fixture
def cpu_capture(monkeypatch):
    """``capture`` allowed on this CPU (where it compiles without capturing), the compiling
    processes two, and the cache directory left to the product (restored after the test)."""
    from pipeline.runtimes.pytorch import compile_ahead
    from pipeline.runtimes.pytorch.cache import ENVIRONMENT, torch_default_cache_dir

    real = TorchSpec.machine_problem
    monkeypatch.setattr(TorchSpec, "machine_problem", lambda self, *a: None if self.capture else real(self, *a))
    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 4)
    monkeypatch.setenv(ENVIRONMENT, torch_default_cache_dir())


def test_capture_is_a_compile_setting_and_not_beside_a_mode_that_captures_itself():
    assert TorchSpec(kind="torch", backend="compile", capture=True).capture
    with pytest.raises(ValueError, match="they need backend"):
        TorchSpec(kind="torch", backend="eager", capture=True)
    with pytest.raises(ValueError, match="captures its own"):
        TorchSpec(kind="torch", backend="compile", mode="reduce-overhead", capture=True)


# Why the compiling processes are not forked from their server (compile_process.forking_usable):
# None, they are; else each is a new interpreter, and the build manifest says why.
NOT_FORKED = [None, "a process forked from their server found CUDA unusable (torch.cuda reports a bad fork)"]


@needs_inductor
@pytest.mark.parametrize("not_forked", NOT_FORKED)
def test_two_toolchains_differing_only_by_capture_compile_each_point_once(tmp_path, run_cli, cpu_capture, monkeypatch, not_forked):
    from pipeline.runtimes.pytorch import compile_process
    from pipeline.runtimes.pytorch.compile_ahead import CompileJob, graph_key

    if not_forked:
        monkeypatch.setattr(compile_process, "forking_usable", lambda gpu=False: not_forked)
    catalog = mlp_catalog(tmp_path / "ws")
    result = run_cli(catalog, "run", "--model", "m", "--toolchain", "torch-compile", "--toolchain", "torch-captured")
    assert result.exit_code == 0, result.err
    assert "(2 shape points compiled, 0 of them found in the cache; 2 more shared their graphs)" in result.err
    ahead = manifest(catalog, "torch-compile", "m_fp32").build.details.compiler["compiled_ahead"]
    assert ahead["forked"] is (not_forked is None) and ahead.get("not_forked_why") == not_forked, ahead
    compiled = ahead["points"]
    shared = manifest(catalog, "torch-captured", "m_fp32").build.details.compiler["compiled_ahead"]["points"]
    assert sorted(compiled) == sorted(shared) == ["2x4", "2x8"]
    assert all(point["compile_s"] > 0 and "shares_graph_of" not in point for point in compiled.values()), compiled
    assert all(point["compile_s"] == 0.0 and point["shares_graph_of"] == "torch-compile" for point in shared.values()), shared
    # Where each compiled point's time went in its process: taken after the first hand-over, its
    # preparation holding its compilation, each process's start told once; a shared point took none.
    assert all(point["taken_s"] >= 0 and point["prepare_s"] >= point["compile_s"] for point in compiled.values()), compiled
    assert 1 <= sum("start_s" in point for point in compiled.values()) <= len(compiled), compiled
    assert all(point["start_s"] > 0 and point["import_s"] >= 0 for point in compiled.values() if "start_s" in point), compiled
    assert not any(key in point for point in shared.values() for key in ("taken_s", "prepare_s", "start_s", "import_s")), shared
    for shape in ("2x4", "2x8"):
        profile = manifest(catalog, "torch-captured", f"m_fp32@{shape}").profile
        execution = profile.details.execution
        assert profile.status == "done" and execution["served_by"]["process"].startswith("pipeline-compile-"), profile
        assert execution["compiled_by"].startswith("another toolchain's compilation") and execution["compile_s"] == 0.0
        # The same process serves both: the graph one compiled, the other prepared from it.
        leader = manifest(catalog, "torch-compile", f"m_fp32@{shape}").profile.details.execution
        assert leader["served_by"] == execution["served_by"]
    # The compiled work is the workspace's, and each compiling process recorded it for export.
    assert leader["inductor_cache_dir"] == str((tmp_path / "ws" / ".cache" / "torch").resolve())
    assert list((tmp_path / "ws" / ".cache" / "torch" / "megacache").glob("compile-*.bin"))

    # What makes the graph the same: everything but capture (and the mode that captures itself is its own).
    job = CompileJob("a", TorchSpec(kind="torch", backend="compile"), tmp_path, catalog, _Workload("2x4"))
    twin = CompileJob("b", TorchSpec(kind="torch", backend="compile", capture=True), tmp_path, catalog, _Workload("2x4"))
    other = CompileJob("c", TorchSpec(kind="torch", backend="compile", tf32=True), tmp_path, catalog, _Workload("2x4"))
    own = CompileJob("d", TorchSpec(kind="torch", backend="compile", mode="reduce-overhead"), tmp_path, catalog, _Workload("2x4"))
    assert graph_key(job) == graph_key(twin) != graph_key(other) and graph_key(own) is None
    assert graph_key(job) != graph_key(CompileJob("a", job.spec, tmp_path, catalog, _Workload("2x8")))


class _Workload:
    def __init__(self, shape):
        self.shape, self.inputs = shape, ()


@needs_inductor
def test_compiled_work_exported_from_one_workspace_is_found_by_another(tmp_path, run_cli, cpu_capture):
    first = mlp_catalog(tmp_path / "first")
    assert run_cli(first, "run", "--model", "m", "--toolchain", "torch-compile").exit_code == 0
    bundle = tmp_path / "compiled.zip"
    exported = run_cli(first, "cache", "export", str(bundle))
    assert exported.exit_code == 0, exported.err
    assert "record(s) of compiled work" in exported.out
    assert "KIND" in zipfile.ZipFile(bundle).namelist()

    second = mlp_catalog(tmp_path / "second")
    imported = run_cli(second, "cache", "import", str(bundle))
    assert imported.exit_code == 0, imported.err
    assert f"into {(tmp_path / 'second' / '.cache' / 'torch').resolve()}" in imported.out
    again = run_cli(second, "run", "--model", "m", "--toolchain", "torch-compile")
    assert again.exit_code == 0, again.err
    assert "2 shape points compiled, 2 of them found in the cache" in again.err
    points = manifest(second, "torch-compile", "m_fp32").build.details.compiler["compiled_ahead"]["points"]
    assert points and all(point["inductor_cache_hits"] >= 1 for point in points.values()), json.dumps(points)


def test_a_workspace_with_nothing_compiled_has_nothing_to_export_and_a_stranger_file_is_refused(tmp_path, run_cli):
    catalog = mlp_catalog(tmp_path / "ws")
    nothing = run_cli(catalog, "cache", "export", str(tmp_path / "out.zip"))
    assert nothing.exit_code != 0 and "there is no compiled work to export" in nothing.err and "Traceback" not in nothing.err
    stranger = tmp_path / "stranger.zip"
    stranger.write_text("not a bundle")
    refused = run_cli(catalog, "cache", "import", str(stranger))
    assert refused.exit_code != 0 and "is not a compile cache" in refused.err and "Traceback" not in refused.err
