"""Comparison rows: one per profiled engine (variant × toolchain × GPU type), built from the saved
manifests, with the measurement's flags. What each row is compared by, from the other rows
(speedups and their significance), is filled in by row_comparisons.py.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any

from pipeline.catalog import ShapeSizes
from pipeline.manifest import EngineManifest
from pipeline.measuring.pace import HOST_LATENCY
from pipeline.report.energy import attach_energy
from pipeline.report.flags import NOISY_CV, launch_bound, measurement_flags
from pipeline.report.row_times import attach_timings, percentiles, tail_bounds, take_rounds
from pipeline.report.streams import served_entries
from pipeline.running.errors import PipelineError

FORMATS = ("table", "md", "html", "json", "csv")


@dataclass
class ComparisonRow:
    model: str
    variant: str
    toolchain: str
    status: str  # "measured (<metric>)", or why there is no number
    # What the engine came to at its point, in one word: "measured", "out_of_memory" (a result:
    # it did not fit), "faulted" (a kernel faulted on the GPU), "failed", "skipped", "not_profiled".
    outcome: str = "not_profiled"
    # What ran out where it did not fit (the manifest's OutOfMemoryFacts), else None.
    out_of_memory: dict[str, Any] | None = None
    # Why its own accuracy was not checked where it was measured (no FP32 reference fit there, say).
    accuracy_unchecked: str | None = None
    # The GPU type a cluster run built and timed this engine for (manifests/<toolchain>@<gpu>/);
    # rows are compared only with rows of the same GPU type. None on a local run.
    gpu_type: str | None = None
    # The shape point measured ("2x512"), for models measured at several; rows are compared only
    # with rows of the same shape.
    shape: str | None = None
    device: str | None = None
    gpu: str | None = None
    # Which GPU of its machine it was measured on (index, uuid, name), where the manifest says.
    gpu_device: dict[str, Any] | None = None
    batch_size: int | None = None
    median_ms: float | None = None
    # The 95 % interval of the median: the sign-test interval of the per-round take medians for an
    # engine timed in rounds (pipeline/measuring/rounds.py), else a bootstrap of the per-iteration times.
    median_ci_ms: tuple[float, float] | None = None
    # Timed in rounds: how many it took part in, and why they ended ("decided", "budget", "alone").
    rounds: int | None = None
    rounds_stop: str | None = None
    # Where it left its point's rounds out of the running (racing, pipeline/measuring/stopping.py): after how
    # many rounds (its `rounds`); None where it took part in every round.
    raced_out_after: int | None = None
    # The rule that took it out ("interval" or "grossly slower": stopping.INTERVAL, GROSS); None where it stayed.
    raced_out_by: str | None = None
    p5_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p90_ms: float | None = None
    # The 95 % intervals of the p90 and p99, bounded by the takes the runs came in: a take's runs
    # share its host and clock, so they count as about one (pipeline/measuring/quantiles.py,
    # take_quantile_interval). None where the takes are too few (*_takes_needed then says how
    # many would do) or where the engine was not timed in takes (a tool's one run: both None).
    p90_interval_ms: tuple[float, float] | None = None
    p99_interval_ms: tuple[float, float] | None = None
    tail_takes: int | None = None
    p90_takes_needed: int | None = None
    p99_takes_needed: int | None = None
    cv: float | None = None
    # Samples per second in the model's unit ("img" images, "seq" sequences), and tokens per second.
    images_per_s: float | None = None
    sample_unit: str = "img"
    tokens_per_s: float | None = None
    # Energy (pipeline/report/energy.py): joules per inference (a run of its batch) from the counter
    # read around its takes, its inverse, tokens per joule where it has tokens, which counter
    # ("nvml", "rapl") and what it counts (the whole GPU or CPU package, idle power included); or
    # why it has none (no counter here, a tool's engine measured alone, a counter that never resolved).
    joules_per_inference: float | None = None
    inferences_per_joule: float | None = None
    tokens_per_joule: float | None = None
    energy_source: str | None = None
    energy_scope: str | None = None
    energy_why_not: str | None = None
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
    # What a run holds in GPU memory, and what that figure is: PyTorch's peak allocation during the
    # measurement, or the TensorRT execution context's device memory (activations and scratch).
    gpu_memory_mib: float | None = None
    gpu_memory_kind: str | None = None
    # Against the FP32 model's outputs: "measured" on the engine's own outputs, or the export's
    # "proxy" (the fake-quantized PyTorch model) where no engine ran.
    accuracy_source: str | None = None
    accuracy_cosine: float | None = None
    # The engine's outputs against the FP32 reference's, value by value (measured accuracy only).
    max_abs_error: float | None = None
    mean_abs_error: float | None = None
    mse: float | None = None
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
    # Its serving at each stream count after the rounds (pipeline/report/streams.py, served_entries):
    # inferences/s, the requests' median, p90 and p99 with their intervals, or why not measured.
    streams: list[dict[str, Any]] = field(default_factory=list)
    # Why the number may not be trusted: a busy machine, a noisy run (see measurement_flags).
    flags: list[str] = field(default_factory=list)
    # What the timing included (CUDA graphs, data transfers, spin wait), where the runtime says.
    measured_with: dict[str, bool] = field(default_factory=dict)
    # Per-iteration times and layer timings, for plots and significance; not in tabular output.
    samples_ms: list[float] = field(default_factory=list, repr=False)
    layers: list[tuple[str, float]] = field(default_factory=list, repr=False)
    # Not shown either: the manifest the row was read from (to read its samples again when a
    # cached row is compared anew), the variant's precision and the FLOPs its model's export
    # counted (batch, matmul FLOPs), from which the roofline of every row of that model is filled.
    source: str | None = field(default=None, repr=False)
    precision: str | None = field(default=None, repr=False)
    export_flops: tuple[int, float] | None = field(default=None, repr=False)
    # The FLOPs of one forward at this row's shape point, where the model counts them.
    point_flops: float | None = field(default=None, repr=False)
    # Each set of rounds it was timed in (by group) and its take median in each round (None where
    # the take was dropped or missing): rows of one group are compared round by round.
    round_medians: dict[str, list[float | None]] = field(default_factory=dict, repr=False)
    # Each of those groups' engines as its manifest names them (this one, all of them): whether the
    # rows that claim a group are the engines it was measured with (trusted_rounds).
    round_entrants: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict, repr=False)
    # Its joules per inference in each round of those groups (None where the take was dropped or its
    # counter did not resolve): rows of one group compare their energy round by round too.
    round_energies: dict[str, list[float | None]] = field(default_factory=dict, repr=False)

    @property
    def engine(self) -> str:
        return f"{self.model}_{self.variant}"

    def medians_by_round(self, groups: set[str]) -> dict[tuple[str, int], float]:
        """Its take medians in these groups' rounds, by (group, round)."""
        return {
            (group, number): value
            for group in groups
            for number, value in enumerate(self.round_medians.get(group, []))
            if value is not None
        }

    def round_ratios(self, other: ComparisonRow, groups: set[str]) -> list[float]:
        """Its take median over ``other``'s in each round of these groups where both have one (and
        other's is above 0): the ratios stats.paired_ratio takes of medians_by_round, read off the
        two rows' lists without keying every round, which was most of the cost of comparing two
        rows timed together (a point of 3000 engines in sets of thirty compares 43,500 such pairs)."""
        ratios = []
        for group in groups:
            for mine, theirs in zip(self.round_medians.get(group, ()), other.round_medians.get(group, ())):
                if mine is not None and theirs is not None and theirs > 0:
                    ratios.append(mine / theirs)
        return ratios

    @property
    def follows_the_host(self) -> bool:
        """Whether its time moves with the host's speed (pace.follows_the_host, read from the row):
        timed by the host's clock, or flagged launch-bound or near it. Compared with a row of
        another run, the host's spells between the two runs can move it (confidence.apart_ratio)."""
        return f"({HOST_LATENCY})" in self.status or launch_bound(self.flags, near=True)

    @property
    def point(self) -> tuple[str | None, str | None]:
        """What a row is compared within: its GPU type and shape point."""
        return self.gpu_type, self.shape

    @property
    def full_status(self) -> str:
        return "; ".join([self.status, *self.flags])

    @property
    def target(self) -> str:
        """The toolchain, with the GPU type where the row has one: how tables label a row."""
        return f"{self.toolchain}@{self.gpu_type}" if self.gpu_type else self.toolchain

    def public(self) -> dict[str, Any]:
        """The row as the compare JSON and CSV write it: its own lists, not copies (3000 rows make
        186,000 fields), for reading, not changing."""
        data = dict(zip(PUBLIC_FIELDS, _public_of(self)))
        data["engine"] = self.engine
        return data


PRIVATE_FIELDS = ("samples_ms", "layers", "source", "precision", "export_flops", "point_flops", "round_medians", "round_entrants")
PRIVATE_FIELDS += ("round_energies",)
PRIVATE_FIELDS += ("raced_out_by",)  # its flag says it in words: no key of the compare JSON
# What compare_rows fills in from the other rows; the rest of a row comes from its manifest alone.
FILLED_BY_COMPARISON = (
    "baseline",
    "speedup",
    "speedup_significant",
    "reference_toolchain",
    "change_ms",
    "change_pct",
    "change_significant",
    "baseline_toolchain",
    "vs_baseline_toolchain",
    "vs_baseline_toolchain_significant",
    "matmul_gflops",
    "achieved_tflops",
    "peak_fraction",
)
PUBLIC_FIELDS = tuple(f.name for f in fields(ComparisonRow) if f.name not in PRIVATE_FIELDS)


# A row's public fields in PUBLIC_FIELDS' order, read at C speed (a compare of 3000 engines reads 186,000).
_public_of = operator.attrgetter(*PUBLIC_FIELDS)


# --- rows ----------------------------------------------------------------------------------------


def row_of(m: EngineManifest, noisy_cv: float = NOISY_CV) -> ComparisonRow:
    """The manifest's row on its own: everything but the comparisons with other rows and the roofline."""
    try:
        return _row(m, noisy_cv)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        # Typed fields are checked when a manifest is read; the free-form ones (accuracy, the
        # machine's load, trtexec's figures) are read here, and a hand edit can break them.
        raise PipelineError(
            f"manifest {m._source or m.engine} holds a value compare cannot use: {type(exc).__name__}: {exc}.",
            hint="restore the file (git checkout), or re-run the stage that wrote it with --force",
        ) from exc


def trusted_rounds(rows: list[ComparisonRow]) -> None:
    """Rows that claim a set of rounds they cannot have been measured in are read as timed apart,
    and flagged so. A set of rounds is one point's engines in one run, each named once; manifests
    copied by hand, or workspaces merged, can make thousands of rows claim one set — which, compared
    pair by pair, made a compare of 3000 such rows take minutes — and their pairing means nothing."""
    claims: dict[str, list[ComparisonRow]] = {}
    for row in rows:
        for group in row.round_medians:
            claims.setdefault(group, []).append(row)
    for group, claimants in claims.items():
        entrants = claimants[0].round_entrants.get(group, ("", ()))[1]
        names = [f"{row.variant}/{row.toolchain}" for row in claimants]
        if len(names) == len(set(names)) and all(row.round_entrants.get(group, ("", ()))[0] == name for row, name in zip(claimants, names)):
            if set(names) <= set(entrants):
                continue
        for row in claimants:
            del row.round_medians[group]
            row.round_entrants.pop(group, None)
            row.round_energies.pop(group, None)
            row.flags.append(
                f"timed apart: {len(claimants)} manifests claim one set of rounds of {len(entrants)} engines (copied or merged by hand)"
            )


def shape_order(shape: str | None) -> tuple[int, ...]:
    """Shape points in the order of their sizes, the later axes first (sequence, then batch):
    2x512, 4x512, 2x2048, … (ShapeSizes.order); none, or "static", first. Rows hold the point as
    text, as the row cache and the JSON documents do: it is a manifest's, checked when it was read."""
    return ShapeSizes.parse(shape).order if shape else ()


# How a profile that ran out of memory began its reason (pipeline/measuring/out_of_memory.py).
_RAN_OUT = ("out of GPU memory", "out of host memory")


def _row(m: EngineManifest, noisy_cv: float) -> ComparisonRow:
    row = ComparisonRow(
        model=m.model,
        variant=m.variant,
        toolchain=m.toolchain or "?",
        gpu_type=m.gpu_type,
        shape=m.shape,
        status="not profiled",
        source=m._source,
    )
    row.precision = m.precision
    kept = next((r for r in (m.export, m.build, m.profile) if r is not None and r.status in ("out_of_memory", "faulted")), None)
    if kept is not None:  # a result of its own, whichever stage met it: said as it was recorded
        row.status, row.outcome = kept.reason or kept.status, kept.status
        row.out_of_memory = kept.out_of_memory.model_dump() if kept.out_of_memory else None
    elif m.build is not None and m.build.status == "skipped":
        row.status, row.outcome = f"skipped: {m.build.reason}", "skipped"
    elif m.build is not None and m.build.status == "failed":
        row.status, row.outcome = f"build refused: {m.build.reason}", "failed"
        row.build_s = m.build.duration_s
    elif m.profile is not None and m.profile.status == "skipped":
        row.status, row.outcome = f"skipped: {m.profile.reason}", "skipped"
    elif m.profile is not None and m.profile.status == "failed" and (m.profile.reason or "").startswith(_RAN_OUT):
        row.status, row.outcome = m.profile.reason, "out_of_memory"  # recorded as failed before manifest schema 3
    elif m.profile is not None and m.profile.status == "failed":
        row.status, row.outcome = f"failed: {m.profile.reason}", "failed"
    if m.build is not None and m.build.status == "done":
        engine = next((a for a in m.build.outputs if a.role == "engine"), None)
        row.engine_mb = engine.size_bytes / 2**20 if engine else None
        row.build_s = m.build.duration_s
        details = m.build.details
        audit = details.precision_audit if details is not None else None
        if audit:
            row.audit = audit.get("warning") or ("ok: " + ", ".join(f"{k} {v}" for k, v in sorted(audit["output_types"].items())))
    if m.export is not None and m.export.details is not None:
        export = m.export.details
        if export.accuracy:
            row.accuracy_source = "proxy"
            row.accuracy_cosine = export.accuracy["cosine_similarity"]
            row.top1_agreement = export.accuracy["top1_agreement"]
        flops = (export.onnx_audit or {}).get("matmul_flops")
        if flops and export.input_shape and not export.shape_points:  # a graph of one shape: its FLOPs per batch
            row.export_flops = (export.input_shape[0], float(flops))
        row.point_flops = export.flops_by_shape.get(row.shape) if row.shape else None
    if m.profile is not None and m.profile.status == "done" and m.profile.details is not None:
        d = m.profile.details
        if not d.per_iteration_ms or not d.latency_ms.median > 0:
            raise ValueError(f"its profile has {len(d.per_iteration_ms)} per-iteration times and a median of {d.latency_ms.median} ms")
        row.status, row.outcome = f"measured ({d.metric})", "measured"
        row.accuracy_unchecked = d.accuracy_skipped
        if d.stable is False:
            retakes = f" after {len(d.retaken_medians_ms)} retake(s)" if not d.rounds else ""
            row.status = (
                f"unstable ({d.metric}): the {len(d.repeat_medians_ms)} measurements' medians disagree "
                f"(CV {d.repeat_cv:.1%} > {d.settings.max_repeat_cv:.0%}){retakes}"
            )
        row.device = d.device
        row.gpu = d.gpu
        row.gpu_device = dict(d.gpu_device) if d.gpu_device else None
        row.batch_size = d.batch_size
        row.median_ms = d.latency_ms.median
        row.p5_ms, row.p95_ms = percentiles(d.per_iteration_ms, (5, 95))
        row.p99_ms = d.latency_ms.p99
        row.p90_ms = d.latency_ms.p90
        row.cv = d.latency_ms.cv
        row.images_per_s = d.images_per_s
        row.sample_unit = d.sample_unit
        row.tokens_per_s = d.tokens_per_s
        attach_timings(row, m)
        row.flags = measurement_flags(d, noisy_cv)
        if d.accuracy:
            row.accuracy_source = "measured"
            row.accuracy_cosine = d.accuracy["cosine_similarity"]
            row.top1_agreement = d.accuracy["top1_agreement"]
            row.top5_agreement = d.accuracy.get("top5_agreement")
            row.max_abs_error = d.accuracy.get("max_abs_error")
            row.mean_abs_error = d.accuracy.get("mean_abs_error")
            row.mse = d.accuracy.get("mse")
            row.top1_accuracy = d.accuracy.get("top1_accuracy")
            row.nonfinite_values = d.accuracy.get("nonfinite_values")
            if d.accuracy.get("warning"):
                row.flags.append(f"inaccurate: {d.accuracy['warning']}")
        row.measured_with = dict(d.measured_with)
        row.streams = served_entries(d.streams)
        row.gpu_memory_mib, row.gpu_memory_kind = _gpu_memory(d)
        if d.rounds:
            take_rounds(row, d.rounds)
            tail_bounds(row, d.rounds)
        attach_energy(row, d.rounds)
    return row


def _gpu_memory(details) -> tuple[float | None, str | None]:
    """(MiB, what it counts) from what the profile recorded, or (None, None)."""
    return details.gpu_memory_mib, details.gpu_memory_counts
