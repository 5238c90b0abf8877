"""Compare stage: put engines side by side from saved manifests. It never re-measures.

Per model, one row per variant × toolchain: median and p99 latency (GPU compute time for
TensorRT, host latency for ONNX Runtime), throughput, speedup against the toolchain's baseline
variant, the change against the first toolchain compared, engine size, build time, the accuracy
proxy, the layer-precision audit and the roofline. A difference whose bootstrap confidence
interval (of the difference of medians, from the per-iteration times) contains zero is marked not
significant ("~"): it is within the runs' own spread.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipeline.catalog import Catalog
from pipeline.errors import PipelineError, UsageError
from pipeline.manifest import EngineManifest, read_manifest
from pipeline.workspace import Workspace, output_folder

FORMATS = ("table", "md", "html", "json", "csv")


@dataclass
class ComparisonRow:
    model: str
    variant: str
    toolchain: str
    status: str  # "measured (<metric>)", or why there is no number
    # The GPU type a cluster run built and timed this engine for (manifests/<toolchain>@<gpu>/);
    # rows are compared only with rows of the same GPU type. None on a local run.
    gpu_type: str | None = None
    device: str | None = None
    gpu: str | None = None
    batch_size: int | None = None
    median_ms: float | None = None
    median_ci_ms: tuple[float, float] | None = None
    p5_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    cv: float | None = None
    images_per_s: float | None = None
    baseline: str | None = None
    speedup: float | None = None
    speedup_significant: bool | None = None
    reference_toolchain: str | None = None
    change_ms: float | None = None
    change_pct: float | None = None
    change_significant: bool | None = None
    # Speedup over the catalog's baseline toolchain (PyTorch eager) for the same model and variant.
    baseline_toolchain: str | None = None
    vs_baseline_toolchain: float | None = None
    vs_baseline_toolchain_significant: bool | None = None
    engine_mb: float | None = None
    build_s: float | None = None
    # Against the FP32 model's outputs: "measured" on the engine's own outputs, or the export's
    # "proxy" (the fake-quantized PyTorch model) where no engine ran.
    accuracy_source: str | None = None
    accuracy_cosine: float | None = None
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    # Against the evaluation images' labels (`--eval-dir` with ImageNet classes of a checkpoint).
    top1_accuracy: float | None = None
    # Measured outputs that were NaN or Inf (then there is no cosine).
    nonfinite_values: int | None = None
    audit: str | None = None
    matmul_gflops: float | None = None
    achieved_tflops: float | None = None
    peak_fraction: float | None = None
    # Why the number may not be trusted: a busy machine, a noisy run (see measurement_flags).
    flags: list[str] = field(default_factory=list)
    # What the timing included (CUDA graphs, data transfers, spin wait), where the runtime says.
    measured_with: dict[str, bool] = field(default_factory=dict)
    # Per-iteration times and layer timings, for plots and significance; not in tabular output.
    samples_ms: list[float] = field(default_factory=list, repr=False)
    layers: list[tuple[str, float]] = field(default_factory=list, repr=False)

    @property
    def engine(self) -> str:
        return f"{self.model}_{self.variant}"

    @property
    def full_status(self) -> str:
        return "; ".join([self.status, *self.flags])

    @property
    def target(self) -> str:
        """The toolchain, with the GPU type where the row has one: how tables label a row."""
        return f"{self.toolchain}@{self.gpu_type}" if self.gpu_type else self.toolchain

    def public(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("samples_ms")
        data.pop("layers")
        data["engine"] = self.engine
        return data


# --- loading ---------------------------------------------------------------------------------------


def load_manifests(manifests_dir: Path, toolchains: list[str] | None = None) -> list[EngineManifest]:
    if not manifests_dir.is_dir():
        return []
    manifests = []
    for directory in sorted(p for p in manifests_dir.iterdir() if p.is_dir() and p.name != "export"):
        if toolchains and directory.name.split("@")[0] not in toolchains:  # <toolchain>@<gpu> for cluster runs
            continue
        for path in sorted(directory.glob("*.json")):
            manifests.append(read_manifest(path))
    return manifests


def load_baseline(spec: str, workspace: Workspace, toolchains: list[str] | None) -> list[EngineManifest]:
    """Manifests from a directory (a workspace or its manifests/) or from a git ref."""
    path = Path(spec)
    if path.is_dir():
        root = path / "manifests" if (path / "manifests").is_dir() else path
        manifests = load_manifests(root, toolchains)
        if not manifests:
            raise PipelineError(f"baseline {spec} holds no engine manifests.", hint="pass the manifests/ folder of an earlier run")
        return manifests
    return _load_from_git(spec, workspace, toolchains)


def _load_from_git(ref: str, workspace: Workspace, toolchains: list[str] | None) -> list[EngineManifest]:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=workspace.root, capture_output=True, text=True)
        if result.returncode != 0:
            raise PipelineError(
                f"baseline {ref!r} is neither a directory nor a git ref with manifests: {result.stderr.strip() or 'git failed'}",
                hint="pass a manifests directory, or a branch/commit that has manifests/ committed",
            )
        return result.stdout

    listing = [p for p in git("ls-tree", "-r", "--name-only", ref, "--", "manifests/").splitlines() if p.endswith(".json")]
    manifests = []
    for name in listing:
        parts = Path(name).parts
        if len(parts) != 3 or parts[1] == "export" or (toolchains and parts[1].split("@")[0] not in toolchains):
            continue
        manifests.append(EngineManifest.model_validate_json(git("show", f"{ref}:{name}")))
    if not manifests:
        raise PipelineError(
            f"git ref {ref!r} has no engine manifests under manifests/ (they are git-ignored by default).",
            hint="commit manifests to a results branch, or pass a directory with --baseline",
        )
    return manifests


# --- rows ----------------------------------------------------------------------------------------


# A run whose coefficient of variation is above this is flagged noisy (`--noisy-cv`). ONNX Runtime
# on a quiet CPU stays within a few percent; the lent H100's noisiest PyTorch run had 17%.
NOISY_CV = 0.10
# A machine whose 1-minute load average exceeds this many runnable tasks per CPU was busy: the
# measurement shared its cores (two concurrent profiles on 2 CPUs measured ~4; one alone ~2).
BUSY_LOAD_PER_CPU = 1.5


def measurement_flags(details, noisy_cv: float = NOISY_CV) -> list[str]:
    """Why a measurement may not be trusted, from what the profile recorded; empty when none."""
    flags = []
    if details.latency_ms.cv > noisy_cv:
        flags.append(f"noisy: CV {details.latency_ms.cv:.1%} is above {noisy_cv:.0%}")
    load = details.machine_load or {}
    for when in ("start", "end"):
        facts = load.get(when) or {}
        averages, cpus = facts.get("load_average"), facts.get("cpu_count")
        if averages and cpus and averages[0] > BUSY_LOAD_PER_CPU * cpus:
            flags.append(f"busy machine: load average {averages[0]:g} on {cpus} CPUs at the {when}")
            break
    for when in ("start", "end"):
        others = (load.get(when) or {}).get("gpu_processes") or []
        if others:
            names = ", ".join(sorted({f"{p['name']} (pid {p['pid']})" for p in others}))
            flags.append(f"busy GPU: other processes used it at the {when}: {names}")
            break
    return flags


def build_rows(
    catalog: Catalog, manifests: list[EngineManifest], toolchain_order: list[str] | None = None, noisy_cv: float = NOISY_CV
) -> list[ComparisonRow]:
    import numpy as np

    from pipeline.report.roofline import peak_tflops
    from pipeline.stats import bootstrap_median_ci

    rows: list[ComparisonRow] = []
    flops_by_model: dict[tuple[str, int], float] = {}
    for m in manifests:
        audit = m.export.details.onnx_audit if m.export and m.export.details else {}
        if audit.get("matmul_flops") and m.export.details.input_shape:
            flops_by_model[(m.model, m.export.details.input_shape[0])] = audit["matmul_flops"]

    for m in manifests:
        row = ComparisonRow(model=m.model, variant=m.variant, toolchain=m.toolchain or "?", gpu_type=m.gpu_type, status="not profiled")
        if m.build is not None and m.build.status == "skipped":
            row.status = f"skipped: {m.build.reason}"
        elif m.build is not None and m.build.status == "failed":
            row.status = f"build refused: {m.build.reason}"
            row.build_s = m.build.duration_s
        elif m.profile is not None and m.profile.status == "skipped":
            row.status = f"skipped: {m.profile.reason}"
        if m.build is not None and m.build.status == "done":
            engine = next((a for a in m.build.outputs if a.role == "engine"), None)
            row.engine_mb = engine.size_bytes / 2**20 if engine else None
            row.build_s = m.build.duration_s
            details = m.build.details
            audit = details.precision_audit if details is not None else None
            if audit:
                row.audit = audit.get("warning") or ("ok: " + ", ".join(f"{k} {v}" for k, v in sorted(audit["output_types"].items())))
        if m.export is not None and m.export.details is not None and m.export.details.accuracy:
            row.accuracy_source = "proxy"
            row.accuracy_cosine = m.export.details.accuracy["cosine_similarity"]
            row.top1_agreement = m.export.details.accuracy["top1_agreement"]
        if m.profile is not None and m.profile.status == "done" and m.profile.details is not None:
            d = m.profile.details
            samples = np.asarray(d.per_iteration_ms)
            row.status = f"measured ({d.metric})"
            row.device = d.device
            row.gpu = d.gpu or ((d.trtexec or {}).get("device", {}).get("name") if d.trtexec else None)
            row.batch_size = d.batch_size
            row.median_ms = d.latency_ms.median
            row.median_ci_ms = bootstrap_median_ci(samples)
            row.p5_ms, row.p95_ms = (float(v) for v in np.percentile(samples, [5, 95]))
            row.p99_ms = d.latency_ms.p99
            row.cv = d.latency_ms.cv
            row.images_per_s = d.images_per_s
            row.samples_ms = list(d.per_iteration_ms)
            row.flags = measurement_flags(d, noisy_cv)
            if d.accuracy:
                row.accuracy_source = "measured"
                row.accuracy_cosine = d.accuracy["cosine_similarity"]
                row.top1_agreement = d.accuracy["top1_agreement"]
                row.top5_agreement = d.accuracy.get("top5_agreement")
                row.top1_accuracy = d.accuracy.get("top1_accuracy")
                row.nonfinite_values = d.accuracy.get("nonfinite_values")
                if d.accuracy.get("warning"):
                    row.flags.append(f"inaccurate: {d.accuracy['warning']}")
            row.measured_with = dict(d.measured_with)
            row.layers = _layer_times(d.trtexec)
            flops = flops_by_model.get((m.model, d.batch_size))
            if flops:
                row.matmul_gflops = flops / 1e9
                row.achieved_tflops = flops / (row.median_ms / 1000.0) / 1e12
                peak = peak_tflops(row.gpu, m.precision)
                row.peak_fraction = row.achieved_tflops / peak if peak else None
        rows.append(row)

    _speedups(catalog, rows)
    _toolchain_changes(rows, toolchain_order)
    if catalog.baseline_toolchain:
        _against_baseline_toolchain(rows, catalog.baseline_toolchain)
    variant_order = {name: i for i, name in enumerate(catalog.variants)}
    chain_order = {name: i for i, name in enumerate(toolchain_order or sorted({r.toolchain for r in rows}))}
    rows.sort(key=lambda r: (r.model, variant_order.get(r.variant, len(variant_order)), r.variant, chain_order.get(r.toolchain, 99), r.gpu_type or ""))
    return rows


def _layer_times(trtexec: dict | None) -> list[tuple[str, float]]:
    if not trtexec:
        return []
    profile = trtexec.get("exported_profile") or {}
    layers = [(l["name"], l["average_ms"]) for l in profile.get("layers", [])]
    if not layers:
        layers = [(l["name"], l["average_ms"]) for l in ((trtexec.get("profile") or {}).get("layers") or [])]
    return layers


def _speedups(catalog: Catalog, rows: list[ComparisonRow]) -> None:
    from pipeline.stats import median_difference_ci

    measured = {(r.model, r.toolchain, r.gpu_type, r.variant): r for r in rows if r.median_ms}
    for row in rows:
        if row.median_ms is None:
            continue
        spec = catalog.toolchains.get(row.toolchain)
        for name in spec.baselines if spec else ("fp16", "fp32"):
            base = measured.get((row.model, row.toolchain, row.gpu_type, name))
            if base is not None:
                row.baseline = name
                row.speedup = base.median_ms / row.median_ms
                if base is not row:
                    low, high = median_difference_ci(row.samples_ms, base.samples_ms)
                    row.speedup_significant = not (low <= 0.0 <= high)
                break


def _toolchain_changes(rows: list[ComparisonRow], order: list[str] | None) -> None:
    from pipeline.stats import median_difference_ci

    chains = order or sorted({r.toolchain for r in rows if r.median_ms})
    if len(chains) < 2:
        return
    reference = chains[0]
    by_key = {(r.model, r.variant, r.toolchain, r.gpu_type): r for r in rows if r.median_ms}
    for row in rows:
        ref = by_key.get((row.model, row.variant, reference, row.gpu_type))
        if row.median_ms is None or ref is None or row.toolchain == reference:
            continue
        row.reference_toolchain = reference
        differ = [f"{key} {'on' if row.measured_with[key] else 'off'} here, {'on' if ref.measured_with[key] else 'off'} there" for key in sorted(row.measured_with.keys() & ref.measured_with.keys()) if row.measured_with[key] != ref.measured_with[key]]
        if differ:
            row.flags.append(f"measured differently from {reference}: {', '.join(differ)}")
        row.change_ms = row.median_ms - ref.median_ms
        row.change_pct = row.change_ms / ref.median_ms * 100
        low, high = median_difference_ci(row.samples_ms, ref.samples_ms)
        row.change_significant = not (low <= 0.0 <= high)


def _against_baseline_toolchain(rows: list[ComparisonRow], baseline: str) -> None:
    from pipeline.stats import median_difference_ci

    measured = {(r.model, r.variant, r.batch_size, r.gpu_type): r for r in rows if r.median_ms and r.toolchain == baseline}
    for row in rows:
        base = measured.get((row.model, row.variant, row.batch_size, row.gpu_type))
        if row.median_ms is None or base is None:
            continue
        row.baseline_toolchain = baseline
        row.vs_baseline_toolchain = base.median_ms / row.median_ms
        if base is not row:
            low, high = median_difference_ci(row.samples_ms, base.samples_ms)
            row.vs_baseline_toolchain_significant = not (low <= 0.0 <= high)


# --- regression gate -------------------------------------------------------------------------------


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
                engine=key[0], toolchain=key[1] or "?", baseline_ms=old.latency_ms.median, current_ms=new.latency_ms.median,
                change_pct=change, ci_low_ms=low, ci_high_ms=high, regressed=change > fail_above_pct and low > 0.0,
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

def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _marked(value: float | None, significant: bool | None, text: str) -> str:
    if value is None:
        return "–"
    return ("" if significant in (None, True) else "~") + text


def _roofline(row: ComparisonRow) -> str:
    if row.achieved_tflops is None:
        return "–"
    return f"{row.achieved_tflops:.3g}" + (f" ({row.peak_fraction:.0%})" if row.peak_fraction is not None else "")


def _change(row: ComparisonRow) -> str:
    if row.change_pct is None:
        return "–"
    return ("" if row.change_significant else "~") + f"{row.change_pct:+.1f}% ({row.change_ms:+.3f} ms) vs {row.reference_toolchain}"


def _accuracy(row: ComparisonRow, text: str) -> str:
    if row.accuracy_source == "measured" and row.nonfinite_values:
        return "NaN/Inf"
    return f"{text} (proxy)" if row.accuracy_source == "proxy" and text != "–" else text


@dataclass(frozen=True)
class Column:
    """One column of the comparison: its name for --columns, its header, and how a row fills it."""

    key: str
    header: str
    cell: Callable[[ComparisonRow], str]
    # Words, left-aligned, that may wrap in a narrow terminal; numbers are never wrapped or cut.
    text: bool = False
    # The header in a compact table, on two lines where that saves width.
    short_header: str | None = None


COLUMNS = (
    Column("engine", "engine", lambda r: r.engine, text=True),
    Column("variant", "variant", lambda r: r.variant, text=True),
    Column("toolchain", "toolchain", lambda r: r.target, text=True),
    Column("median", "median ms", lambda r: _fmt(r.median_ms, ".3f")),
    Column("p99", "p99 ms", lambda r: _fmt(r.p99_ms, ".3f")),
    Column("cv", "CV", lambda r: _fmt(r.cv * 100 if r.cv is not None else None, ".1f", "%")),
    Column("img/s", "img/s", lambda r: _fmt(r.images_per_s, ".1f")),
    Column("speedup", "speedup", lambda r: _marked(r.speedup, r.speedup_significant, f"{r.speedup or 0:.2f}x vs {r.baseline}"), text=True),
    Column(
        "vs-baseline-toolchain",
        "vs baseline toolchain",
        lambda r: _marked(r.vs_baseline_toolchain, r.vs_baseline_toolchain_significant, f"{r.vs_baseline_toolchain or 0:.2f}x vs {r.baseline_toolchain}"),
        text=True,
        short_header="vs baseline\ntoolchain",
    ),
    Column("vs-ref-toolchain", "vs ref toolchain", _change, text=True, short_header="vs ref\ntoolchain"),
    Column("engine-mb", "engine MB", lambda r: _fmt(r.engine_mb, ".1f")),
    Column("build-s", "build s", lambda r: _fmt(r.build_s, ".1f")),
    Column("accuracy", "vs FP32 cos", lambda r: _accuracy(r, _fmt(r.accuracy_cosine, ".4f")), short_header="cos vs\nFP32"),
    Column("top1", "top-1 vs FP32", lambda r: _accuracy(r, _fmt(r.top1_agreement * 100 if r.top1_agreement is not None else None, ".0f", "%")), short_header="top-1"),
    Column("top1-acc", "top-1 acc (labels)", lambda r: _fmt(r.top1_accuracy * 100 if r.top1_accuracy is not None else None, ".1f", "%")),
    Column("audit", "layer audit", lambda r: r.audit or "–", text=True),
    Column("tflops", "TFLOP/s (peak %)", _roofline, short_header="TFLOP/s\n(peak %)"),
    Column("status", "status", lambda r: r.full_status, text=True),
)
COLUMNS_BY_KEY = {column.key: column for column in COLUMNS}
# Every column: files (markdown, HTML) and wide terminals.
WIDE = tuple(c for c in COLUMNS if c.key != "variant")
# Narrower sets, tried in turn when every column does not fit (NARROW, with the accuracy, fits about
# 95 columns). The model is the table's title; the speedups' references and the status's details
# are notes under it. COMPACT fits 80 columns.
MEDIUM = ("variant", "toolchain", "median", "p99", "cv", "img/s", "speedup", "vs-baseline-toolchain", "vs-ref-toolchain", "accuracy", "top1", "status")
NARROW = ("variant", "toolchain", "median", "p99", "img/s", "speedup", "accuracy", "top1", "status")
COMPACT = ("variant", "toolchain", "median", "p99", "img/s", "speedup", "status")
HEADERS = tuple(c.header for c in WIDE)


def _cells(row: ComparisonRow) -> tuple[str, ...]:
    return tuple(column.cell(row) for column in WIDE)


def parse_columns(text: str) -> tuple[str, ...]:
    """`--columns median,p99,status` → column keys, checked (engine and toolchain always lead)."""
    keys = [key.strip() for key in text.split(",") if key.strip()]
    unknown = [key for key in keys if key not in COLUMNS_BY_KEY]
    if unknown or not keys:
        raise UsageError(
            f"unknown column(s) {', '.join(map(repr, unknown)) or '(none given)'} for --columns.",
            hint=f"choose from {', '.join(COLUMNS_BY_KEY)}",
        )
    lead = [] if {"engine", "variant"} & set(keys) else ["variant"]
    return tuple(dict.fromkeys([*lead, *([] if "toolchain" in keys else ["toolchain"]), *keys]))


def render_markdown(rows: list[ComparisonRow]) -> str:
    out = []
    for model in dict.fromkeys(r.model for r in rows):
        out.append(f"### {model}\n")
        out.append("| " + " | ".join(HEADERS) + " |")
        out.append("|" + "|".join("---" for _ in HEADERS) + "|")
        for row in (r for r in rows if r.model == model):
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(row)) + " |")
        out.append("")
    out.append("`~`: within the runs' own spread (95% bootstrap CI of the median difference contains 0).")
    return "\n".join(out) + "\n"


class _Notes:
    """Numbered notes under a compact table: one per distinct text, in order of first use."""

    def __init__(self):
        self.texts: dict[str, int] = {}

    def mark(self, text: str) -> str:
        number = self.texts.setdefault(text, len(self.texts) + 1)
        return f"[{number}]"

    def lines(self) -> list[str]:
        return [f"[{n}] {text}" for text, n in self.texts.items()]


def _compact_status(row: ComparisonRow, notes: _Notes) -> str:
    word = row.status.split(" ", 1)[0].rstrip(":")
    word = {"build": "refused", "not": "not profiled"}.get(word, word)
    for kind in ("inaccurate", "busy", "noisy", "measured differently"):
        if any(flag.startswith(kind) for flag in row.flags):
            word = "differs" if kind.startswith("measured") else kind
            break
    return f"{word} {notes.mark(row.full_status)}"


def render_table(rows: list[ComparisonRow], width: int, columns: tuple[str, ...] | None = None, wide: bool = False):
    """The comparison for a terminal ``width`` columns wide, every number whole.

    Every column when they fit (or with ``wide``, at whatever width that takes), else the first
    of MEDIUM, NARROW and COMPACT that fits; ``columns`` chooses them. Long texts wrap; numbers
    and names are never cut.
    """
    from rich.console import Group

    if columns is None and not wide:
        everything = _tables(rows, WIDE, compact=False)
        if _fits(everything, width):
            return everything
        for keys in (MEDIUM, NARROW):
            tables = _tables(rows, tuple(COLUMNS_BY_KEY[key] for key in keys), compact=True)
            if _fits(tables, width):
                return tables
        columns = COMPACT
    chosen = tuple(COLUMNS_BY_KEY[key] for key in columns) if columns else WIDE
    return _tables(rows, chosen, compact=bool(columns)) or Group()


def _fits(tables, width: int) -> bool:
    """Whether every table's natural width (long texts wrapped at WRAP_AT) fits in ``width``."""
    import io

    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    console = Console(file=io.StringIO(), width=10_000)
    return all(Measurement.get(console, console.options, part).maximum <= width for part in tables.renderables if isinstance(part, Table))


# Long texts (a skip reason, the layer audit) wrap at this width in a wide table.
WRAP_AT = 36


def _tables(rows: list[ComparisonRow], columns: tuple[Column, ...], compact: bool):
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts = []
    for model in dict.fromkeys(r.model for r in rows):
        model_rows = [r for r in rows if r.model == model]
        notes = _Notes() if compact else None
        table = Table(
            title=f"{model}: medians of per-iteration latency",
            box=box.SIMPLE_HEAD,
            collapse_padding=True,
            pad_edge=False,
            title_justify="left",
        )
        for column in columns:
            cells = [_cell(column, row, notes) for row in model_rows]
            header = (column.short_header or column.header) if compact else column.header
            if column.key in ("status", "audit"):
                table.add_column(header, justify="left", overflow="fold", max_width=None if compact else WRAP_AT)
            elif column.text:
                table.add_column(header, justify="left", no_wrap=True)
            else:
                widest = max([*map(len, header.splitlines()), *map(len, cells)])
                table.add_column(header, justify="right", no_wrap=True, min_width=widest)
        for row in model_rows:
            table.add_row(*(_cell(column, row, notes) for column in columns), style=None if row.median_ms is not None else "dim")
        parts.append(table)
        footer = ["~ = within the runs' own spread"]
        if notes is not None:
            footer += _reference_notes(model_rows, {c.key for c in columns})
        parts.append(Text("\n".join(footer + (notes.lines() if notes else [])), style="dim"))
        parts.append(Text(""))
    return Group(*parts) if parts else None


def _reference_notes(rows: list[ComparisonRow], keys: set[str]) -> list[str]:
    """What the speedup columns of a compact table are measured against (named in the cells of a wide one)."""
    notes = []
    if "speedup" in keys:
        bases: dict[str, list[str]] = {}
        for row in rows:
            if row.baseline and row.toolchain not in bases.get(row.baseline, []):
                bases.setdefault(row.baseline, []).append(row.toolchain)
        if len(bases) == 1:
            notes.append(f"speedup: against the {next(iter(bases))} variant of the same toolchain")
        elif bases:
            notes.append("speedup: against the toolchain's " + "; ".join(f"{b} variant ({', '.join(t)})" for b, t in bases.items()))
    reference = next((r.baseline_toolchain for r in rows if r.baseline_toolchain), None)
    if "vs-baseline-toolchain" in keys and reference:
        notes.append(f"vs baseline toolchain: speedup over {reference}, same variant")
    reference = next((r.reference_toolchain for r in rows if r.reference_toolchain), None)
    if "vs-ref-toolchain" in keys and reference:
        notes.append(f"vs ref toolchain: change against {reference}, same variant")
    if {"accuracy", "top1"} & keys and any(r.accuracy_source for r in rows):
        notes.append("cos, top-1: the engine's own outputs against the FP32 PyTorch model's on the reference batch")
        if any(r.accuracy_source == "proxy" for r in rows):
            notes.append("*: accuracy proxy (the fake-quantized PyTorch model), where no engine's outputs were checked")
    return notes


def _cell(column: Column, row: ComparisonRow, notes: _Notes | None) -> str:
    """A cell of a wide table, or its short form in a compact one (references go in the notes)."""
    if notes is None:
        return column.cell(row)
    if column.key == "status":
        return _compact_status(row, notes)
    if column.key == "speedup":
        return _marked(row.speedup, row.speedup_significant, f"{row.speedup or 0:.2f}x")
    if column.key == "vs-baseline-toolchain":
        return _marked(row.vs_baseline_toolchain, row.vs_baseline_toolchain_significant, f"{row.vs_baseline_toolchain or 0:.2f}x")
    if column.key in ("accuracy", "top1") and row.accuracy_source == "proxy" and row.accuracy_cosine is not None:
        return column.cell(row).replace(" (proxy)", "*")  # the note under the table says what * is
    if column.key == "vs-ref-toolchain" and row.change_pct is not None:
        return ("" if row.change_significant else "~") + f"{row.change_pct:+.1f}%"
    return column.cell(row)


def render_json(rows: list[ComparisonRow]) -> str:
    return json.dumps([row.public() for row in rows], indent=2) + "\n"


def render_csv(rows: list[ComparisonRow]) -> str:
    buffer = io.StringIO()
    fields = list(rows[0].public().keys()) if rows else []
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    for row in rows:
        data = row.public()
        data["median_ci_ms"] = "" if data["median_ci_ms"] is None else f"{data['median_ci_ms'][0]:.6f}..{data['median_ci_ms'][1]:.6f}"
        writer.writerow(data)
    return buffer.getvalue()


def compare(
    catalog: Catalog,
    workspace: Workspace,
    toolchains: list[str] | None,
    fmt: str,
    models: list[str] | None = None,
    width: int = 200,
    columns: tuple[str, ...] | None = None,
    wide: bool = False,
    noisy_cv: float = NOISY_CV,
    gpu_types: list[str] | None = None,
):
    """Rows plus their rendering in ``fmt`` (a rich renderable for "table", at ``width``
    columns, text otherwise)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}.", hint=f"use one of {', '.join(FORMATS)}")
    for name in toolchains or []:
        catalog.toolchain(name)
    for name in models or []:
        catalog.model(name)
    manifests = [m for m in load_manifests(workspace.manifests_dir, toolchains) if not models or m.model in models]
    if gpu_types:
        have = sorted({m.gpu_type for m in manifests if m.gpu_type})
        unknown = [t for t in gpu_types if t not in have]
        if unknown:
            raise UsageError(
                f"no engine was built for {', '.join(unknown)}; the GPU types measured here are: {', '.join(have) or 'none (no cluster run chose one)'}.",
                hint="GPU types come from cluster runs (`--cluster … --gpu TYPE`)",
            )
        manifests = [m for m in manifests if m.gpu_type in gpu_types]
    rows = build_rows(catalog, manifests, toolchains, noisy_cv)
    if not rows:
        raise PipelineError(
            f"no engine manifests under {workspace.manifests_dir}" + (f" for {', '.join(toolchains)}" if toolchains else "") + ".",
            hint="run `pipeline run` (or `make demo`) first",
        )
    if fmt == "md":
        return rows, render_markdown(rows)
    if fmt == "json":
        return rows, render_json(rows)
    if fmt == "csv":
        return rows, render_csv(rows)
    if fmt == "html":
        from pipeline.report.html import render_html

        return rows, render_html(rows, manifests)
    return rows, render_table(rows, width, columns, wide)


def write_output(text: str, out: Path) -> None:
    from pipeline.artifacts import atomic_write_text

    atomic_write_text(out, text)
