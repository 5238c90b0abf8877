"""The sweep, per model measured at shape points: one line per variant × toolchain, one column per
point (median ms, tokens/s or GPU memory), the verdict's choice marked (pipeline/report/verdict.py);
and the crossovers in words — where one way of running the model overtakes another as the shape
grows. Built from comparison rows only (pipeline/report/rows.py), so every format says the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.measuring.stats import RatioEstimate
from pipeline.report.confidence import time_ratio
from pipeline.report.rows import ComparisonRow, shape_order
from pipeline.report.verdict import TIE, Verdict, gpu_type_judged_on, gpu_words, measured_on, times

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
        place = {key: index for index, key in enumerate(keys)}
        # The pairs with a reference in them, in the lines' order: a reference against each line of
        # its variant, not every two lines (n² of them for a sweep over thousands of builds).
        pairs = set()
        for reference in self._references():
            for key in keys:
                if key[0] == reference[0] and key != reference:
                    pairs.add((min(place[key], place[reference]), max(place[key], place[reference])))
        for i, j in sorted(pairs):
            sentence = _crossover(self.shapes, self.lines[keys[i]], self.lines[keys[j]], self.tie)
            if sentence:
                out.append(sentence)
        return out

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
    by_point = {(v.model, v.gpu_type, v.shape): v for v in verdict_list if v.fastest is not None}
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


def _crossover(shapes: list[str], a: dict[str, ComparisonRow], b: dict[str, ComparisonRow], tie: float) -> str | None:
    """Two ways of running a variant across the points they share, in words: by how much one is
    faster at the first and the last point (the paired ratio and its interval where they were
    timed together), where the two cannot be told apart, and where the lead changes."""
    shared = [s for s in shapes if a.get(s) and b.get(s) and a[s].median_ms and b[s].median_ms]
    if not shared:
        return None
    name_a, name_b = a[shared[0]].target, b[shared[0]].target

    def lead(shape: str) -> tuple[str, str, float, str]:
        """(faster, slower, by how much, its interval in words) at a point."""
        estimate = time_ratio(b[shape], a[shape], tie)  # B's time over A's: above 1, A is faster
        if estimate is None:
            ms_a, ms_b = a[shape].median_ms, b[shape].median_ms
            return (name_a, name_b, ms_b / ms_a, "") if ms_a <= ms_b else (name_b, name_a, ms_a / ms_b, "")
        if estimate.ratio < 1:
            estimate = estimate.inverse()
            return name_b, name_a, estimate.ratio, _said(estimate)
        return name_a, name_b, estimate.ratio, _said(estimate)

    start, end = lead(shared[0]), lead(shared[-1])
    variant = a[shared[0]].variant
    if len(shared) == 1:
        return f"{variant}: {start[0]} is faster than {start[1]} by {start[2]:.2f}×{start[3]} at {times(shared[0])}."
    sentence = f"{variant}: {start[0]} is faster than {start[1]} by {start[2]:.2f}×{start[3]} at {times(shared[0])}"
    sentence += (
        f" and {end[2]:.2f}×{end[3]} at {times(shared[-1])}"
        if end[0] == start[0]
        else f"; {end[0]} is faster by {end[2]:.2f}×{end[3]} at {times(shared[-1])}"
    )
    # Where the lead changes as the sequence grows, at each batch size.
    changes = []
    batches = dict.fromkeys(s.split("x")[0] for s in shared)
    for batch in batches:
        points = [s for s in shared if s.split("x")[0] == batch]
        for before, after in zip(points, points[1:]):
            if lead(before)[0] != lead(after)[0]:
                changes.append(f"{lead(after)[0]} takes the lead between {times(before)} and {times(after)}")
    if changes:
        sentence += "; " + "; ".join(changes)
    return sentence + "."


def _said(estimate: RatioEstimate) -> str:
    """ " [2.05–2.16]" with what the interval says when it is not a clear lead: " [0.98–1.02],
    the same" or " [0.95–1.04], undecided"."""
    qualifier = {"same": ", the same within the tie width", "ambiguous": ", undecided"}.get(estimate.outcome, "")
    return f" [{estimate.low:.2f}–{estimate.high:.2f}{qualifier}]"
