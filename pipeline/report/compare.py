"""Compare stage: put engines side by side from saved manifests. It never re-measures.

Per model, one row per variant × toolchain: median and p99 latency (GPU compute time for
TensorRT, host latency for ONNX Runtime), throughput, speedup against the toolchain's baseline
variant, the change against the first toolchain compared, engine size, build time, the accuracy
proxy, the layer-precision audit and the roofline. A difference whose bootstrap confidence
interval (of the difference of medians, from the per-iteration times) contains zero is marked not
significant ("~"): it is within the runs' own spread.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from pathlib import Path

from pipeline.catalog import Catalog
from pipeline.catalog.floor import AccuracyFloor, AccuracyThreshold
from pipeline.measuring.ranking import ranking
from pipeline.report.answer import Answer
from pipeline.report.flags import NOISY_CV
from pipeline.report.json_document import render_json
from pipeline.report.manifest_sources import earlier_builds_words, load_manifests, manifest_paths, measured_on_earlier_builds
from pipeline.report.row_cache import workspace_cache
from pipeline.report.row_comparisons import compare_rows
from pipeline.report.row_times import attach_timings
from pipeline.report.streams import p99_under
from pipeline.report.sweep import METRICS, sweeps
from pipeline.report.tables import render_csv, render_markdown, render_table
from pipeline.report.verdict import verdicts
from pipeline.running.errors import PipelineError, UsageError
from pipeline.workspace import Workspace

FORMATS = ("table", "md", "html", "json", "csv")


@contextlib.contextmanager
def _cycles_collected_after():
    """Python's cyclic garbage collector paused while a comparison is made. Everything compare
    builds is held until it is written — the rows, their comparisons, the document — and the
    collector, set off by the count of allocations, walks all of it again and again as it grows:
    an eighth to a sixth of the time of a compare of 3000 engines at one point. Compare makes no
    cycles worth collecting on the way; any it makes are collected once it is done."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@_cycles_collected_after()
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
    metric: str = "ms",
    thresholds: list[AccuracyThreshold] = (),
    p99_under_ms: float | None = None,
    by: str | None = None,
    warn: Callable[[str], None] | None = None,
):
    """Rows plus their rendering in ``fmt`` (a rich renderable for "table", at ``width``
    columns, text otherwise), the answer first: the verdict per model and shape point (the fastest
    engine meeting ``thresholds``, else the catalog's accuracy floor for the model, else each
    precision's own accuracy check) and the sweep tables in ``metric`` (pipeline/report/sweep.py),
    the verdict ranked ``by`` the median or a percentile (None: the catalog's [profile] by).
    What it leaves out as measured on an earlier build of its engine, it says to ``warn``."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}.", hint=f"use one of {', '.join(FORMATS)}")
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}.", hint=f"use one of {', '.join(METRICS)}")
    for name in toolchains or []:
        catalog.toolchain(name)
    for name in models or []:
        catalog.model(name)
    cache = workspace_cache(workspace.manifests_dir, noisy_cv)
    rows = [row for row in cache.rows(manifest_paths(workspace.manifests_dir, toolchains)) if not models or row.model in models]
    earlier = measured_on_earlier_builds({Path(row.source): cache.build_of(Path(row.source)) for row in rows if row.source}, cache.build_of)
    if earlier:
        left_out = {str(path) for path in earlier}
        rows = [row for row in rows if row.source not in left_out]
        if warn is not None:
            warn(
                f"{earlier_builds_words(earlier)}; `pipeline run` measures them again where they are among the model's shapes, else delete their manifests"
            )
    if gpu_types:
        have = sorted({row.gpu_type for row in rows if row.gpu_type})
        unknown = [t for t in gpu_types if t not in have]
        if unknown:
            raise UsageError(
                f"no engine was built for {', '.join(unknown)}; the GPU types measured here are: {', '.join(have) or 'none (no cluster run chose one)'}.",
                hint="GPU types come from cluster runs (`--cluster … --gpu TYPE`)",
            )
        rows = [row for row in rows if row.gpu_type in gpu_types]
    rows = compare_rows(catalog, rows, toolchains, cache)
    # The cache is written in a copy of this process while the answer is made (row_cache.py, saved_beside).
    with cache.saved_beside():
        if not rows:
            raise PipelineError(
                f"no engine manifests under {workspace.manifests_dir}" + (f" for {', '.join(toolchains)}" if toolchains else "") + ".",
                hint="run `pipeline run` (or `make demo`) first",
            )
        given = AccuracyFloor(tuple(thresholds), "--fail-accuracy-below")
        floors = {model: given if thresholds else catalog.accuracy_floor_for(model) for model in {row.model for row in rows}}
        ranked = ranking(by or catalog.profile.by)
        verdict_list = verdicts(rows, catalog.baseline_toolchain, floors, catalog.profile.tie, ranked, cache.samples)
        answer = Answer(verdict_list, sweeps(rows, verdict_list, catalog.profile.tie, catalog.baseline_toolchain), metric)
        if p99_under_ms is not None:
            answer.serving = p99_under(rows, p99_under_ms)
            if not answer.serving:
                raise UsageError(
                    f"--p99-under {p99_under_ms:g} ms: no engine here served concurrent streams.",
                    hint="profile with `--streams 1,2,4` (or [profile] streams in pipeline.toml) first: docs/streams.md",
                )
        if fmt == "md":
            return rows, render_markdown(rows, answer)
        if fmt == "json":
            return rows, render_json(rows, answer)
        if fmt == "csv":
            return rows, render_csv(rows)
        if fmt == "html":
            from pipeline.report.html import render_html

            # The plots need every run's times and the layer profiles, which cached rows do not keep.
            by_source = {m._source: m for m in load_manifests(workspace.manifests_dir, toolchains)}
            for row in rows:
                attach_timings(row, by_source[row.source])
            return rows, render_html(rows, [by_source[row.source] for row in rows], answer)
        return rows, render_table(rows, width, columns, wide, answer)


def write_output(text: str, out: Path) -> None:
    from pipeline.running.files import atomic_write_text

    atomic_write_text(out, text)
