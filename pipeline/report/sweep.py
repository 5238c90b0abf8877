"""The sweep, per model measured at shape points: one line per variant × toolchain, one column per
point (median ms, tokens/s or GPU memory), the verdict's choice marked (pipeline/report/verdict.py);
and the crossovers in words — where one way of running the model overtakes another as the shape
grows. Built from comparison rows only (pipeline/report/rows.py), so every format says the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.catalog import ShapeSizes
from pipeline.measuring.stats import RatioEstimate
from pipeline.measuring.stopping import GROSS, gross_rule
from pipeline.report import pairs
from pipeline.report.confidence import time_ratio
from pipeline.report.gpus import gpu_type_judged_on, gpu_words, measured_on
from pipeline.report.rows import ComparisonRow, shape_order
from pipeline.report.verdict import TIE, Verdict, times

METRICS = ("ms", "tokens", "memory")


# --- the sweep -----------------------------------------------------------------------------------


@dataclass
class Sweep:
    """One model (on one GPU type) across its shape points: a line per variant × toolchain."""

    model: str
    gpu_type: str | None
    shapes: list[str]
    # (variant, toolchain label) -> {shape: row}
    lines: dict[tuple[str, str], dict[str, ComparisonRow]]
    # The verdict's choice at each shape point, and the engines the data cannot tell from it there.
    best: dict[str, ComparisonRow]
    tied: dict[str, list[ComparisonRow]] = field(default_factory=dict)
    tie: float = TIE
    # The catalog's baseline toolchain, whose line every line of its variant is set against.
    baseline: str | None = None
    # The ids of the tied rows by shape, kept in step with ``tied`` by is_tied().
    _tied_ids: dict[str, set[int]] = field(default_factory=dict, repr=False)

    @property
    def title(self) -> str:
        return self.model + (f" on {self.gpu_type}" if self.gpu_type else "")

    def cell(self, key: tuple[str, str], shape: str, metric: str) -> str:
        """The figure at a point, or why there is none ("out of memory", "refused", "skipped")."""
        row = self.lines[key].get(shape)
        if row is None:
            return "–"
        if row.median_ms is None:
            return short_status(row.status)
        value = {"ms": row.median_ms, "tokens": row.tokens_per_s, "memory": row.gpu_memory_mib}[metric]
        if value is None:
            return "–"
        text = f"{value:.3f}" if metric == "ms" else f"{value:,.0f}"
        if self.best.get(shape) is row:
            return "*" + text
        return ("=" if self.is_tied(shape, row) else "") + text

    def is_tied(self, shape: str, row: ComparisonRow) -> bool:
        """Whether the verdict at ``shape`` cannot tell ``row`` from its answer."""
        tied = self.tied.get(shape, [])
        ids = self._tied_ids.get(shape)
        if ids is None or len(ids) != len(tied):
            ids = self._tied_ids[shape] = {id(other) for other in tied}
        return id(row) in ids

    def crossovers(self) -> list[str]:
        """Two toolchains that ran the same variant, in words: by how much one is faster at the
        first and the last point they share, and where the lead changes as the sequence grows.
        Each toolchain is set against the variant's leaders (the toolchain of least median at some
        point) and its baseline toolchain: with three toolchains a variant that is every two, and
        with thousands (a sweep over many builds) a sentence each, not millions."""
        out = []
        keys = list(self.lines)
        for i, j in self._crossover_pairs():
            sentence = _crossover(self.shapes, self.lines[keys[i]], self.lines[keys[j]], self.tie)
            if sentence:
                out.append(sentence)
        return out

    def crossover_leads(self) -> list[Lead]:
        """Every comparison the crossover sentences are made of (what they claim, pair by pair)."""
        keys = list(self.lines)
        return [lead for i, j in self._crossover_pairs() for lead in leads(self.shapes, self.lines[keys[i]], self.lines[keys[j]], self.tie)]

    def _crossover_pairs(self) -> list[tuple[int, int]]:
        """The pairs of lines (by their place) with a reference in them, in the lines' order: a
        reference against each line of its variant, not every two lines (n² of them for a sweep
        over thousands of builds)."""
        keys = list(self.lines)
        place = {key: index for index, key in enumerate(keys)}
        pairs = set()
        for reference in self._references():
            for key in keys:
                if key[0] == reference[0] and key != reference:
                    pairs.add((min(place[key], place[reference]), max(place[key], place[reference])))
        return sorted(pairs)

    def _references(self) -> set[tuple[str, str]]:
        """The lines every other line of their variant is set against: each variant's fastest line
        at each point, and the baseline toolchain's."""
        leaders: dict[tuple[str, str], tuple[float, tuple[str, str]]] = {}
        for key, points in self.lines.items():
            for shape, row in points.items():
                leader = leaders.get((key[0], shape))
                if row.median_ms is not None and (leader is None or row.median_ms < leader[0]):
                    leaders[(key[0], shape)] = (row.median_ms, key)
        return {key for _, key in leaders.values()} | {key for key in self.lines if key[1] == self.baseline}

    def public(self, metric: str = "ms") -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu_type": self.gpu_type,
            "shapes": self.shapes,
            "lines": [
                {
                    "variant": variant,
                    "toolchain": target,
                    "points": {
                        shape: {
                            "median_ms": row.median_ms,
                            "tokens_per_s": row.tokens_per_s,
                            "gpu_memory_mib": row.gpu_memory_mib,
                            "gpu_memory_kind": row.gpu_memory_kind,
                            "median_ci_ms": list(row.median_ci_ms) if row.median_ci_ms else None,
                            "status": row.status,
                            "outcome": row.outcome,
                            "best": self.best.get(shape) is row,
                            "tied_with_best": self.is_tied(shape, row),
                        }
                        for shape, row in points.items()
                    },
                    # Where the line has no number, and why: a curve that ends at the point that did not fit.
                    "gaps": [
                        {"shape": shape, "outcome": points[shape].outcome, "why": short_status(points[shape].status)}
                        for shape in self.shapes
                        if shape in points and points[shape].median_ms is None
                    ],
                }
                for (variant, target), points in self.lines.items()
            ],
            "crossovers": self.crossovers(),
            "gpus": [
                {**device, "points": sorted({row.shape for row in rows}, key=shape_order)}
                for device, rows in measured_on([row for points in self.lines.values() for row in points.values()]).values()
            ],
        }

    def notes(self) -> list[str]:
        """What the sweep's table is read with: its crossovers, and the GPUs its points were
        measured on where they were more than one."""
        gpus = measured_on([row for points in self.lines.values() for row in points.values()])
        if len(gpus) <= 1:
            return self.crossovers()
        where = "; ".join(
            f"{gpu_words(device)} at {', '.join(times(shape) for shape in sorted({row.shape for row in rows}, key=shape_order))}"
            for device, rows in gpus.values()
        )
        kind = f" of type {self.gpu_type}" if self.gpu_type else ""
        return [*self.crossovers(), f"{self.model}'s points were measured on {len(gpus)} GPUs{kind}: {where}."]


def short_status(status: str) -> str:
    """A table cell's word for a point without a number."""
    if "out of GPU memory" in status or "out of host memory" in status:
        return "out of memory"
    if status.startswith("faulted"):
        return "faulted"
    word = status.split(" ", 1)[0].rstrip(":")
    return {"build": "refused", "not": "not profiled"}.get(word, word)


def sweeps(rows: list[ComparisonRow], verdict_list: list[Verdict], tie: float = TIE, baseline_toolchain: str | None = None) -> list[Sweep]:
    """A sweep per model (and GPU type) measured at shape points."""
    by_point = {(v.model, v.gpu_type, v.shape): v for v in verdict_list if v.fastest is not None and not v.unranked}
    out: dict[tuple[str, str | None], Sweep] = {}
    judged_on = gpu_type_judged_on(rows)
    for row in rows:
        if row.shape is None:
            continue
        gpu_type = judged_on(row)
        sweep = out.setdefault((row.model, gpu_type), Sweep(row.model, gpu_type, [], {}, {}, tie=tie, baseline=baseline_toolchain))
        if row.shape not in sweep.shapes:
            sweep.shapes.append(row.shape)
        sweep.lines.setdefault((row.variant, row.toolchain), {})[row.shape] = row
        verdict = by_point.get((row.model, gpu_type, row.shape))
        if verdict is not None and verdict.fastest is row:
            sweep.best[row.shape] = row
            sweep.tied[row.shape] = verdict.tied
    for sweep in out.values():
        sweep.shapes.sort(key=shape_order)
    return list(out.values())


@dataclass(frozen=True)
class Lead:
    """What two lines say of each other at one point: ``first`` and ``second`` in the order their
    interval decides (the faster first where one is decided faster), the ratio of the second's
    time to the first's with its interval, and the comparison's outcome (None: no interval, the
    medians alone). ``dropped``: the second left its rounds grossly slower than the first, the
    verdict's rule (pipeline/report/pairs.py, grossly_beaten) — the first is faster by that rule,
    by their medians, and no interval is read (its few rounds decide nothing by one)."""

    shape: str
    first: ComparisonRow
    second: ComparisonRow
    estimate: RatioEstimate | None
    dropped: bool = False

    @property
    def outcome(self) -> str:
        if self.dropped:
            return GROSS
        return self.estimate.outcome if self.estimate is not None else "medians only"

    @property
    def decided(self) -> bool:
        """Whether one is faster by the interval, or by the rule that dropped the other grossly
        slower (what a lead, and a change of lead, is said on)."""
        return self.outcome in ("faster", "slower", GROSS)

    @property
    def ratio(self) -> float:
        return self.estimate.ratio if self.estimate is not None else self.second.median_ms / self.first.median_ms

    def words(self, names: dict[int, str], again: bool = False) -> str:
        """ "inductor is faster than eager by 3.33× [3.27–3.40]", "eager and inductor cannot be told
        apart [0.95–1.04]", "… are the same within the tie width [0.98–1.02]", "inductor is faster
        than eager by 48.15× (eager left its rounds grossly slower, every take over 3× inductor's
        slowest: no interval)"; ``again``: the lead already named, only its size."""
        first, second = names[id(self.first)], names[id(self.second)]
        if self.dropped:
            if again:
                return f"{self.ratio:.2f}× ({GROSS}: no interval)"
            return f"{first} is faster than {second} by {self.ratio:.2f}× ({second} left its rounds {gross_rule(first)}: no interval)"
        interval = f" [{self.estimate.low:.2f}–{self.estimate.high:.2f}]" if self.estimate is not None else ""
        if self.outcome == "same":
            return f"{first} and {second} are the same within the tie width{interval}"
        if self.outcome == "ambiguous" and self.estimate is not None and not self.estimate.bounded:
            # The rounds' range, not an interval: it may exclude 1 and still decide nothing.
            ranged = f"their ratios ranged {self.estimate.low:.2f}–{self.estimate.high:.2f}"
            return f"{first} and {second} cannot be told apart in {self.estimate.rounds} rounds, too few for an interval ({ranged})"
        if self.outcome == "ambiguous":
            return f"{first} and {second} cannot be told apart{interval}"
        if self.estimate is None:
            return f"{first}'s median is {self.ratio:.2f}× below {second}'s (no interval to say how sure)"
        return f"{self.ratio:.2f}×{interval}" if again else f"{first} is faster than {second} by {self.ratio:.2f}×{interval}"


def leads(shapes: list[str], a: dict[str, ComparisonRow], b: dict[str, ComparisonRow], tie: float) -> list[Lead]:
    """Two lines at each point they share: the comparison every crossover sentence is made of
    (read at the point's level for all its pairs, pipeline/report/confidence.py); where one left
    its rounds grossly slower than the other, that, as the verdict reads it, and no comparison."""
    out = []
    for shape in shapes:
        if not (a.get(shape) and b.get(shape) and a[shape].median_ms and b[shape].median_ms):
            continue
        faster, slower = (b[shape], a[shape]) if pairs.grossly_beaten(b[shape], a[shape]) else (a[shape], b[shape])
        if pairs.grossly_beaten(faster, slower):
            out.append(Lead(shape, faster, slower, None, dropped=True))
            continue
        estimate = time_ratio(b[shape], a[shape], tie)  # B's time over A's: above 1, A is faster
        first, second = a[shape], b[shape]
        faster_b = estimate.ratio < 1 if estimate is not None else b[shape].median_ms < a[shape].median_ms
        if faster_b:
            first, second, estimate = b[shape], a[shape], estimate.inverse() if estimate is not None else None
        out.append(Lead(shape, first, second, estimate))
    return out


def _crossover(shapes: list[str], a: dict[str, ComparisonRow], b: dict[str, ComparisonRow], tie: float) -> str | None:
    """Two ways of running a variant across the points they share, in words: how they compare at
    the first and the last point (by how much one is faster, where its interval says so, or where
    the other left its rounds grossly slower, by their medians; else that they are the same or
    cannot be told apart), and where the lead changes as the sequence (the last axis) grows at
    each of the other sizes — said only between points where one is faster so at both."""
    found = leads(shapes, a, b, tie)
    if not found:
        return None
    names = {id(row): row.target for lead in found for row in (lead.first, lead.second)}
    start, end = found[0], found[-1]
    sentence = f"{start.first.variant}: {start.words(names)} at {times(start.shape)}"
    if len(found) > 1:
        same_lead = start.decided and end.decided and start.first.target == end.first.target
        sentence += f" and {end.words(names, again=True)}" if same_lead else f"; {end.words(names)}"
        sentence += f" at {times(end.shape)}"
    # Where the lead changes as the last axis (the sequence) grows, at each of the other sizes (the
    # batch; batch and frames of batch × frames × sequence): a point's other sizes are its series.
    changes = []
    held = {lead.shape: ShapeSizes.parse(lead.shape).held for lead in found}
    for series in dict.fromkeys(held.values()):
        points = [lead for lead in found if held[lead.shape] == series]
        for before, after in zip(points, points[1:]):
            if before.decided and after.decided and before.first.target != after.first.target:
                changes.append(f"{after.first.target} takes the lead between {times(before.shape)} and {times(after.shape)}")
    if changes:
        sentence += "; " + "; ".join(changes)
    return sentence + "."
