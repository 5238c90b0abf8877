"""The gates a CI job uses: the regression gate (slower than a threshold beyond the noise, against
a baseline's manifests) and the accuracy gate (each engine's own outputs against the FP32 model).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import UsageError
from pipeline.manifest import EngineManifest
from pipeline.report.rows import ComparisonRow
from pipeline.workspace import output_folder


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
    from pipeline.stats import median_difference_ci

    def measured(manifests):
        return {
            (m.engine, output_folder(m.toolchain or "?", m.gpu_type)): m.profile.details
            for m in manifests
            if m.profile is not None and m.profile.status == "done" and m.profile.details is not None
        }

    now, before = measured(current), measured(baseline)
    results = []
    for key in sorted(now.keys() & before.keys(), key=str):
        new, old = now[key], before[key]
        change = (new.latency_ms.median - old.latency_ms.median) / old.latency_ms.median * 100
        low, high = median_difference_ci(new.per_iteration_ms, old.per_iteration_ms)
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


def parse_accuracy_threshold(text: str) -> tuple[str, float]:
    """`--fail-accuracy-below 0.99` (cosine), `cos=0.99` or `top1=0.95` → (metric, threshold)."""
    metric, _, value = text.rpartition("=")
    metric = {"": "cos", "cos": "cos", "cosine": "cos", "top1": "top1", "top-1": "top1"}.get(metric.strip().lower())
    try:
        threshold = float(value)
    except ValueError:
        threshold = None
    if metric is None or threshold is None or not 0.0 <= threshold <= 1.0:
        raise UsageError(
            f"--fail-accuracy-below {text!r} is not a threshold.",
            hint="give a cosine similarity or a top-1 agreement between 0 and 1: 0.99, cos=0.99 or top1=0.95",
        )
    return metric, threshold


def accuracy_gate(rows: list[ComparisonRow], thresholds: list[tuple[str, float]]) -> tuple[int, list[str]]:
    """(engines checked, failures): every engine whose own measured accuracy is below a threshold.
    NaN or Inf outputs fail every threshold; the export's proxy is not an engine's accuracy."""
    measured = [r for r in rows if r.accuracy_source == "measured"]
    failures = []
    for row in measured:
        for metric, threshold in thresholds:
            value = row.accuracy_cosine if metric == "cos" else row.top1_agreement
            if row.nonfinite_values:
                failures.append(f"{row.engine} on {row.target}: {row.nonfinite_values} NaN/Inf outputs")
                break
            if value is None or value < threshold:
                shown = "none" if value is None else (f"{value:.4f}" if metric == "cos" else f"{value:.0%}")
                failures.append(f"{row.engine} on {row.target}: {'cosine' if metric == 'cos' else 'top-1'} {shown} < {threshold:g}")
    return len(measured), failures


# --- rendering -----------------------------------------------------------------------------------
