"""Energy end to end on a CPU (ONNX Runtime, the tiny catalog): not asked for, nothing is read and
nothing is said under the table; asked for with no counter, the rows, the table and the manifests
say why there is no energy; with RAPL's files (a fake powercap tree, in the kernel's format, its
counter advanced by a thread as the hardware would) the rows read it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from pipeline.manifest import read_manifest
from pipeline.measuring.energy import NOT_ASKED
from tests.conftest import REPO_ROOT


def _fp32_only(catalog: Path, energy: bool = False) -> None:
    """The tiny catalog with its fp32 and fp16 variants only: two engines at one point, in rounds;
    with ``energy``, its [profile] asking for energy."""
    text = catalog.read_text().replace('variants = ["fp32", "fp16", "int8"]', 'variants = ["fp32", "fp16"]', 1)
    if energy:
        text = text.replace("[profile]\n", "[profile]\nenergy = true\n", 1)
    catalog.write_text(text)


def test_a_run_that_does_not_ask_reads_no_energy_and_says_nothing_of_it(tiny_catalog, run_cli, monkeypatch, tmp_path):
    def opened(*args, **kwargs):
        raise AssertionError("a counter was opened where energy was not asked for")

    monkeypatch.setattr("pipeline.measuring.energy.RaplEnergy.opened", classmethod(opened))
    monkeypatch.setattr("pipeline.measuring.energy.NvmlEnergy.opened", classmethod(opened))
    _fp32_only(tiny_catalog)
    assert run_cli(tiny_catalog, "run").exit_code == 0
    document = json.loads(run_cli(tiny_catalog, "compare", "--format", "json").out)
    measured = [row for row in document["rows"] if row["outcome"] == "measured"]
    assert len(measured) == 2 and all(row["energy_why_not"] == NOT_ASKED for row in measured)
    table = run_cli(tiny_catalog, "compare", "--wide").out
    assert "energy" not in table and "J/inf" not in table  # the user did not ask: no note to read
    profile = read_manifest(tiny_catalog.parent / "manifests" / "onnxruntime" / "tiny_fp32.json").profile
    (rounds,) = profile.details.rounds
    assert rounds.energy is None and rounds.energy_why_not == NOT_ASKED
    # Left out of the fingerprint, so measurements taken before the setting existed stay current.
    assert "energy" not in profile.params["settings"]
    assert all(take.joules is None for take in rounds.takes)


def test_a_cpu_run_without_a_counter_says_why_every_row_has_no_energy(tiny_catalog, run_cli, monkeypatch, tmp_path):
    absent = tmp_path / "sys-class-powercap"  # this VM's own state: no /sys/class/powercap at all
    monkeypatch.setattr("pipeline.measuring.energy.POWERCAP", absent)
    _fp32_only(tiny_catalog)
    assert run_cli(tiny_catalog, "run", "--energy").exit_code == 0
    why = f"no RAPL: {absent} absent"
    document = json.loads(run_cli(tiny_catalog, "compare", "--format", "json").out)
    measured = [row for row in document["rows"] if row["outcome"] == "measured"]
    assert len(measured) == 2
    assert all(row["joules_per_inference"] is None and row["energy_why_not"] == why for row in measured)
    table = run_cli(tiny_catalog, "compare", "--wide").out
    assert f"no energy: {why}" in table and "J/inf" not in table
    manifest = read_manifest(tiny_catalog.parent / "manifests" / "onnxruntime" / "tiny_fp32.json")
    (rounds,) = manifest.profile.details.rounds
    assert rounds.energy is None and rounds.energy_why_not == why
    assert all(take.joules is None for take in rounds.takes)


def test_by_energy_on_a_cpu_without_rapl_says_why_no_engine_can_be_ranked(tiny_catalog, run_cli, monkeypatch, tmp_path):
    absent = tmp_path / "sys-class-powercap"
    monkeypatch.setattr("pipeline.measuring.energy.POWERCAP", absent)
    _fp32_only(tiny_catalog)
    assert run_cli(tiny_catalog, "run", "--by", "energy").exit_code == 0  # ranking by energy asks for it
    # compare ranks by the catalog's [profile] by unless told: --by energy re-ranks the manifests.
    document = json.loads(run_cli(tiny_catalog, "compare", "--format", "json", "--by", "energy").out)
    (verdict,) = document["verdicts"]
    assert verdict["ranked_by"] == "energy" and verdict["undecided"] and not verdict["decided"]
    assert verdict["fastest"]["ranked_ms"] is None and document["schema"] == 19
    jsonschema = pytest.importorskip("jsonschema", reason="the test extra installs jsonschema (`make setup`)")
    jsonschema.validate(document, json.loads((REPO_ROOT / "docs" / "compare.schema.json").read_text()))
    assert all(pair["outcome"] == "ambiguous" and pair["ratio"] is None for pair in verdict["comparisons"])
    answer = " ".join(run_cli(tiny_catalog, "compare", "--by", "energy").out.split())  # as one line, unwrapped
    assert "undecided by energy" in answer and f"cannot be told apart (no energy reading: no RAPL: {absent} absent)" in answer


def _rapl_tree(root: Path) -> Path:
    """A powercap tree of one package, as the kernel lays it out; its counter file."""
    zone = root / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    counter = zone / "energy_uj"
    counter.write_text("0\n")
    return counter


def test_a_cpu_run_by_energy_ranks_by_joules_per_inference(tiny_catalog, run_cli, monkeypatch, tmp_path):
    counter = _rapl_tree(tmp_path / "powercap")
    stop = threading.Event()

    def package_at_20_watts():
        uj = 0
        while not stop.wait(0.001):
            uj += 20_000
            (counter.parent / "next").write_text(f"{uj}\n")
            os.replace(counter.parent / "next", counter)

    ticking = threading.Thread(target=package_at_20_watts, daemon=True)
    ticking.start()
    monkeypatch.setattr("pipeline.measuring.energy.POWERCAP", tmp_path / "powercap")
    _fp32_only(tiny_catalog)  # energy not asked in the catalog: ranking by it reads it
    try:
        assert run_cli(tiny_catalog, "run", "--by", "energy").exit_code == 0
    finally:
        stop.set()
        ticking.join()
    profile = read_manifest(tiny_catalog.parent / "manifests" / "onnxruntime" / "tiny_fp32.json").profile
    assert profile.params["settings"]["by"] == "energy" and profile.details.rounds[0].energy.source == "rapl"
    document = json.loads(run_cli(tiny_catalog, "compare", "--format", "json", "--by", "energy").out)
    (verdict,) = document["verdicts"]
    rows = {row["engine"]: row for row in document["rows"] if row["outcome"] == "measured"}
    assert verdict["ranked_by"] == "energy" and verdict["comparisons"]
    for entry in [verdict["fastest"], *verdict["tied"]]:
        assert entry["ranked_ms"] == rows[entry["engine"]]["joules_per_inference"]  # joules, under the same key
    (pair, *_) = verdict["comparisons"]
    assert pair["paired"] and pair["rounds"] >= 6 and pair["ratio"] is not None
    # The same manifests ranked by the median again: compare re-ranks, it never re-measures.
    assert json.loads(run_cli(tiny_catalog, "compare", "--format", "json", "--by", "median").out)["verdicts"][0]["ranked_by"] == "median"
    said = run_cli(tiny_catalog, "compare", "--by", "energy").out
    assert said.splitlines()[0] == "The answer: the engine of least energy that meets the accuracy floor"
    answer = " ".join(said.split())
    # Which engine spends less is the machine's; that the answer is by energy is the product's.
    assert "least energy" in answer or "undecided by energy" in answer or "tie within ±3% by energy" in answer


def test_a_cpu_run_with_rapl_reads_joules_per_inference(tiny_catalog, run_cli, monkeypatch, tmp_path):
    root = tmp_path / "powercap"
    zone = root / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    counter = zone / "energy_uj"
    counter.write_text("0\n")
    stop = threading.Event()

    def package_at_20_watts():
        uj = 0
        while not stop.wait(0.001):  # the register's ~1 ms updates, 20 mJ a millisecond
            uj += 20_000
            (zone / "next").write_text(f"{uj}\n")
            os.replace(zone / "next", counter)  # whole, as the kernel's read is

    ticking = threading.Thread(target=package_at_20_watts, daemon=True)
    ticking.start()
    monkeypatch.setattr("pipeline.measuring.energy.POWERCAP", root)
    # Counted as 10 ms a step, a take resolves at 100 ms: a take of take_ms 5 gets there only by being
    # lengthened, however slow the host (at 1 ms, a slow host's 5 ms takes ran 10 ms and resolved alone).
    monkeypatch.setattr("pipeline.measuring.energy.RAPL_UPDATE_MS", 10.0)
    _fp32_only(tiny_catalog, energy=True)
    try:
        assert run_cli(tiny_catalog, "run").exit_code == 0
    finally:
        stop.set()
        ticking.join()
    document = json.loads(run_cli(tiny_catalog, "compare", "--format", "json").out)
    measured = [row for row in document["rows"] if row["outcome"] == "measured"]
    assert len(measured) == 2
    for row in measured:
        assert row["energy_source"] == "rapl" and row["energy_why_not"] is None and "CPU package" in row["energy_scope"]
        assert row["joules_per_inference"] > 0 and row["inferences_per_joule"] == pytest.approx(1 / row["joules_per_inference"])
        # 20 W over a run's time, give or take the untimed runs and the time between runs (and a
        # ticking thread that falls behind on a busy host).
        assert 0.25 < row["joules_per_inference"] / (20.0 * row["median_ms"] / 1000.0) < 1.5
    profile = read_manifest(tiny_catalog.parent / "manifests" / "onnxruntime" / "tiny_fp32.json").profile
    assert profile.params["settings"]["energy"] is True  # asking for energy measures again
    rounds = profile.details.rounds[0]
    # take_ms 5 is far shorter than MIN_STEPS of the counter's updates: the takes grew until they
    # resolved. A take that did not doubles the least length from its own (EnergyPace.after), so the
    # least is twice take_ms at least; how far past it depends on how long the host made the takes.
    assert rounds.energy.source == "rapl" and rounds.energy.least_take_ms >= 2 * 5
    assert rounds.takes[-1].energy_resolved and rounds.takes[-1].joules > 0
    assert "J/inf" in run_cli(tiny_catalog, "compare", "--wide").out
