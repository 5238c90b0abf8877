"""Do the product's serving and energy figures agree with readings taken beside it? (GPU record)

Reads a workspace's profile manifests and, for each engine:

- **throughput**: each stream count it served by threads against scripts/serve_by_hand.py's
  figure for the same shape, kind and count (eager ↔ torch-eager, cuda graph ↔ torch-cudagraphs,
  compiled ↔ torch-compile), as a ratio; the target is within 10 %. Where by hand served a count
  more than once (``--repeats``), the repeats' median is the figure and their range is shown
  beside it: a launch-bound engine's figure follows the host's spells, and a ratio outside that
  range says more than one inside it (docs/streams.md; scripts/check_serving_interleaved.py takes
  the two side by side, take for take);
- **energy per take**: the joules the product read around each take against NVML's counter read
  by a process of its own (scripts/sample_gpu_power.py) over the same span, summed over the
  engine's resolved takes, as a ratio; the target is within 5 %;
- **power × time**: over every take of a point together (20 s or more of takes), the product's
  joules against nvidia-smi's power.draw integrated over the same spans; the target is within 20 %.

    python scripts/check_serving_agreement.py --workspace WS --by-hand serve-by-hand.json \
        --power power.csv --nvidia-smi nvidia-smi.csv

Takes carry when their counter was read from (epoch seconds) and for how long in the manifest
(``energy_from_s``, ``energy_ms``);
a manifest without them is reported as such.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from sample_gpu_power import energy_over, read  # noqa: E402

KIND_OF = {"torch-eager": "eager", "torch-cudagraphs": "cuda graph", "torch-compile": "compiled"}


def manifests(workspace: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((workspace / "manifests").rglob("*@*.json"))]


def by_hand_figures(by_hand: list[dict], padding: bool | None = None) -> dict[tuple, list[float]]:
    """Each (shape, kind, streams)'s inferences/s, one a repeat, in the order served: of the
    requests padded as ``padding`` says where by hand served them so (its records say `padding`,
    absent before it had the option: unpadded), else of every request."""
    kept = [r for r in by_hand if padding is None or bool(r.get("padding", False)) == padding] or by_hand
    figures: dict[tuple, list[float]] = {}
    for r in kept:
        figures.setdefault((r["shape"], r["kind"], r["streams"]), []).append(r["inferences_per_s"])
    return figures


def product_padding(workspace: Path) -> bool | None:
    """Whether the product padded its requests (a transformers model's sequences after the first,
    unless its `padding` is off: the exports' params say), None where its exports do not say one way."""
    said = {
        bool(((json.loads(path.read_text()).get("export") or {}).get("params") or {}).get("padding"))
        for path in sorted((workspace / "manifests" / "export").glob("*.json"))
    }
    return said.pop() if len(said) == 1 else None


def padding_words(workspace: Path, by_hand: list[dict]) -> str | None:
    """Where by hand served no request padded as the product's were, what that means; None where
    it did (or the product's exports do not say)."""
    product = product_padding(workspace)
    hand = {bool(r.get("padding", False)) for r in by_hand}
    if product is None or not hand or product in hand:
        return None
    said = {True: "padded", False: "unpadded"}
    return f"the product's requests are {said[product]}, by hand's {said[not product]}: other work (docs/results/streams.md), so a ratio far from 1 may be that"


def padding_costs(by_hand: list[dict]) -> list[tuple[str, str, int, float, float]]:
    """(shape, kind, streams, unpadded inferences/s, padded inferences/s: each its repeats' median)
    for every count by hand served both ways (``--padding both``)."""
    if {bool(r.get("padding", False)) for r in by_hand} != {False, True}:
        return []
    unpadded, padded = by_hand_figures(by_hand, False), by_hand_figures(by_hand, True)
    return [(*key, statistics.median(unpadded[key]), statistics.median(padded[key])) for key in sorted(unpadded.keys() & padded.keys())]


def throughput_ratios(raws: list[dict], by_hand: list[dict], padding: bool | None = None) -> list[tuple[str, str, int, float, float]]:
    """(shape, toolchain, streams, product inferences/s, by-hand inferences/s: its repeats' median,
    of requests padded as ``padding`` says where by hand has them) for every count served by threads."""
    hand = by_hand_figures(by_hand, padding)
    out = []
    for raw in raws:
        details = (raw.get("profile") or {}).get("details") or {}
        kind = KIND_OF.get(raw.get("toolchain"))
        for served in details.get("streams") or []:
            key = (raw.get("shape"), kind, served.get("streams"))
            if served.get("mode") == "threads" and served.get("inferences_per_s") and key in hand:
                out.append((raw["shape"], raw["toolchain"], served["streams"], served["inferences_per_s"], statistics.median(hand[key])))
    return out


def take_spans(raw: dict) -> list[tuple[float, float, float]]:
    """(start, end, joules) of each resolved take of the engine's rounds that says when it ran."""
    details = (raw.get("profile") or {}).get("details") or {}
    spans = []
    for record in details.get("rounds") or []:
        for take in record.get("takes") or []:
            if take.get("energy_resolved") and take.get("energy_from_s") and take.get("energy_ms") and take.get("joules") is not None:
                spans.append((take["energy_from_s"], take["energy_from_s"] + take["energy_ms"] / 1e3, take["joules"]))
    return spans


def read_nvidia_smi(path: Path) -> list[tuple[float, float]]:
    """(epoch seconds, watts) of `nvidia-smi --query-gpu=timestamp,power.draw --format=csv,noheader,nounits`,
    its timestamps in this machine's local time."""
    rows = []
    for line in path.read_text().splitlines():
        stamp, _, watts = line.partition(",")
        try:
            whole, _, fraction = stamp.strip().partition(".")
            epoch = time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + float(f"0.{fraction or 0}")
            rows.append((epoch, float(watts)))
        except ValueError:
            continue
    return rows


def integrated(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """Joules of a power series over [start, end]: each sample's watts held until the next one."""
    total = 0.0
    for (t0, watts), (t1, _) in zip(samples, samples[1:], strict=False):
        overlap = min(t1, end) - max(t0, start)
        if overlap > 0:
            total += watts * overlap
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--by-hand", type=Path, required=True)
    parser.add_argument("--power", type=Path, required=True)
    parser.add_argument("--nvidia-smi", type=Path, required=True)
    args = parser.parse_args(argv)
    raws = manifests(args.workspace)
    by_hand = json.loads(args.by_hand.read_text())
    padding = product_padding(args.workspace)
    repeats = by_hand_figures(by_hand, padding)
    print("== throughput, product against by hand (target: within 10 %)")
    unlike = padding_words(args.workspace, by_hand)
    if unlike:
        print(f"  NOTE {unlike}")
    for shape, toolchain, streams, product, hand in throughput_ratios(raws, by_hand, padding):
        each = repeats[(shape, KIND_OF[toolchain], streams)]
        spread = f"; by hand's {len(each)} repeats {min(each):.1f}–{max(each):.1f}" if len(each) > 1 else ""
        print(
            f"  {shape:>7} {toolchain:<17} {streams} streams: {product:9.1f} vs {hand:9.1f} inferences/s, ratio {product / hand:.3f}{spread}"
        )
    costs = padding_costs(by_hand)
    if costs:
        print("== by hand, padded requests against unpadded, each count in turn (what the padding costs)")
        for shape, kind, streams, unpadded, padded in costs:
            print(
                f"  {shape:>7} {kind:<17} {streams} streams: {padded:9.1f} vs {unpadded:9.1f} inferences/s, ratio {padded / unpadded:.3f}"
            )
    power, smi = read(args.power), read_nvidia_smi(args.nvidia_smi)
    print("== energy over the engine's takes, product against NVML read by another process (target: within 5 %)")
    points: dict[str, list[tuple[float, float, float]]] = {}
    for raw in raws:
        spans = take_spans(raw)
        if not spans:
            print(f"  {raw.get('shape')} {raw.get('toolchain')}: no takes with energy and their times")
            continue
        points.setdefault(raw.get("shape"), []).extend(spans)
        product = sum(joules for _, _, joules in spans)
        other = sum(energy_over(power, start, end)[0] for start, end, _ in spans)
        print(
            f"  {raw.get('shape'):>7} {raw.get('toolchain'):<17} {len(spans)} takes: {product:.2f} J vs {other:.2f} J, ratio {product / other:.3f}"
        )
    print("== every take of a point, product against nvidia-smi power × time (target: within 20 %, 20 s or more)")
    for shape, spans in points.items():
        seconds = sum(end - start for start, end, _ in spans)
        product = sum(joules for _, _, joules in spans)
        other = sum(integrated(smi, start, end) for start, end, _ in spans)
        said = f"ratio {product / other:.3f}" if other else "no nvidia-smi samples there"
        print(f"  {shape:>7}: {seconds:.1f} s of takes, {product:.1f} J vs {other:.1f} J, {said}{'' if seconds >= 20 else ' (under 20 s)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
