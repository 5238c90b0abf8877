"""scripts/benchmark_spinner.py: takes timed in each state of the reporter's spinner, in turn."""

from __future__ import annotations

import re


def test_each_state_is_timed_and_read_against_takes_with_nothing_beside_them(import_script, capsys):
    benchmark = import_script("benchmark_spinner")
    assert benchmark.main(["--rounds", "3", "--take-ms", "5"]) == 0
    said = capsys.readouterr().out
    assert re.search(r"^plain .* over plain, paired: 1\.000 \(1\.000-1\.000\)$", said, re.M)
    for state in ("status", "measuring"):
        assert re.search(rf"^{state} +median take +\d+\.\d\d ms; over plain, paired: \d\.\d{{3}} \(\d\.\d{{3}}-\d\.\d{{3}}\)$", said, re.M)
