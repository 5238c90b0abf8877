"""The variant that meets an accuracy floor keeping the least of the model's work in high precision.

Search, on the search batches (what sensitivity.py measured):

1. Exclude layers one at a time, the one that buys the most on **a floor metric that fails** per
   FLOP first: every failing metric is named at each step, and the first of them (in the floor's
   order) that some layer moves is chased — cosine where the cosine floor fails, top-1 (in samples:
   predictions changed, or lost against the labels) where a top-1 floor fails, the user's metric
   where that one does, the samples below a per-sample floor (in samples, as top-1) where the
   floor each input must keep fails; cosine breaks ties. A layer that buys nothing on the chased metric is never
   taken for it. What each layer buys is measured beside the exclusions so far whenever they
   interact (an exclusion that bought less than half of what its rank promised) or when no layer
   buys anything on any failing metric by the old measurements — at most ``RERANKS`` times; each
   costs a measurement per remaining layer. The search goes on until every floor metric holds.
2. Where no remaining layer moves any failing metric, the search ends: on a top-1 floor the
   samples cannot resolve (pipeline/precision/bounds.py), the plan is the best the search reached
   (nothing lost, or the least lost) with the samples that would resolve it; otherwise it starts
   again from every layer excluded and step 3 keeps what the floor needs.
3. Put back every excluded layer that is no longer needed, the costliest in FLOPs first: a layer
   stays excluded only if quantizing it again breaks the floor — or, for the best the search
   reached (step 2), only if quantizing it again makes it worse: a metric that held no longer
   holds, or more samples are counted against the limit the samples cannot resolve.
4. Confirm the result on the confirmation batches, which the search never saw.

"The floor holds" means it holds by each metric's one-sided 95 % bound on those samples (exact for
proportions, bounds that cover heavy-tailed errors for cosine and the metric: pipeline/precision/bounds.py), on the search
and on the confirmation alike. A plan that stopped exactly at the floor would miss it on the
confirmation about half the time; the confirmation's own bound is what makes "confirmed" a claim
at 95 % about the plan that was chosen, however the search came to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.catalog.floor import AccuracyFloor
from pipeline.precision.bounds import Bound
from pipeline.precision.figures import Figures, change_text
from pipeline.precision.sensitivity import Sensitivity
from pipeline.precision.unseen import Unseen, unseen
from pipeline.precision.variant_lab import VariantLab
from pipeline.running.errors import PipelineError

# How often what the remaining layers buy is measured again beside the exclusions so far.
RERANKS = 3
# An exclusion that buys less than this share of what it was ranked on means the layers interact.
INTERACTION = 0.5

Failing = tuple[str, str]  # a floor metric and its side: ("top1", "upper") is a top-1 drop


@dataclass
class Step:
    action: str  # "exclude", "rerank", "put back", "keep"
    layer: str | None
    search: Figures | None = None
    note: str = ""
    failing: list[Failing] = field(default_factory=list)  # the floor metrics that failed when it was taken

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "layer": self.layer,
            "search": self.search.as_dict() if self.search else None,
            "note": self.note,
            "failing": [{"metric": metric, "side": side} for metric, side in self.failing],
        }


@dataclass
class Plan:
    engine: str
    floor: AccuracyFloor
    exclude: list[str]  # in the model's order
    search: Figures
    confirm: Figures
    fully_quantized: dict[str, Figures]  # "search", "confirm"
    quantized_flops_share: float  # of the quantizable layers' FLOPs, still quantized
    steps: list[Step] = field(default_factory=list)
    search_samples: int = 0
    confirm_samples: int = 0
    # What the search and the confirmation were measured on (VariantLab.describe()).
    evaluation: dict[str, Any] = field(default_factory=dict)
    # Each floor metric's figure and bound: "search", "confirm".
    bounds: dict[str, list[Bound]] = field(default_factory=dict)

    @property
    def held_on_search(self) -> bool:
        return self.floor.met_by(self.search) and all(bound.held for bound in self.bounds.get("search", []))

    @property
    def status(self) -> str:
        """ "confirmed": the floor held on the search and every one of its limits is shown by its
        bound on the confirmation samples; "unresolved": it held by everything these samples can
        say, but some limit they cannot show (a top-1 limit finer than they resolve, a metric
        over one batch) — a plan, not a confirmed one; "failed": otherwise."""
        confirm = self.bounds.get("confirm", [])
        if not (self.held_on_search and self.floor.met_by(self.confirm) and all(bound.held for bound in confirm)):
            return "failed"
        return "confirmed" if all(bound.status == "held" for bound in confirm) else "unresolved"

    @property
    def confirmed(self) -> bool:
        return self.status == "confirmed"

    @property
    def needed(self) -> bool:
        return bool(self.exclude)

    @property
    def unseen(self) -> Unseen:
        """What the confirmation's samples, on which the plan's claim rests, cannot see
        (pipeline/precision/unseen.py)."""
        return unseen(self.confirm_samples, self.floor)

    def failing(self) -> list[Bound]:
        """Every floor metric that fails on the search at the plan's exclusions, by its figure or by
        its bound (empty where the floor held)."""
        return [bound for bound in self.bounds.get("search", []) if not bound.held or bound.status == "failed"]

    def unresolved(self) -> list[Bound]:
        """The floor's limits these samples cannot show at 95 % (bounds.py), on the search: a
        proportion finer than they resolve, a metric over one batch."""
        return [bound for bound in self.bounds.get("search", []) if not bound.resolvable or bound.bound is None]


def make_plan(lab: VariantLab, sensitivity: Sensitivity, floor: AccuracyFloor, progress=None) -> Plan:
    """Search, prune and confirm the exclusions that meet ``floor``."""
    progress = progress or (lambda text: None)
    flops = {layer.name: max(layer.flops, 1.0) for layer in sensitivity.layers}
    full = lab.evaluate([])
    described = lab.describe()
    if not floor.met_by(lab.evaluate(lab.layers)):
        raise PipelineError(
            f"no plan meets {floor} for {lab.ref.name}: not even the unquantized model (every layer in "
            f"{described['compute_dtype']}) does: {lab.evaluate(lab.layers).said()}.",
            hint="lower the floor (--floor), or measure this model unquantized",
        )
    search = _Search(lab, floor, flops)
    excluded, steps, stopped = _exclude_until_held(search, [layer.name for layer in sensitivity.layers], progress)
    # Where the samples cannot resolve a limit the search could not reach, the plan is the best it
    # reached (nothing lost, or the least lost), said with the samples that would resolve it.
    unresolvable = stopped and any(not bound.resolvable for bound in lab.bounds(excluded, floor) if not bound.held)
    if not search.holds(excluded) and not unresolvable:
        excluded = list(lab.layers)  # only the unquantized model meets it (checked above)
    for layer in sorted(excluded, key=lambda name: flops[name], reverse=True):
        trial = [name for name in excluded if name != layer]
        progress(f"putting {layer} back")
        if search.as_good(trial, excluded) if unresolvable else search.holds(trial):
            kept = "no worse with it quantized" if unresolvable else "the floor holds with it quantized"
            steps.append(Step("put back", layer, lab.evaluate(trial), f"no longer needed: {kept}"))
            excluded = trial
        else:
            broke = "makes the best reached worse" if unresolvable else "breaks the floor"
            steps.append(Step("keep", layer, lab.evaluate(trial), f"quantizing it again {broke}", search.failing(trial)))
    # A variant with every weighted layer unquantized quantizes no weight: the export refuses it.
    if set(getattr(lab, "weighted", lab.layers)) <= set(excluded):
        raise PipelineError(
            f"only the unquantized model meets {floor} for {lab.ref.name}: every quantized layer had to be excluded.",
            hint=f"measure {lab.ref.model} at fp16 or bf16, or lower the floor (--floor)",
        )
    order = {name: index for index, name in enumerate(lab.layers)}
    excluded.sort(key=order.__getitem__)
    progress("confirming on the batches the search never saw")
    total = sum(flops.values())
    return Plan(
        engine=lab.ref.name,
        floor=floor,
        exclude=excluded,
        search=lab.evaluate(excluded),
        confirm=lab.evaluate(excluded, "confirm"),
        fully_quantized={"search": full, "confirm": lab.evaluate([], "confirm")},
        quantized_flops_share=sum(flops[name] for name in lab.layers if name not in excluded) / total if total else 0.0,
        steps=steps,
        bounds={which: lab.bounds(excluded, floor, which) for which in ("search", "confirm")},
        search_samples=described["search"]["samples"],
        confirm_samples=described["confirm"]["samples"],
        evaluation=described,
    )


def _exclude_until_held(search: _Search, candidates: list[str], progress) -> tuple[list[str], list[Step], bool]:
    """Step 1 of the module docstring: the exclusions, the steps, and whether the search stopped
    with no remaining layer moving any failing metric."""
    lab = search.lab
    excluded: list[str] = []
    steps: list[Step] = []
    base: list[str] = []  # the exclusions what each candidate buys was measured beside
    reranks = 0
    while candidates and (failing := search.failing(excluded)):
        chased, ranked = next(((metric, found) for metric in failing if (found := search.ranked(candidates, base, metric))), (None, []))
        if chased is None:
            names = search.names(failing)
            if base != excluded and reranks < RERANKS:
                reranks, base = reranks + 1, list(excluded)
                progress(f"no layer buys {names} by the old measurements: measuring the {len(candidates)} remaining again")
                note = f"no remaining layer bought {names}; all {len(candidates)} measured again beside the exclusions so far"
                steps.append(Step("rerank", None, None, note, failing))
                continue
            steps.append(
                Step("stop", None, lab.evaluate(excluded), f"no remaining layer moves {names} beside the exclusions so far", failing)
            )
            return excluded, steps, True
        layer = ranked[0]
        promised = search.buys(layer, base, chased)
        progress(f"excluding {layer} ({len(excluded) + 1} excluded)")
        bought = search.buys(layer, excluded, chased)
        after = [*excluded, layer]
        note = f"{search.moved(excluded, after, chased)}; ranked on {search.amount(promised, chased)}"
        if len(failing) > 1:
            note += f"; failing: {search.names(failing)}"
        steps.append(Step("exclude", layer, lab.evaluate(after), note, failing))
        excluded = after
        candidates.remove(layer)
        if not search.holds(excluded) and candidates and reranks < RERANKS and not bought >= INTERACTION * promised:
            reranks, base = reranks + 1, list(excluded)
            progress(f"layers interact: measuring the {len(candidates)} remaining again")
            note = f"the remaining {len(candidates)} layers measured again beside the exclusions so far"
            steps.append(Step("rerank", None, None, note, search.failing(excluded)))
    return excluded, steps, False


class _Search:
    """What the search asks of the measurements: which floor metric fails, and what a layer buys on
    it — in samples for a proportion (one fewer changed is 1), as the figure for cosine and the
    metric (a drop's fall counts as a gain)."""

    def __init__(self, lab: VariantLab, floor: AccuracyFloor, flops: dict[str, float]):
        self.lab, self.floor, self.flops = lab, floor, flops

    def bound(self, layers: list[str], failing: Failing) -> Bound | None:
        """The bound of ``failing``'s metric at ``layers`` (None where these samples do not measure it)."""
        return next((b for b in self.lab.bounds(layers, self.floor) if (b.metric, b.side) == failing), None)

    def holds(self, layers: list[str]) -> bool:
        return self.floor.met_by(self.lab.evaluate(layers)) and all(bound.held for bound in self.lab.bounds(layers, self.floor))

    def as_good(self, layers: list[str], than: list[str]) -> bool:
        """Whether ``layers`` are no worse than ``than`` by every floor metric: one that holds at
        ``than`` holds, and one that fails there counts no more samples against its limit (a
        proportion the samples cannot resolve; a failing metric that counts no samples keeps
        every layer where it is)."""
        if self.floor.met_by(self.lab.evaluate(than)) and not self.floor.met_by(self.lab.evaluate(layers)):
            return False
        before = {(bound.metric, bound.side): bound for bound in self.lab.bounds(than, self.floor)}
        for bound in self.lab.bounds(layers, self.floor):
            was = before.get((bound.metric, bound.side))
            if bound.held or was is None:
                continue
            if was.held or bound.counted is None or was.counted is None or bound.counted > was.counted:
                return False
        return True

    def failing(self, layers: list[str]) -> list[Failing]:
        """Every one of the floor's metrics that fails at ``layers`` (by its figure or its bound), in
        the floor's order: thresholds, then largest drops, then the floor each input must keep."""
        figures = self.lab.evaluate(layers)
        found: list[Failing] = []
        for metric, limit in self.floor.thresholds:
            bound = self.bound(layers, (metric, "lower"))
            if (value := figures.value(metric)) is None or value < limit - 1e-12 or (bound is not None and not bound.held):
                found.append((metric, "lower"))
        for metric, limit in self.floor.drops:
            bound = self.bound(layers, (metric, "upper"))
            if (fell := figures.drop(metric)) is None or fell > limit + 1e-12 or (bound is not None and not bound.held):
                found.append((metric, "upper"))
        for metric, threshold, share in self.floor.per_sample:
            bound = self.bound(layers, ("sample_cos", "lower"))
            kept = figures.kept_share(metric, threshold)
            if kept is None or kept < share - 1e-12 or (bound is not None and not bound.held):
                found.append(("sample_cos", "lower"))
        return found

    def score(self, layers: list[str], failing: Failing) -> float:
        """Higher is better: minus the samples counted against a proportion; the cosine or the
        metric; minus a drop. NaN where the outputs are not finite."""
        metric, side = failing
        bound = self.bound(layers, failing)
        if bound is not None and bound.counted is not None:
            return -float(bound.counted)
        if metric == "cos":
            return self.lab.evaluate(layers).cosine
        if bound is None:
            return math.nan
        return bound.estimate if side == "lower" else -bound.estimate

    def buys(self, layer: str, beside: list[str], failing: Failing) -> float:
        return self.score([*beside, layer], failing) - self.score(beside, failing)

    def ranked(self, candidates: list[str], beside: list[str], failing: Failing) -> list[str]:
        """The candidates that buy anything on ``failing`` beside ``beside``, the most per FLOP first,
        then by cosine per FLOP."""
        cosine = ("cos", "lower")
        gains = {name: self.buys(name, beside, failing) for name in candidates}
        useful = [name for name, gain in gains.items() if not math.isnan(gain) and gain > 0]
        ties = {name: self.buys(name, beside, cosine) for name in useful}
        return sorted(useful, key=lambda name: (gains[name] / self.flops[name], _number(ties[name]) / self.flops[name]), reverse=True)

    def name(self, failing: Failing) -> str:
        metric, side = failing
        if metric == "sample_cos":
            threshold = self.floor.per_sample[0][1]
            return f"per-sample cosine (samples below {threshold:g})"
        if metric == "top1":
            labelled = side == "upper" and self.lab.labels
            return "top-1 (predictions lost against the labels)" if labelled else "top-1 (predictions changed)"
        return {"cos": "cosine", "metric": "the metric"}[metric]

    def names(self, failing: list[Failing]) -> str:
        """ "top-1 (predictions changed)", "top-1 (predictions changed) or cosine"."""
        return " or ".join(self.name(metric) for metric in failing)

    def amount(self, gain: float, failing: Failing) -> str:
        """What a gain is in the failing metric's own terms: "1 sample", "+0.0042 of cosine"."""
        metric, _ = failing
        if metric in ("top1", "sample_cos"):  # counted in samples (score)
            count = round(gain)
            return f"{count} sample{'s' if abs(count) != 1 else ''} of {'top-1' if metric == 'top1' else 'per-sample cosine'}"
        if metric == "cos":
            return f"{change_text(gain)} of cosine"
        return f"{gain:+.4g} of the metric"

    def moved(self, before: list[str], after: list[str], failing: Failing) -> str:
        """ "bought 1 sample of top-1 (3 → 2 changed), +0.0031 of cosine"."""
        gain = self.score(after, failing) - self.score(before, failing)
        said = f"bought {self.amount(gain, failing)}"
        was, now = self.bound(before, failing), self.bound(after, failing)
        if was is not None and was.counted is not None and now is not None:
            said += f" ({was.counted} → {now.counted} {now.counting})"
        if failing != ("cos", "lower"):
            said += f", {change_text(self.lab.evaluate(after).cosine - self.lab.evaluate(before).cosine)} of cosine"
        return said


def _number(value: float) -> float:
    return -math.inf if math.isnan(value) else value
