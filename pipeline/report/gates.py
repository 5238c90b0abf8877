"""The gates a CI job uses: the regression gate (slower than a threshold beyond the noise, against
a baseline's manifests) and the accuracy gate (each engine's own outputs against the FP32 model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.catalog.floor import THRESHOLD_FORMS, AccuracyFloor, AccuracyThreshold
from pipeline.catalog.floor import parse_accuracy_threshold as accuracy_threshold
from pipeline.catalog.shape import shown
from pipeline.manifest import EngineManifest
from pipeline.measuring.stats import median
from pipeline.report.flags import UNTRUSTED
from pipeline.report.manifest_sources import earlier_builds_words, load_baseline, load_manifests
from pipeline.report.row_times import attach_timings, take_runs
from pipeline.report.rows import ComparisonRow, row_of
from pipeline.running.errors import PipelineError, UsageError
from pipeline.workspace import Workspace, output_folder


@dataclass
class Regression:
    engine: str
    toolchain: str
    shape: str | None
    baseline_ms: float
    current_ms: float
    change_pct: float
    ci_low_ms: float
    ci_high_ms: float
    regressed: bool
    # What the interval was read from: "takes" (each take's median, one figure a take: its runs
    # share the host and clock, docs/tails.md) or "runs" (a measurement not timed in takes).
    samples: str = "runs"
    # Why the pair is not gated (a measurement the report does not trust, another batch); None: gated.
    not_gated: str | None = None


# A take median per round: fewer than this on either side and the interval is read from the runs.
MIN_TAKES = 6


def regression_gate(
    current: list[EngineManifest], baseline: list[EngineManifest], fail_above_pct: float, models: list[str] | None = None
) -> list[Regression]:
    """Every engine measured in both, at each shape point; `regressed` when slower by more than the
    threshold AND the noise, of a measurement the report trusts on both sides at the same batch."""
    from pipeline.measuring.bootstrap import median_difference_cis

    now, before = _measured(current, models), _measured(baseline, models)
    keys = sorted(now.keys() & before.keys(), key=str)
    series = [_samples(now[key], before[key]) for key in keys]
    intervals = median_difference_cis([(new, old) for new, old, _ in series])
    results = []
    for key, (low, high), (new_samples, old_samples, samples) in zip(keys, intervals, series):
        new, old = now[key][0], before[key][0]
        # The medians the interval is of: the takes' (a row's median where timed in rounds) or,
        # below MIN_TAKES, the runs', whose median can lie elsewhere (docs/regression-gate.md).
        current_ms, baseline_ms = median(new_samples), median(old_samples)
        change = (current_ms - baseline_ms) / baseline_ms * 100
        not_gated = _not_gated(new, old)
        results.append(
            Regression(
                engine=key[0],
                toolchain=key[1] or "?",
                shape=key[2],
                baseline_ms=baseline_ms,
                current_ms=current_ms,
                change_pct=change,
                ci_low_ms=low,
                ci_high_ms=high,
                regressed=not_gated is None and change > fail_above_pct and low > 0.0,
                samples=samples,
                not_gated=not_gated,
            )  # fmt: skip
        )
    return results


def _measured(manifests: list[EngineManifest], models: list[str] | None) -> dict[tuple, tuple[ComparisonRow, list[float]]]:
    """The rows measured, by engine, toolchain folder (and GPU type) and shape point: read as
    compare reads them (a value it cannot use is the same one-line error), their runs kept and
    the median of each of its takes beside it."""
    out = {}
    for m in manifests:
        if m.profile is None or m.profile.status != "done" or m.profile.details is None or (models and m.model not in models):
            continue
        row = row_of(m)
        attach_timings(row, m)
        if row.median_ms and row.samples_ms:
            takes = [median(runs) for runs in take_runs(row.samples_ms, m.profile.details.rounds) if runs]
            out[(m.engine, output_folder(m.toolchain or "?", m.gpu_type), m.shape)] = (row, takes)
    return out


def _samples(new: tuple[ComparisonRow, list[float]], old: tuple[ComparisonRow, list[float]]) -> tuple[list[float], list[float], str]:
    """What the noise is read from: the takes' medians where both were timed in enough takes (a
    take's runs share its host and clock, and count about as one: docs/tails.md), else every run."""
    (new_row, new_takes), (old_row, old_takes) = new, old
    if len(new_takes) >= MIN_TAKES and len(old_takes) >= MIN_TAKES:
        return new_takes, old_takes, "takes"
    return new_row.samples_ms, old_row.samples_ms, "runs"


def _not_gated(new: ComparisonRow, old: ComparisonRow) -> str | None:
    """Why a change between the two says nothing of the engine: another batch, or a measurement the
    report leaves out of its answer for its conditions (busy, throttled, host slowed)."""
    if new.batch_size != old.batch_size:
        return f"batch {old.batch_size} then, {new.batch_size} now"
    for when, row in (("now", new), ("then", old)):
        why = next((flag for flag in row.flags if flag.startswith(UNTRUSTED)), None)
        if why is not None:
            return f"{why.split(':')[0]} {when}"
    return None


def render_gate(results: list[Regression], threshold: float) -> str:
    lines = [f"Regression gate: slower than {threshold:g}% beyond the noise (95% bootstrap CI of the median difference)"]
    for r in results:
        verdict = "REGRESSED" if r.regressed else ("ok" if r.change_pct <= threshold else "ok (within noise)")
        if r.not_gated is not None:
            verdict = "not gated"
        name = r.engine + (f" at {shown(r.shape)}" if r.shape else "")
        line = (
            f"  {verdict:<18} {name:<26} {r.toolchain:<14} {r.baseline_ms:9.3f} → {r.current_ms:9.3f} ms "
            f"({r.change_pct:+6.1f}%, CI [{r.ci_low_ms:+.3f}, {r.ci_high_ms:+.3f}] ms, from the {r.samples})"
        )
        lines.append(line + (f": {r.not_gated}" if r.not_gated else ""))
    return "\n".join(lines) + "\n"


def parse_accuracy_threshold(text: str) -> AccuracyThreshold:
    """`--fail-accuracy-below 0.99` (cosine), `cos=0.99` or `top1=0.95` → (metric, threshold)."""
    try:
        return accuracy_threshold(text)
    except ValueError as exc:
        raise UsageError(f"--fail-accuracy-below {text!r} is not a threshold.", hint=f"give {THRESHOLD_FORMS}") from exc


def accuracy_gate(rows: list[ComparisonRow], thresholds: list[AccuracyThreshold]) -> tuple[int, list[str]]:
    """(engines checked, failures): every engine whose own measured accuracy is below a threshold.
    NaN or Inf outputs fail every threshold; the export's proxy is not an engine's accuracy."""
    measured = [r for r in rows if r.accuracy_source == "measured"]
    failures = []
    for row in measured:
        at = f" at {row.shape}" if row.shape else ""
        failures += [f"{row.engine} on {row.target}{at}: {shortfall}" for shortfall in accuracy_shortfalls(row, thresholds)]
    return len(measured), failures


def accuracy_shortfalls(row: ComparisonRow, thresholds: list[AccuracyThreshold]) -> list[str]:
    """Each threshold the row's own measured accuracy falls below ("cosine 0.9712 < 0.99")."""
    if row.nonfinite_values:
        return [f"{row.nonfinite_values} NaN/Inf outputs"]
    shortfalls = []
    for metric, threshold in thresholds:
        value = row.accuracy_cosine if metric == "cos" else row.top1_agreement
        if value is None and metric != "cos" and row.accuracy_cosine is not None:
            continue  # no classes to agree on (a transformer's hidden states): cosine is the check
        if value is None or value < threshold:
            shown = "none" if value is None else (f"{value:.4f}" if metric == "cos" else f"{value:.0%}")
            shortfalls.append(f"{'cosine' if metric == 'cos' else 'top-1'} {shown} < {threshold:g}")
    return shortfalls


# --- rendering -----------------------------------------------------------------------------------


def check_accuracy(rows: list[ComparisonRow], thresholds: list[AccuracyThreshold], say: Callable[[str], None]) -> None:
    """`compare --fail-accuracy-below`: say how many engines pass, then raise naming every one that does not."""
    checked, failures = accuracy_gate(rows, thresholds)
    if not checked:
        raise PipelineError(
            "--fail-accuracy-below: no engine in the comparison had its own outputs checked.",
            hint="profile the engines (`pipeline profile`); the accuracy proxy of an export is not an engine's accuracy",
        )
    say(
        f"Accuracy gate ({AccuracyFloor(tuple(thresholds))}): {checked - len({f.split(':')[0] for f in failures})} of {checked} engines pass"
    )
    if failures:
        raise PipelineError(
            f"{len(failures)} accuracy check(s) failed: " + "; ".join(failures) + ".",
            hint="the engines' own outputs against the FP32 model on the reference batch; `--format json` has every figure",
        )


def check_regressions(
    workspace: Workspace,
    toolchains: list[str] | None,
    baseline: str,
    fail_above: float,
    say: Callable[[str], None],
    models: list[str] | None = None,
    gpu_types: list[str] | None = None,
) -> None:
    """`compare --baseline`: say each engine's change against the baseline's manifests, then raise
    naming every engine that got slower than ``fail_above`` percent beyond the noise. ``models``,
    ``gpu_types``: only those, as the comparison shows them."""

    def chosen(manifests: list[EngineManifest]) -> list[EngineManifest]:
        return [m for m in manifests if not gpu_types or m.gpu_type in gpu_types]

    current = chosen(load_manifests(workspace.manifests_dir, toolchains))  # what it leaves out, compare said

    def baseline_left_out(paths: list[Path]) -> None:
        say(f"baseline {baseline}: {earlier_builds_words(paths)}; not gated\n")

    results = regression_gate(current, chosen(load_baseline(baseline, workspace, toolchains, baseline_left_out)), fail_above, models)
    if not results:
        raise PipelineError(f"no engine was measured both now and in baseline {baseline}.", hint="compare the same engines and toolchains")
    say(render_gate(results, fail_above))
    regressed = [r for r in results if r.regressed]
    if regressed:
        names = ", ".join(
            f"{r.engine}{f' at {shown(r.shape)}' if r.shape else ''} on {r.toolchain} ({r.change_pct:+.1f}%)" for r in regressed
        )
        raise PipelineError(
            f"{len(regressed)} engine(s) got slower than {fail_above:g}% beyond the noise: {names}.",
            hint="the lines marked REGRESSED above show the medians and the confidence interval",
        )
