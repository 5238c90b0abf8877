"""The gates a CI job uses: the regression gate (slower than a threshold beyond the noise, against
a baseline's manifests) and the accuracy gate (each engine's own outputs against the FP32 model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.catalog.floor import THRESHOLD_FORMS, AccuracyFloor, AccuracyThreshold
from pipeline.catalog.floor import parse_accuracy_threshold as accuracy_threshold
from pipeline.manifest import EngineManifest
from pipeline.report.manifest_sources import load_baseline, load_manifests
from pipeline.report.rows import ComparisonRow
from pipeline.running.errors import PipelineError, UsageError
from pipeline.workspace import Workspace, output_folder


@dataclass
class Regression:
    engine: str
    toolchain: str
    baseline_ms: float
    current_ms: float
    change_pct: float
    ci_low_ms: float
    ci_high_ms: float
    regressed: bool


def regression_gate(current: list[EngineManifest], baseline: list[EngineManifest], fail_above_pct: float) -> list[Regression]:
    """Every engine measured in both; `regressed` when slower by more than the threshold AND the noise."""
    from pipeline.measuring.stats import median_difference_cis

    def measured(manifests):
        return {
            (m.engine, output_folder(m.toolchain or "?", m.gpu_type)): m.profile.details
            for m in manifests
            if m.profile is not None and m.profile.status == "done" and m.profile.details is not None
        }

    now, before = measured(current), measured(baseline)
    results = []
    keys = sorted(now.keys() & before.keys(), key=str)
    intervals = median_difference_cis([(now[key].per_iteration_ms, before[key].per_iteration_ms) for key in keys])
    for key, (low, high) in zip(keys, intervals):
        new, old = now[key], before[key]
        change = (new.latency_ms.median - old.latency_ms.median) / old.latency_ms.median * 100
        results.append(
            Regression(
                engine=key[0],
                toolchain=key[1] or "?",
                baseline_ms=old.latency_ms.median,
                current_ms=new.latency_ms.median,
                change_pct=change,
                ci_low_ms=low,
                ci_high_ms=high,
                regressed=change > fail_above_pct and low > 0.0,
            )  # fmt: skip
        )
    return results


def render_gate(results: list[Regression], threshold: float) -> str:
    lines = [f"Regression gate: slower than {threshold:g}% beyond the runs' noise (95% bootstrap CI of the median difference)"]
    for r in results:
        verdict = "REGRESSED" if r.regressed else ("ok" if r.change_pct <= threshold else "ok (within noise)")
        lines.append(
            f"  {verdict:<18} {r.engine:<26} {r.toolchain:<14} {r.baseline_ms:9.3f} → {r.current_ms:9.3f} ms "
            f"({r.change_pct:+6.1f}%, CI [{r.ci_low_ms:+.3f}, {r.ci_high_ms:+.3f}] ms)"
        )
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
    workspace: Workspace, toolchains: list[str] | None, baseline: str, fail_above: float, say: Callable[[str], None]
) -> None:
    """`compare --baseline`: say each engine's change against the baseline's manifests, then raise
    naming every engine that got slower than ``fail_above`` percent beyond the noise."""
    results = regression_gate(
        load_manifests(workspace.manifests_dir, toolchains), load_baseline(baseline, workspace, toolchains), fail_above
    )
    if not results:
        raise PipelineError(f"no engine was measured both now and in baseline {baseline}.", hint="compare the same engines and toolchains")
    say(render_gate(results, fail_above))
    regressed = [r for r in results if r.regressed]
    if regressed:
        names = ", ".join(f"{r.engine} on {r.toolchain} ({r.change_pct:+.1f}%)" for r in regressed)
        raise PipelineError(
            f"{len(regressed)} engine(s) got slower than {fail_above:g}% beyond the noise: {names}.",
            hint="the lines marked REGRESSED above show the medians and the confidence interval",
        )
