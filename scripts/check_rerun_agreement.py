"""Do two runs of the same sweep give the same answer? Reads two `pipeline compare --format json`
outputs (schema 3 or later) and says, for every shape point, whether the verdicts name the same engine (or
the same tie, or are both undecided), and for every paired comparison both runs hold, how far the
second run's ratio is from the first's.

    pipeline compare --model modernbert --format json > first.json
    pipeline run … --force
    pipeline compare --model modernbert --format json > second.json
    python scripts/check_rerun_agreement.py first.json second.json --tolerance 0.05

A point where one run is undecided among engines that include one the other run named is
"compatible", not a difference: that run stopped short of deciding what the other decided (its
budget ran out with a pair at the tie band's edge, say). Exits 1 when a verdict differs or a ratio
moved by more than `--tolerance` (relative). A ratio with
a launch-bound engine on one side (its row flagged `launch-bound` or `near launch-bound` in either
run: the host needs half a run's GPU time or more to issue it) is the host's speed against the
GPU's; on a host whose speed changes, pairing cannot hold it, so such ratios are listed apart,
with how far they moved, and not held to the tolerance. For them the script says instead whether the
two runs' intervals overlap: each interval covers its own run's rounds, so where they do not, the
host's mix of speeds changed between the runs by more than within either (docs/results/sweeps.md measured
that on the lent H100). That is reported, not failed: it is the host, not the engines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def engine(entry: dict) -> str:
    return f"{entry['variant']}/{entry['toolchain']}"


def named(verdict: dict) -> tuple[set[str], bool]:
    """The engines a verdict names (the answer and those tied with it) and whether it is undecided."""
    if not verdict.get("fastest"):
        return set(), False
    return {engine(verdict["fastest"]), *(engine(t) for t in verdict.get("tied") or [])}, bool(verdict.get("undecided"))


Claim = tuple[str, float | None, float | None]  # (outcome of A/B, the interval's low, high)


def claims(verdict: dict) -> dict[tuple[str, str], Claim]:
    """What a verdict's comparisons claim of each pair (a, b), a and b in a fixed order: the
    outcome of a's time over b's and its interval; "ambiguous" where a comparison has no outcome."""
    out = {}
    for pair in verdict.get("comparisons") or []:
        a, b = engine(pair["a"]), engine(pair["b"])
        said, low, high = pair.get("outcome") or "ambiguous", pair.get("low"), pair.get("high")
        if a > b:
            a, b = b, a
            said = {"faster": "slower", "slower": "faster"}.get(said, said)
            low, high = (1.0 / high if high else None), (1.0 / low if low else None)
        out[(a, b)] = (said, low, high)
    return out


def contradicts(one: Claim, other: Claim) -> bool:
    """Whether two claims of one pair cannot both hold: "faster" against "slower"; "faster" or
    "slower" against "the same" where their intervals share no value (or either has none to show
    it does). An undecided pair ("ambiguous") claims nothing."""
    (said, low, high), (said_too, low_too, high_too) = one, other
    if "ambiguous" in (said, said_too) or said == said_too:
        return False
    if {said, said_too} == {"faster", "slower"}:
        return True
    if None in (low, high, low_too, high_too):
        return True
    return not (low <= high_too and low_too <= high)


def contradictions(first: dict, second: dict) -> list[tuple[tuple[str, str], Claim, Claim]]:
    """The pairs both verdicts make a claim of, where the claims cannot both hold."""
    mine, theirs = claims(first), claims(second)
    return [(pair, mine[pair], theirs[pair]) for pair in sorted(set(mine) & set(theirs)) if contradicts(mine[pair], theirs[pair])]


def agreement(first: dict | None, second: dict | None) -> str:
    """ "same"; "compatible" where no claim of one contradicts a claim of the other and they name an
    engine in common (one faster by a little where the other says the same; one undecided among
    engines the other decided); else "DIFFERS"."""
    if first is None or second is None:
        return "DIFFERS"
    if answer(first) == answer(second):
        return "same"
    (one, _), (other, _) = named(first), named(second)
    return "compatible" if one & other and not contradictions(first, second) else "DIFFERS"


def claim_words(claim: Claim) -> str:
    said, low, high = claim
    interval = f" [{low:.4f}–{high:.4f}]" if low is not None and high is not None else ""
    return {"same": "the same", "ambiguous": "undecided"}.get(said, said) + interval


def answer(verdict: dict) -> str:
    """What the verdict names: "bf16/torch-reduce-overhead", a tie "a = b", or "undecided: a, b"."""
    if not verdict.get("fastest"):
        return "no answer"
    names = sorted([engine(verdict["fastest"]), *(engine(t) for t in verdict.get("tied") or [])])
    if verdict.get("undecided"):
        return "undecided: " + ", ".join(names)
    return " = ".join(names)


def paired_ratios(data: dict) -> dict[tuple[str, str, str], tuple[float, float | None, float | None]]:
    """Every paired comparison by (shape point, a, b), a and b in a fixed order: its ratio and
    its interval (None where the output has none)."""
    ratios = {}
    for verdict in data["verdicts"]:
        for pair in verdict.get("comparisons") or []:
            if not pair.get("paired"):
                continue
            a, b, ratio, low, high = engine(pair["a"]), engine(pair["b"]), pair["ratio"], pair.get("low"), pair.get("high")
            if a > b:
                a, b, ratio = b, a, 1.0 / ratio
                low, high = (1.0 / high if high is not None else None), (1.0 / low if low is not None else None)
            ratios[(verdict["shape"], a, b)] = (ratio, low, high)
    return ratios


def overlap(first: tuple[float, float | None, float | None], second: tuple[float, float | None, float | None]) -> bool | None:
    """Whether two intervals share a value; None when either run gave none."""
    (_, low1, high1), (_, low2, high2) = first, second
    if None in (low1, high1, low2, high2):
        return None
    return low1 <= high2 and low2 <= high1


def launch_bound(data: dict) -> set[tuple[str, str]]:
    """(shape point, engine) of every row flagged launch-bound or near it."""
    return {
        (row.get("shape"), engine(row))
        for row in data.get("rows") or []
        if any(flag.startswith(("launch-bound", "near launch-bound")) for flag in row.get("flags") or [])
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.05, help="how far a paired ratio may move (relative)")
    args = parser.parse_args()
    first, second = (json.loads(path.read_text()) for path in (args.first, args.second))
    ok = True
    answers = {v["shape"]: v for v in second["verdicts"]}
    for verdict in first["verdicts"]:
        later = answers.get(verdict["shape"])
        said = agreement(verdict, later)
        ok &= said != "DIFFERS"
        now = answer(later) if later is not None else "not in the second run"
        print(f"{verdict['shape']:8} {said}: {answer(verdict)}" + ("" if said == "same" else f"  |  {now}"))
        for (a, b), mine, theirs in contradictions(verdict, later) if later is not None else []:
            print(f"  {a} / {b}: {claim_words(mine)} against {claim_words(theirs)}")
    before, after = paired_ratios(first), paired_ratios(second)
    host_bound = launch_bound(first) | launch_bound(second)
    shared = sorted(set(before) & set(after))
    moves = sorted(((after[key][0] / before[key][0] - 1.0, key) for key in shared), key=lambda item: -abs(item[0]))
    apart = [(move, key) for move, key in moves if (key[0], key[1]) in host_bound or (key[0], key[2]) in host_bound]
    held = [(move, key) for move, key in moves if (move, key) not in apart]
    outside = [(move, key) for move, key in held if abs(move) > args.tolerance]
    ok &= not outside
    print(
        f"{len(held)} paired ratios in both runs between engines not launch-bound; {len(outside)} moved by more than {args.tolerance:.0%}"
    )
    for move, (shape, a, b) in held[:10] if outside else held[:3]:
        print(f"  {shape:8} {a} / {b}: {before[(shape, a, b)][0]:.4f} then {after[(shape, a, b)][0]:.4f} ({move:+.2%})")
    if apart:
        beyond = sum(1 for move, _ in apart if abs(move) > args.tolerance)
        print(
            f"{len(apart)} with a launch-bound engine on a side (not held to the tolerance); {beyond} moved by more than {args.tolerance:.0%}"
        )
        for move, (shape, a, b) in apart[:5]:
            print(f"  {shape:8} {a} / {b}: {before[(shape, a, b)][0]:.4f} then {after[(shape, a, b)][0]:.4f} ({move:+.2%})")
        overlaps = {key: overlap(before[key], after[key]) for _, key in apart}
        judged = [key for key, shared_value in overlaps.items() if shared_value is not None]
        if judged:
            disjoint = [key for key in judged if not overlaps[key]]
            apart_words = "; apart (the host's mix of speeds changed between the runs):" if disjoint else ""
            print(f"  their intervals overlap in {len(judged) - len(disjoint)} of {len(judged)}{apart_words}")
            for shape, a, b in disjoint[:5]:
                (r1, l1, h1), (r2, l2, h2) = before[(shape, a, b)], after[(shape, a, b)]
                print(f"  {shape:8} {a} / {b}: {r1:.4f} [{l1:.4f}–{h1:.4f}] then {r2:.4f} [{l2:.4f}–{h2:.4f}]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
