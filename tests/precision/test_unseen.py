"""What a plan's samples cannot see (pipeline/precision/unseen.py): none failing in n samples rules
out, at 95 %, only failures on more than 1 − 0.05^(1/n) of the inputs — about 3 in n, exactly the
binomial chance of seeing none — and 299 samples see a failure on 1 % of the inputs with a 95 %
chance; the plan says both, in the terminal and in its JSON."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rich.console import Console

from pipeline.catalog.floor import AccuracyFloor
from pipeline.precision.bounds import exact_upper
from pipeline.precision.plan import make_plan
from pipeline.precision.report import plan_document, print_plan
from pipeline.precision.unseen import rarest_ruled_out, samples_to_see, unseen
from tests.precision.test_search import NOISE, PlantedLab, sensitivity

pytest.importorskip("torch")


@pytest.mark.parametrize("n", [32, 128, 299, 512, 2048])
def test_none_failing_in_n_rules_out_only_failures_on_more_than_about_3_in_n(n):
    rarest = rarest_ruled_out(n)
    assert rarest == pytest.approx(1 - 0.05 ** (1 / n)) == pytest.approx(exact_upper(0, n))
    assert (1 - rarest) ** n == pytest.approx(0.05)  # a failure that rare is in none of n one time in twenty
    assert (1 - 0.99 * rarest) ** n > 0.05 > (1 - 1.01 * rarest) ** n  # rarer: missed more often than that
    assert 2.8 < rarest * n < 3.0  # the rule of three: ln 20 = 3.0 as n grows


@pytest.mark.parametrize("rate, needed", [(0.01, 299), (0.001, 2995), (0.05, 59), (0.03, 99)])
def test_the_samples_that_see_a_failure_on_a_share_of_the_inputs_with_a_95_percent_chance(rate, needed):
    assert samples_to_see(rate) == needed
    assert 1 - (1 - rate) ** needed >= 0.95 > 1 - (1 - rate) ** (needed - 1)


def test_a_plan_says_what_its_confirmation_cannot_see_in_the_terminal_and_the_json():
    lab = PlantedLab(NOISE, lambda quantized: set())
    floor = AccuracyFloor((("cos", 0.99),), "--floor", (), (("cos", 0.9, 0.97),))
    plan = replace(make_plan(lab, sensitivity(lab), floor), evaluation={})
    console = Console(record=True, width=400)
    print_plan(plan, len(lab.layers), "", "", console)
    said = " ".join(console.export_text().split())
    assert (
        "what the confirmation cannot see: 32 samples can miss a failure on up to 8.9% of inputs (about 3 in 32): none failing in "
        "them rules out, at 95%, only failures on more; 99 samples would see one on 3% of inputs, 299 one on 1%, 2995 one on "
        "0.1%, each with a 95% chance" in said
    )
    document = plan_document(plan, "int8_plan", {}, "", "")
    assert document["unseen"] == {
        "samples": 32,
        "confidence": 0.95,
        "rarest_ruled_out": pytest.approx(0.0893682),
        "samples_to_see": [{"rate": 0.03, "samples": 99}, {"rate": 0.01, "samples": 299}, {"rate": 0.001, "samples": 2995}],
    }
    assert unseen(32, AccuracyFloor((("cos", 0.99),), "--floor")).samples_to_see == ((0.01, 299), (0.001, 2995))
