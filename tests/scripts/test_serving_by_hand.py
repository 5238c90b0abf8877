"""The independent serving checks (scripts/serve_by_hand.py, scripts/sample_gpu_power.py), GPU only
to run in earnest: the by-hand server on a CPU with a two-layer ModernBERT, and the power sampler's
reading of a span from samples of known energy."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def power(import_script):
    return import_script("sample_gpu_power")


def test_the_counter_is_read_between_the_samples_that_bracket_the_span(power):
    # 100 W for 2 s, then 300 W: the counter (mJ) climbs 100 J a second, then 300 J.
    rows = [(t, 100_000.0 * t if t <= 2 else 200_000.0 + 300_000.0 * (t - 2), 100_000.0 if t < 2 else 300_000.0) for t in (0, 1, 2, 3, 4)]
    counter, by_power = power.energy_over(rows, 0.5, 3.5)
    assert counter == pytest.approx(150.0 + 450.0)  # 1.5 s at 100 W, 1.5 s at 300 W
    assert by_power == pytest.approx((100 + 300 + 300) / 3 * 3.0)  # the samples inside, × 3 s
    with pytest.raises(ValueError, match="span"):
        power.energy_over(rows, -1.0, 2.0)


def test_the_by_hand_server_counts_what_its_threads_complete(import_script, tmp_path):
    serve = import_script("serve_by_hand")
    assert (
        serve.main(
            [
                "--device",
                "cpu",
                "--tiny",
                "--shapes",
                "1x8",
                "--streams",
                "1",
                "2",
                "--kinds",
                "eager",
                "cuda graph",
                "--seconds",
                "0.3",
                "--repeats",
                "2",
                "--padding",
                "both",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "serve-by-hand.json").read_text())
    # No CUDA graph on a CPU; every count once, then every count again, each unpadded then padded.
    assert [(r["kind"], r["streams"], r["repeat"], r["padding"]) for r in results] == [
        (kind, streams, repeat, padding) for repeat in (0, 1) for kind in ("eager",) for streams in (1, 2) for padding in (False, True)
    ]
    for result in results:
        assert result["inferences"] > 0
        assert result["inferences_per_s"] == pytest.approx(result["inferences"] / 0.3)
        assert 0 < result["median_ms"] <= result["p99_ms"]
        assert result["ended"] - result["started"] >= 0.3


def test_padded_requests_cut_every_sequence_after_the_first_to_half_of_it_or_more(import_script):
    import torch

    serve = import_script("serve_by_hand")
    assert serve.request_mask(torch, 4, 16, padding=False).eq(1).all()
    generator = torch.Generator().manual_seed(0)
    masks = [serve.request_mask(torch, 4, 16, padding=True, generator=generator) for _ in range(20)]
    for mask in masks:
        lengths = mask.sum(dim=1).tolist()
        assert lengths[0] == 16 and all(8 <= length <= 16 for length in lengths[1:])
        assert all(mask[row, : lengths[row]].eq(1).all() and mask[row, lengths[row] :].eq(0).all() for row in range(4))
    assert any(length < 16 for mask in masks for length in mask.sum(dim=1).tolist())


def test_the_agreement_says_where_the_product_and_by_hand_padded_differently(import_script, tmp_path):
    agreement = import_script("check_serving_agreement")
    export = tmp_path / "manifests" / "export"
    export.mkdir(parents=True)
    (export / "modernbert_bf16.json").write_text(json.dumps({"export": {"params": {"padding": True}}}))
    unpadded = [{"shape": "2x512", "kind": "eager", "streams": 1, "inferences_per_s": 100.0}]  # a record from before --padding
    words = agreement.padding_words(tmp_path, unpadded)
    assert words.startswith("the product's requests are padded, by hand's unpadded: other work")
    padded = [{**unpadded[0], "padding": True, "inferences_per_s": 80.0}]
    assert agreement.padding_words(tmp_path, padded) is None
    # Served both ways: the product is held to by hand's padded figure, and the padding's cost is shown.
    raw = {
        "shape": "2x512",
        "toolchain": "torch-eager",
        "profile": {"details": {"streams": [{"streams": 1, "mode": "threads", "inferences_per_s": 84.0}]}},
    }
    assert agreement.product_padding(tmp_path) is True
    assert agreement.throughput_ratios([raw], unpadded + padded, True) == [("2x512", "torch-eager", 1, 84.0, 80.0)]
    assert agreement.throughput_ratios([raw], unpadded + padded, False) == [("2x512", "torch-eager", 1, 84.0, 100.0)]
    assert agreement.padding_costs(unpadded + padded) == [("2x512", "eager", 1, 100.0, 80.0)]
    assert agreement.padding_costs(unpadded) == []
    (export / "modernbert_bf16.json").write_text(json.dumps({"export": {"params": {"padding": False}}}))
    assert agreement.padding_words(tmp_path, unpadded) is None


def test_the_agreement_matches_counts_by_kind_and_integrates_power_over_the_takes(import_script, tmp_path):
    agreement = import_script("check_serving_agreement")
    take = {"energy_resolved": True, "energy_from_s": 100.0, "energy_ms": 2000.0, "joules": 500.0}
    raw = {
        "shape": "2x512",
        "toolchain": "torch-cudagraphs",
        "profile": {
            "details": {
                "streams": [
                    {"streams": 2, "mode": "threads", "inferences_per_s": 330.0},
                    {"streams": 2, "mode": "processes", "inferences_per_s": 400.0},  # no by-hand figure for processes
                ],
                "rounds": [{"takes": [take, {**take, "energy_resolved": False}]}],
            }
        },
    }
    by_hand = [{"shape": "2x512", "kind": "cuda graph", "streams": 2, "inferences_per_s": 300.0}]
    assert agreement.throughput_ratios([raw], by_hand) == [("2x512", "torch-cudagraphs", 2, 330.0, 300.0)]
    # Served more than once by hand: its repeats' median (a host spell slows a repeat, not all).
    again = [*by_hand, {**by_hand[0], "inferences_per_s": 320.0}, {**by_hand[0], "inferences_per_s": 250.0}]
    assert agreement.throughput_ratios([raw], again) == [("2x512", "torch-cudagraphs", 2, 330.0, 300.0)]
    assert agreement.take_spans(raw) == [(100.0, 102.0, 500.0)]  # the unresolved take left out
    # 250 W from 99 s to 101 s, then 260 W: 1 s at 250 W and 1 s at 260 W within the take.
    assert agreement.integrated([(99.0, 250.0), (101.0, 260.0), (103.0, 0.0)], 100.0, 102.0) == 510.0
    smi = tmp_path / "smi.csv"
    smi.write_text("2026/12/05 02:00:00.500, 251.5\nnot a line\n2026/12/05 02:00:01.000, 252.0\n")
    (first, watts), (second, _) = agreement.read_nvidia_smi(smi)
    assert watts == 251.5 and second - first == 0.5


def test_the_interleaved_check_serves_both_sides_in_turn(import_script, tmp_path):
    check = import_script("check_serving_interleaved")
    argv = ["--device", "cpu", "--tiny", "--shape", "1x8", "--kinds", "eager", "--streams", "1", "--pairs", "2", "--seconds", "0.2"]
    assert check.main([*argv, "--out", str(tmp_path)]) == 0
    takes = json.loads((tmp_path / "serving-interleaved.json").read_text())
    # Each pair's two takes in turn, the order swapped from one pair to the next.
    assert [(t["pair"], t["side"]) for t in takes] == [(0, "product"), (0, "by hand"), (1, "by hand"), (1, "product")]
    assert all(t["inferences_per_s"] > 0 and t["probe_ms"] > 0 for t in takes)
