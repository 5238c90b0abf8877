"""A shape point measured on a build its engine no longer has (the model changed and the point left
the catalog's shapes, or the run stopped before it) is left out of compare and of the gate, and
compare says so: its figures belong to a model that is gone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.report.manifest_sources import load_baseline, load_manifests, measured_on_earlier_builds
from pipeline.workspace import Workspace
from tests.conftest import CPU_TOOLCHAINS, tiny_bert_catalog


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    """bert_fp32 on ONNX Runtime at 2x8 and 2x32; then its model made wider and its shapes cut to
    2x8, and run again: 2x32's manifest is left from the narrower model."""
    from pipeline.cli.main import main

    workspace = tmp_path_factory.mktemp("rebuilt")
    catalog = workspace / "pipeline.toml"
    catalog.write_text(tiny_bert_catalog(["2x8", "2x32"], ["fp32"], ["fp32"]) + CPU_TOOLCHAINS)
    assert main(["--catalog", str(catalog), "run"]) == 0
    catalog.write_text(
        catalog.read_text().replace("hidden_size = 32,", "hidden_size = 64,").replace('shapes = ["2x8", "2x32"]', 'shapes = ["2x8"]')
    )
    assert main(["--catalog", str(catalog), "run"]) == 0
    return workspace


def test_compare_leaves_out_a_point_of_an_earlier_build_and_says_so(rebuilt, run_cli):
    result = run_cli(rebuilt / "pipeline.toml", "compare", "--format", "json")
    assert result.exit_code == 0
    shapes = {row["shape"] for row in json.loads(result.out)["rows"]}
    assert shapes == {"2x8"}
    assert "left out 1 shape point measured on an earlier build of its engine (onnxruntime/bert_fp32@2x32)" in result.err
    assert "among the model's shapes" in result.err
    # Remembered by the compare cache: the second call, reading rows from it, leaves it out again.
    again = run_cli(rebuilt / "pipeline.toml", "compare", "--format", "json")
    assert {row["shape"] for row in json.loads(again.out)["rows"]} == {"2x8"} and "left out 1" in again.err


def test_the_gate_and_a_baseline_folder_read_only_the_current_builds(rebuilt, tmp_path):
    manifests = rebuilt / "manifests"
    assert (manifests / "onnxruntime" / "bert_fp32@2x32.json").is_file()  # kept on disk: nothing is deleted
    assert {m.shape for m in load_manifests(manifests)} == {"2x8"}
    assert {m.shape for m in load_baseline(str(rebuilt), Workspace(tmp_path), None)} == {"2x8"}


def test_the_gate_names_the_baseline_points_it_leaves_out(rebuilt, tmp_path, run_cli):
    """A baseline holding a point of an earlier build: that engine at that point goes ungated, and
    the gate says so (compare named the workspace's own)."""
    import shutil

    now = tmp_path / "now"
    now.mkdir()
    shutil.copy(rebuilt / "pipeline.toml", now / "pipeline.toml")
    shutil.copytree(rebuilt / "manifests", now / "manifests")
    (now / "manifests" / "onnxruntime" / "bert_fp32@2x32.json").unlink()  # only the baseline holds it
    gated = run_cli(now / "pipeline.toml", "compare", "--format", "json", "--baseline", str(rebuilt), "--fail-above", "1000")
    assert gated.exit_code == 0, gated.err
    assert (
        f"baseline {rebuilt}: left out 1 shape point measured on an earlier build of its engine (onnxruntime/bert_fp32@2x32)" in gated.err
    )
    assert "not gated" in gated.err and "left out" not in gated.err.split("baseline")[0]  # the workspace's own: none


def test_a_baseline_from_a_git_ref_reads_only_the_current_builds(rebuilt):
    def git(*args):
        subprocess.run(["git", "-C", str(rebuilt), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", "-f", "manifests")
    git("-c", "user.email=ci@example.invalid", "-c", "user.name=ci", "commit", "-qm", "results")
    assert {m.shape for m in load_baseline("HEAD", Workspace(rebuilt), None)} == {"2x8"}


def test_only_a_point_whose_engine_was_built_again_into_another_file_is_earlier():
    engines = {Path("m/t/a.json"): ["b2", "file2"], Path("m/t/b.json"): None, Path("m/t/d.json"): ["b2", None]}
    points = {
        Path("m/t/a@1.json"): ["b2", "file2"],  # the engine's build
        Path("m/t/a@2.json"): ["b1", "file1"],  # an earlier one, another file
        Path("m/t/a@3.json"): ["b1", "file2"],  # built again for other reasons, into the same file: current
        Path("m/t/a@4.json"): ["b1", None],  # an earlier build whose file is not known
        Path("m/t/b@1.json"): ["b0", "file0"],  # its engine records no build: nothing to tell
        Path("m/t/c@1.json"): ["b0", "file0"],  # no engine manifest
        Path("m/t/a@5.json"): None,  # the point records no build
        Path("m/t/d@1.json"): ["b1", "file1"],  # its engine's build made no file (it failed since)
    }
    asked = []

    def build_of(path):
        asked.append(path)
        return engines.get(path)

    assert measured_on_earlier_builds(points, build_of) == [Path("m/t/a@2.json"), Path("m/t/a@4.json"), Path("m/t/d@1.json")]
    assert asked.count(Path("m/t/a.json")) == 1  # read once for all its points
