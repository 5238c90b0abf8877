"""Paired rounds end to end (pipeline/stages/point.py): the engines of a shape point that run in
this process — ONNX Runtime and PyTorch here — prepared once and timed together, each manifest
keeping its takes and its group, the report pairing them round by round, and the JSON it prints
holding to the schema in docs/compare.schema.json."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import REPO_ROOT, write_catalog

pytest.importorskip("transformers", reason="the transformers family needs the transformers package (`make setup` installs it)")

TOOLCHAINS = ("onnxruntime", "torch-eager")
BERT_POINTS = ("2x16", "2x64", "4x64")


def shipped_catalog() -> str:
    """The shipped catalog with takes of a few milliseconds."""
    text = (REPO_ROOT / "pipeline.toml").read_text()
    short = "[profile]\nwarmup_ms = 5\niterations = 5\nduration_s = 0.05\ntake_ms = 5\nround_ms = 0\n"
    return re.sub(r"(?ms)^\[profile\]\n.*?(?=^\[)", short + "\n", text, count=1)


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    from pipeline.cli import main

    catalog = write_catalog(tmp_path_factory.mktemp("rounds"), shipped_catalog())
    argv = ["--catalog", str(catalog), "run", "--model", "vit_tiny", "--model", "bert_tiny", "--variant", "fp32"]
    for toolchain in TOOLCHAINS:
        argv += ["--toolchain", toolchain]
    assert main(argv) == 0
    return catalog


def rounds_of(catalog, toolchain: str, name: str):
    return read_manifest(catalog.parent / "manifests" / toolchain / f"{name}.json").profile.details.rounds


def test_the_engines_of_a_point_are_timed_in_one_set_of_rounds(paired):
    groups = set()
    for name in ("vit_tiny_fp32", *(f"bert_tiny_fp32@{point}" for point in BERT_POINTS)):
        (ort,), (eager,) = rounds_of(paired, "onnxruntime", name), rounds_of(paired, "torch-eager", name)
        assert ort.group == eager.group and ort.entrants == eager.entrants == ["fp32/onnxruntime", "fp32/torch-eager"]
        assert ort.rounds == eager.rounds >= 6 and ort.stop in ("decided", "budget")
        assert [t.round for t in ort.takes] == list(range(ort.rounds)) and [t.round for t in eager.takes] == list(range(eager.rounds))
        orders = [{t.order for t in (a, b)} for a, b in zip(ort.takes, eager.takes)]
        assert all(order == {0, 1} for order in orders)  # each round, one take each, in some order
        groups.add(ort.group)
    assert len(groups) == 4  # one set of rounds per shape point


def test_the_report_pairs_them_round_by_round(paired, run_cli):
    import jsonschema

    result = run_cli(paired, "compare", "--format", "json")
    assert result.exit_code == 0, result.err
    data = json.loads(result.out)
    jsonschema.validate(data, json.loads((REPO_ROOT / "docs" / "compare.schema.json").read_text()))
    assert data["schema"] == 19
    for verdict in data["verdicts"]:
        (pair,) = [c for c in verdict["comparisons"] if {c["a"]["toolchain"], c["b"]["toolchain"]} == set(TOOLCHAINS)]
        assert pair["paired"] is True and pair["rounds"] >= 6 and pair["low"] <= pair["ratio"] <= pair["high"]
        assert pair["outcome"] in ("faster", "slower", "same", "ambiguous")
        assert verdict["fastest"]["rounds"] >= 6 and verdict["tie_width"] == 0.03
    rows = [r for r in data["rows"] if r["median_ms"]]
    assert rows and all(r["rounds"] >= 6 and r["median_ci_ms"][0] <= r["median_ms"] * 1.5 for r in rows)


def test_a_group_is_measured_again_as_a_whole(paired, run_cli):
    argv = ["run", "--model", "vit_tiny", "--variant", "fp32", "--toolchain", "onnxruntime", "--toolchain", "torch-eager"]
    before = {t: rounds_of(paired, t, "vit_tiny_fp32")[0].group for t in TOOLCHAINS}
    again = run_cli(paired, *argv)
    assert again.exit_code == 0, again.err
    assert {t: rounds_of(paired, t, "vit_tiny_fp32")[0].group for t in TOOLCHAINS} == before  # nothing changed: nothing re-measured
    rebuilt = run_cli(paired, "build", "--engine", "vit_tiny_fp32", "--toolchain", "onnxruntime", "--force")
    assert rebuilt.exit_code == 0, rebuilt.err
    assert run_cli(paired, *argv).exit_code == 0
    after = {t: rounds_of(paired, t, "vit_tiny_fp32")[0].group for t in TOOLCHAINS}
    assert after["onnxruntime"] == after["torch-eager"] != before["onnxruntime"]  # both, in one new set of rounds


def test_force_redoes_each_stage_once_however_many_toolchains_need_it(paired, run_cli, tmp_path):
    """`run --force` with two toolchains: the export they share is done once, each toolchain's build
    once, and the point measured again in one new set of rounds."""
    import shutil

    workspace = tmp_path / "forced"
    shutil.copytree(paired.parent, workspace)
    catalog = workspace / paired.name
    before = {t: rounds_of(catalog, t, "vit_tiny_fp32")[0].group for t in TOOLCHAINS}
    argv = ["run", "--model", "vit_tiny", "--variant", "fp32", *(arg for t in TOOLCHAINS for arg in ("--toolchain", t)), "--force"]
    forced = run_cli(catalog, *argv)
    assert forced.exit_code == 0, forced.err
    lines = [line.split()[0] for line in forced.err.splitlines() if line.startswith(("export ", "build ")) and " done in " in line]
    assert lines.count("export") == 1 and lines.count("build") == 2, forced.err
    # The second toolchain's export is the one just done: not said again as unchanged.
    assert sum("didn't change" in line for line in forced.err.splitlines() if line.startswith("export ")) == 0, forced.err
    after = {t: rounds_of(catalog, t, "vit_tiny_fp32")[0].group for t in TOOLCHAINS}
    assert after["onnxruntime"] == after["torch-eager"] != before["onnxruntime"]


def test_ranked_by_p99_on_a_cpu_the_rounds_run_to_the_budget_and_the_verdict_says_what_its_takes_cannot_bound(paired, run_cli, tmp_path):
    """`run --by p99` end to end on this machine's CPU: the rounds stop on the p99 (its manifest says
    so), run to a budget too short for a p99 of two engines, and the answer says it is undecided by
    the p99 and how many takes would decide it; `compare --by median` ranks the same manifests by
    the median, and the JSON says which."""
    import shutil

    import jsonschema

    workspace = tmp_path / "by-p99"
    shutil.copytree(paired.parent, workspace)
    catalog = workspace / paired.name
    catalog.write_text(catalog.read_text().replace("[profile]\n", "[profile]\nbudget_s = 2\n", 1))
    argv = ["run", "--model", "vit_tiny", "--variant", "fp32", *(arg for t in TOOLCHAINS for arg in ("--toolchain", t)), "--by", "p99"]
    ran = run_cli(catalog, *argv)
    assert ran.exit_code == 0, ran.err
    (record,) = rounds_of(catalog, "onnxruntime", "vit_tiny_fp32")
    assert record.stop == "budget" and record.rounds < 437
    assert read_manifest(catalog.parent / "manifests" / "onnxruntime" / "vit_tiny_fp32.json").profile.details.settings.by == "p99"
    said = "vit_tiny: undecided by p99: "
    assert said in ran.out and f"(p99 needs 437 takes, has {record.rounds})" in ran.out, ran.out
    assert (
        run_cli(catalog, "compare", "--by", "p99").out.splitlines()[0]
        == "The answer: the fastest engine by p99 that meets the accuracy floor"
    )
    result = run_cli(catalog, "compare", "--by", "p99", "--format", "json", "--model", "vit_tiny")
    assert result.exit_code == 0, result.err
    data = json.loads(result.out)
    jsonschema.validate(data, json.loads((REPO_ROOT / "docs" / "compare.schema.json").read_text()))
    (verdict,) = data["verdicts"]
    assert verdict["ranked_by"] == "p99" and verdict["undecided"] and verdict["fastest"]["ranked_takes_needed"] == 437
    by_median = json.loads(run_cli(catalog, "compare", "--by", "median", "--format", "json", "--model", "vit_tiny").out)
    assert by_median["verdicts"][0]["ranked_by"] == "median" and " by p99" not in by_median["verdicts"][0]["text"]


def test_the_machines_load_is_read_once_when_a_points_rounds_end_for_all_its_engines(tmp_path, monkeypatch):
    """The engines of a point end their rounds together: the load at the end is read once for the
    point (on a GPU machine, two nvidia-smi calls) and every engine's manifest records that reading."""
    from pipeline.cli import main
    from pipeline.stages import point, profile

    readings = []

    def reading():
        readings.append({"cpu_count": 1, "reading": len(readings)})
        return readings[-1]

    monkeypatch.setattr(point, "machine_load", reading)
    monkeypatch.setattr(profile, "machine_load", reading)
    catalog = write_catalog(tmp_path, shipped_catalog().replace('shapes = ["2x16", "2x64", "4x64"]', 'shapes = ["2x16"]'))
    argv = ["--catalog", str(catalog), "run", "--model", "bert_tiny", "--variant", "fp32"]
    assert main([*argv, "--toolchain", "onnxruntime", "--toolchain", "torch-eager"]) == 0
    assert len(readings) == 2  # the point's start and its end
    ends = [
        read_manifest(catalog.parent / "manifests" / chain / "bert_tiny_fp32@2x16.json").profile.details.machine_load["end"]
        for chain in TOOLCHAINS
    ]
    assert ends == [readings[1], readings[1]]
