"""scripts/check_rerun_agreement.py: two compare outputs of the same sweep, judged the way the seed
matrix's --force rerun is (same verdict at every point, every paired ratio within a tolerance)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "check_rerun_agreement.py"


def entry(toolchain: str, median: float) -> dict:
    return {"variant": "bf16", "toolchain": toolchain, "engine": "m_bf16", "median_ms": median}


def run(tmp_path, first: dict, second: dict) -> subprocess.CompletedProcess:
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(second))
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "a.json"), str(tmp_path / "b.json")], capture_output=True, text=True)


FIRST = {
    "schema": 3,
    "verdicts": [
        {
            "shape": "2x512",
            "fastest": entry("graphs", 1.0),
            "tied": [entry("compiled", 1.01)],
            "undecided": False,
            "comparisons": [
                {
                    "a": entry("graphs", 1.0),
                    "b": entry("eager", 10.0),
                    "ratio": 0.1,
                    "paired": True,
                    "outcome": "faster",
                    "low": 0.09,
                    "high": 0.11,
                },
                {
                    "a": entry("graphs", 1.0),
                    "b": entry("compiled", 1.01),
                    "ratio": 0.99,
                    "paired": True,
                    "outcome": "same",
                    "low": 0.98,
                    "high": 1.0,
                },
            ],
        }
    ],
}


def test_the_same_answer_with_ratios_in_either_order_agrees(tmp_path):
    second = copy.deepcopy(FIRST)
    verdict = second["verdicts"][0]
    verdict["fastest"], verdict["tied"] = verdict["tied"][0], [verdict["fastest"]]  # the tie named the other way round
    pair = verdict["comparisons"][0]
    pair["a"], pair["b"], pair["ratio"] = pair["b"], pair["a"], 1 / 0.102  # the same pair, the other way round, 2% apart
    pair["outcome"], pair["low"], pair["high"] = "slower", 1 / 0.112, 1 / 0.092
    result = run(tmp_path, FIRST, second)
    assert result.returncode == 0, result.stdout
    assert "2x512    same: bf16/compiled = bf16/graphs" in result.stdout
    assert "2 paired ratios in both runs between engines not launch-bound; 0 moved by more than 5%" in result.stdout


def test_another_engine_named_or_a_ratio_moved_fails_and_says_which(tmp_path):
    second = copy.deepcopy(FIRST)
    second["verdicts"][0]["tied"] = []
    # graphs faster than compiled beyond the tie band, where the first run's interval said the same
    second["verdicts"][0]["comparisons"][1].update(ratio=0.96, outcome="faster", low=0.95, high=0.97)
    second["verdicts"][0]["comparisons"][0]["ratio"] = 0.11  # 10% off
    result = run(tmp_path, FIRST, second)
    assert result.returncode == 1
    assert "2x512    DIFFERS: bf16/compiled = bf16/graphs  |  bf16/graphs" in result.stdout
    assert "  bf16/compiled / bf16/graphs: the same [1.0000–1.0204] against slower [1.0309–1.0526]" in result.stdout, result.stdout
    assert "1 moved by more than 5%" in result.stdout and "bf16/eager / bf16/graphs" in result.stdout, result.stdout


def test_faster_by_a_little_against_the_same_is_compatible_where_the_intervals_overlap(tmp_path):
    """One run names graphs alone, faster than compiled by an interval that reaches across the tie
    band's edge; the other ties the two, its interval inside the band: both can hold."""
    second = copy.deepcopy(FIRST)
    second["verdicts"][0]["tied"] = []
    second["verdicts"][0]["comparisons"][1].update(ratio=0.975, outcome="faster", low=0.96, high=0.985)
    result = run(tmp_path, FIRST, second)
    assert result.returncode == 0, result.stdout
    assert "2x512    compatible: bf16/compiled = bf16/graphs  |  bf16/graphs" in result.stdout


def test_faster_against_slower_differs_however_close(tmp_path):
    first, second = copy.deepcopy(FIRST), copy.deepcopy(FIRST)
    first["verdicts"][0]["tied"] = []
    first["verdicts"][0]["comparisons"][1].update(ratio=0.99, outcome="faster", low=0.985, high=0.995)
    second["verdicts"][0]["fastest"], second["verdicts"][0]["tied"] = entry("compiled", 0.99), []
    second["verdicts"][0]["comparisons"][1].update(ratio=1.01, outcome="slower", low=1.005, high=1.015)
    result = run(tmp_path, first, second)
    assert result.returncode == 1
    assert "2x512    DIFFERS: bf16/graphs  |  bf16/compiled" in result.stdout
    assert "bf16/compiled / bf16/graphs: slower [1.0050–1.0152] against faster [0.9852–0.9950]" in result.stdout, result.stdout


def test_a_ratio_with_a_launch_bound_engine_is_listed_apart_not_held_to_the_tolerance(tmp_path):
    # Eager PyTorch launch-bound on a host of two speeds: its ratio to a CUDA graph moves with the host.
    first, second = copy.deepcopy(FIRST), copy.deepcopy(FIRST)
    second["verdicts"][0]["comparisons"][0]["ratio"] = 0.145  # 45% off
    first["rows"] = [{**entry("eager", 10.0), "shape": "2x512", "flags": ["launch-bound: the host needs 97% of a run's GPU time"]}]
    result = run(tmp_path, first, second)
    assert result.returncode == 0, result.stdout
    assert "1 paired ratios in both runs between engines not launch-bound; 0 moved by more than 5%" in result.stdout
    assert "1 with a launch-bound engine on a side (not held to the tolerance); 1 moved by more than 5%" in result.stdout
    assert "bf16/eager / bf16/graphs: 10.0000 then 6.8966 (-31.03%)" in result.stdout
    first["rows"][0]["flags"] = ["near launch-bound: the host needs 60% of a run's GPU time to issue it"]
    assert run(tmp_path, first, second).returncode == 0
    first["rows"][0]["flags"] = ["noisy: interquartile CV 45% is above 10%"]  # noisy is not launch-bound
    assert run(tmp_path, first, second).returncode == 1


def test_a_launch_bound_ratio_is_judged_by_whether_the_two_runs_intervals_overlap(tmp_path):
    first, second = copy.deepcopy(FIRST), copy.deepcopy(FIRST)
    first["rows"] = [{**entry("eager", 10.0), "shape": "2x512", "flags": ["launch-bound: the host needs 97% of a run's GPU time"]}]
    first["verdicts"][0]["comparisons"][0].update(low=0.08, high=0.12)
    second["verdicts"][0]["comparisons"][0].update(ratio=0.13, low=0.115, high=0.15)  # 30% off, the intervals share 0.115-0.12
    result = run(tmp_path, first, second)
    assert result.returncode == 0, result.stdout
    assert "their intervals overlap in 1 of 1" in result.stdout and "apart" not in result.stdout.split("overlap in")[1]
    second["verdicts"][0]["comparisons"][0].update(low=0.125, high=0.15)  # nothing shared
    result = run(tmp_path, first, second)
    assert result.returncode == 0, result.stdout  # the host, reported, not failed
    assert "their intervals overlap in 0 of 1; apart (the host's mix of speeds changed between the runs):" in result.stdout
    # eager / graphs, the other way round from the output: [1/0.12, 1/0.08] then [1/0.15, 1/0.125]
    assert "bf16/eager / bf16/graphs: 10.0000 [8.3333–12.5000] then 7.6923 [6.6667–8.0000]" in result.stdout


def test_an_undecided_point_among_the_engines_the_other_run_named_is_compatible_not_a_difference(tmp_path):
    second = copy.deepcopy(FIRST)
    second["verdicts"][0]["undecided"] = True  # the same two engines, undecided this time
    second["verdicts"][0]["comparisons"][1].update(outcome="ambiguous", low=0.97, high=1.04)
    result = run(tmp_path, FIRST, second)
    assert result.returncode == 0, result.stdout
    assert "2x512    compatible: bf16/compiled = bf16/graphs  |  undecided: bf16/compiled, bf16/graphs" in result.stdout

    disjoint = copy.deepcopy(second)
    disjoint["verdicts"][0]["fastest"], disjoint["verdicts"][0]["tied"] = entry("eager", 10.0), [entry("other", 10.1)]
    result = run(tmp_path, FIRST, disjoint)
    assert result.returncode == 1 and "2x512    DIFFERS" in result.stdout
