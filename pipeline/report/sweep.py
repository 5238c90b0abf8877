"""The answer first, then the sweep: what every report opens with.

* **The verdict**, per model and shape point (and GPU type): the fastest engine whose own accuracy
  meets the floor, its speedup over the catalog's baseline toolchain, and every engine left out
  and why — too inaccurate, refused or failed (out of memory at that point), an untrustworthy
  measurement (noisy, busy machine, unstable).
* **The sweep**, per model measured at shape points: one line per variant × toolchain, one column
  per point (median ms, tokens/s or GPU memory), the verdict's choice marked; and the crossovers
  in words — where one way of running the model overtakes another as the shape grows.

Built from comparison rows only (pipeline/report/rows.py), so every format says the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.accuracy import AccuracyFloor, AccuracyThreshold
from pipeline.report.gates import accuracy_shortfalls
from pipeline.report.rows import ComparisonRow, shape_order

METRICS = ("ms", "tokens", "memory")
# Flags that make a row's number untrustworthy for a verdict (rows.measurement_flags words them),
# and the flag of an engine that failed its precision's own accuracy check.
UNTRUSTED = ("noisy", "busy", "throttled")
INACCURATE = "inaccurate"


def times(shape: str | None) -> str:
    return shape.replace("x", "×") if shape else ""


def line_label(row: ComparisonRow) -> str:
    return f"{row.variant} on {row.target}"


def exclusion(row: ComparisonRow, thresholds: tuple[AccuracyThreshold, ...]) -> str | None:
    """Why the verdict leaves this row out, or None when it is a candidate."""
    if row.median_ms is None:
        return row.status
    # Accuracy first: an engine below the floor is no answer even when every measurement is
    # untrustworthy (the verdict then falls back on the rows left out for their measurement alone).
    # A floor given replaces each precision's own check (its "inaccurate" flag).
    if thresholds:
        shortfalls = accuracy_shortfalls(row, thresholds) if row.accuracy_source == "measured" else []
        if shortfalls:
            return "below the accuracy floor: " + ", ".join(shortfalls)
    else:
        inaccurate = [flag for flag in row.flags if flag.startswith(INACCURATE)]
        if inaccurate:
            return inaccurate[0]
    if row.status.startswith("unstable"):
        return row.status.split(":", 1)[0] + ": its measurements disagree"
    for flag in row.flags:
        if flag.startswith(UNTRUSTED):
            return flag
    return None


@dataclass
class Verdict:
    """The answer for one model at one shape point (None: a model of one shape) and GPU type."""

    model: str
    shape: str | None
    gpu_type: str | None
    fastest: ComparisonRow | None
    # The catalog's baseline toolchain's row it is measured against (same variant where there is one).
    baseline: ComparisonRow | None
    excluded: list[tuple[ComparisonRow, str]] = field(default_factory=list)
    # Rows skipped outright (a toolchain that cannot run a variant): counted, not listed.
    skipped: list[ComparisonRow] = field(default_factory=list)
    # When every accurate measurement was untrustworthy (noisy, a busy machine): the fastest of
    # them, said with that caveat instead of no answer at all.
    untrusted: bool = False
    # The accuracy the answer had to keep (--fail-accuracy-below, the catalog's, or each precision's own check).
    floor: AccuracyFloor = AccuracyFloor()

    @property
    def speedup(self) -> float | None:
        if self.fastest is None or self.baseline is None:
            return None
        return self.baseline.median_ms / self.fastest.median_ms

    @property
    def where(self) -> str:
        parts = [self.model]
        if self.shape:
            parts.append(f"at {times(self.shape)}")
        if self.gpu_type:
            parts.append(f"on {self.gpu_type}")
        return " ".join(parts)

    def sentences(self) -> list[str]:
        """The verdict in words: the answer, then what was left out and why."""
        meeting = f" meeting {self.floor}" if self.floor.thresholds else ""
        if self.fastest is None:
            answer = f"{self.where}: no engine was measured and met the accuracy floor{f', {self.floor}' if meeting else ''}."
        else:
            row = self.fastest
            rate = f", {row.tokens_per_s:,.0f} tokens/s" if row.tokens_per_s else ""
            fastest = "no measurement can be trusted (below); the fastest of them" if self.untrusted else "fastest"
            answer = f"{self.where}: {fastest}{meeting} is {line_label(row)}, {row.median_ms:.3f} ms{rate}"
            if self.baseline is None:
                answer += " (no baseline-toolchain row to compare with)."
            elif self.baseline is row:
                answer += " — the baseline toolchain itself."
            else:
                answer += f" — {self.speedup:.2f}× {line_label(self.baseline)} ({self.baseline.median_ms:.3f} ms)."
        out = [answer]
        if self.excluded:
            out.append("Left out: " + "; ".join(f"{line_label(row)} ({why})" for row, why in self.excluded) + ".")
        if self.skipped:
            out.append(f"{len(self.skipped)} not run: the toolchain cannot run the variant (the table says why).")
        return out

    def public(self) -> dict[str, Any]:
        def named(row: ComparisonRow | None) -> dict[str, Any] | None:
            if row is None:
                return None
            return {
                "variant": row.variant,
                "toolchain": row.toolchain,
                "engine": row.engine,
                "median_ms": row.median_ms,
                "tokens_per_s": row.tokens_per_s,
            }

        return {
            "model": self.model,
            "shape": self.shape,
            "gpu_type": self.gpu_type,
            "fastest": named(self.fastest),
            "baseline": named(self.baseline),
            "speedup_over_baseline": self.speedup,
            "untrusted": self.untrusted,
            "accuracy_floor": {
                "thresholds": [
                    {"metric": "cosine" if metric == "cos" else "top1", "min": value} for metric, value in self.floor.thresholds
                ],
                "source": self.floor.source if self.floor.thresholds else "each precision's own check",
            },
            "excluded": [{"variant": r.variant, "toolchain": r.toolchain, "why": why} for r, why in self.excluded],
            "not_run": [{"variant": r.variant, "toolchain": r.toolchain, "why": r.status} for r in self.skipped],
            "text": " ".join(self.sentences()),
        }


def verdicts(rows: list[ComparisonRow], baseline_toolchain: str | None, floors: dict[str, AccuracyFloor] | None = None) -> list[Verdict]:
    """One verdict per model, shape point and GPU type, in the rows' order; each model's engines
    held to its floor in ``floors`` (none there: each precision's own check)."""
    groups: dict[tuple[str, str | None, str | None], list[ComparisonRow]] = {}
    for row in rows:
        groups.setdefault((row.model, row.gpu_type, row.shape), []).append(row)
    model_order = {model: index for index, model in enumerate(dict.fromkeys(r.model for r in rows))}
    keys = sorted(groups, key=lambda k: (model_order[k[0]], k[1] or "", shape_order(k[2])))
    out = []
    for model, gpu_type, shape in keys:
        group = groups[(model, gpu_type, shape)]
        verdict = Verdict(model, shape, gpu_type, None, None, floor=(floors or {}).get(model, AccuracyFloor()))
        candidates = []
        for row in group:
            why = exclusion(row, verdict.floor.thresholds)
            if why is None:
                candidates.append(row)
            elif row.status.startswith("skipped"):
                verdict.skipped.append(row)
            else:
                verdict.excluded.append((row, why))
        if not candidates:
            # Nothing clean: the accurate rows that only the measurement's conditions excluded.
            candidates = [row for row, why in verdict.excluded if why.startswith(UNTRUSTED) or row.status.startswith("unstable")]
            verdict.untrusted = bool(candidates)
        if candidates:
            verdict.fastest = min(candidates, key=lambda r: r.median_ms)
            bases = [r for r in group if r.toolchain == baseline_toolchain and r.median_ms is not None]
            same = [r for r in bases if r.variant == verdict.fastest.variant]
            verdict.baseline = (same or sorted(bases, key=lambda r: r.median_ms) or [None])[0]
        out.append(verdict)
    return out


# --- the sweep -----------------------------------------------------------------------------------


@dataclass
class Sweep:
    """One model (on one GPU type) across its shape points: a line per variant × toolchain."""

    model: str
    gpu_type: str | None
    shapes: list[str]
    # (variant, toolchain label) -> {shape: row}
    lines: dict[tuple[str, str], dict[str, ComparisonRow]]
    # The verdict's choice at each shape point.
    best: dict[str, ComparisonRow]

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
        return ("*" if self.best.get(shape) is row else "") + text

    def crossovers(self) -> list[str]:
        """Every two toolchains that ran the same variant, in words: by how much one is faster at
        the first and the last point they share, and where the lead changes as the sequence grows."""
        out = []
        keys = list(self.lines)
        for i, a in enumerate(keys):
            for b in keys[i + 1 :]:
                if a[0] != b[0]:
                    continue
                sentence = _crossover(self.shapes, self.lines[a], self.lines[b])
                if sentence:
                    out.append(sentence)
        return out

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
                            "status": row.status,
                            "best": self.best.get(shape) is row,
                        }
                        for shape, row in points.items()
                    },
                }
                for (variant, target), points in self.lines.items()
            ],
            "crossovers": self.crossovers(),
        }


def short_status(status: str) -> str:
    """A table cell's word for a point without a number."""
    if "out of GPU memory" in status or "out of host memory" in status:
        return "out of memory"
    word = status.split(" ", 1)[0].rstrip(":")
    return {"build": "refused", "not": "not profiled"}.get(word, word)


def sweeps(rows: list[ComparisonRow], verdict_list: list[Verdict]) -> list[Sweep]:
    """A sweep per model (and GPU type) measured at shape points."""
    best = {(v.model, v.gpu_type, v.shape): v.fastest for v in verdict_list if v.fastest is not None}
    out: dict[tuple[str, str | None], Sweep] = {}
    for row in rows:
        if row.shape is None:
            continue
        sweep = out.setdefault((row.model, row.gpu_type), Sweep(row.model, row.gpu_type, [], {}, {}))
        if row.shape not in sweep.shapes:
            sweep.shapes.append(row.shape)
        sweep.lines.setdefault((row.variant, row.toolchain), {})[row.shape] = row
        if best.get((row.model, row.gpu_type, row.shape)) is row:
            sweep.best[row.shape] = row
    for sweep in out.values():
        sweep.shapes.sort(key=shape_order)
    return list(out.values())


def _crossover(shapes: list[str], a: dict[str, ComparisonRow], b: dict[str, ComparisonRow]) -> str | None:
    shared = [s for s in shapes if a.get(s) and b.get(s) and a[s].median_ms and b[s].median_ms]
    if not shared:
        return None
    name_a, name_b = a[shared[0]].target, b[shared[0]].target

    def lead(shape: str) -> tuple[str, str, float]:
        """(faster, slower, by how much) at a point."""
        ms_a, ms_b = a[shape].median_ms, b[shape].median_ms
        return (name_a, name_b, ms_b / ms_a) if ms_a <= ms_b else (name_b, name_a, ms_a / ms_b)

    start, end = lead(shared[0]), lead(shared[-1])
    variant = a[shared[0]].variant
    if len(shared) == 1:
        return f"{variant}: {start[0]} is faster than {start[1]} by {start[2]:.2f}× at {times(shared[0])}."
    sentence = f"{variant}: {start[0]} is faster than {start[1]} by {start[2]:.2f}× at {times(shared[0])}"
    sentence += (
        f" and {end[2]:.2f}× at {times(shared[-1])}"
        if end[0] == start[0]
        else f"; {end[0]} is faster by {end[2]:.2f}× at {times(shared[-1])}"
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
