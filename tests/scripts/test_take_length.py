"""scripts/check_take_length.py (GPU only to run): how it reads the takes it timed, checked on
takes of known medians — each length against the longest, round by round."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def take_length(import_script):
    return import_script("check_take_length")


def test_each_length_is_read_against_the_longest_round_by_round(take_length):
    # A CUDA graph whose one-run takes read 3.5 % fast, and whose 100 ms takes read what 1 s ones do.
    medians = {"cuda graph": {0.0: [26.4, 26.3, 26.5, 26.4, 26.2, 26.4], 100.0: [27.3, 27.4, 27.3, 27.2, 27.4, 27.3], 1000.0: [27.35] * 6}}
    said = take_length.summary(medians, [0.0, 100.0, 1000.0])["cuda graph"]
    assert said["1000.0"] == {"median_ms": 27.35, "ratio_to_longest": 1.0, "interval": [1.0, 1.0]}
    assert said["0.0"]["ratio_to_longest"] == pytest.approx(26.4 / 27.35, abs=1e-4)
    assert said["0.0"]["interval"][1] < 0.97  # one-run takes read fast in every round
    low, high = said["100.0"]["interval"]
    assert low <= 1.0 <= high and said["100.0"]["median_ms"] == pytest.approx(27.3)
