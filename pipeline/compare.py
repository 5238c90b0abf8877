"""Compare stage: read saved manifests and put engines side by side. It never re-measures."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.catalog import Catalog
from pipeline.errors import PipelineError, UsageError
from pipeline.manifest import EngineManifest, read_manifest
from pipeline.workspace import Workspace


@dataclass
class ComparisonRow:
    model: str
    variant: str
    toolchain: str
    status: str  # "measured (<metric>)", or why there is no number
    device: str | None = None
    batch_size: int | None = None
    median_ms: float | None = None
    p99_ms: float | None = None
    cv: float | None = None
    images_per_s: float | None = None
    baseline: str | None = None
    speedup: float | None = None


def load_manifests(workspace: Workspace, toolchains: list[str] | None = None) -> list[EngineManifest]:
    root = workspace.manifests_dir
    if not root.is_dir():
        return []
    manifests = []
    for directory in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "export"):
        if toolchains and directory.name not in toolchains:
            continue
        for path in sorted(directory.glob("*.json")):
            manifests.append(read_manifest(path))
    return manifests


def build_rows(catalog: Catalog, manifests: list[EngineManifest]) -> list[ComparisonRow]:
    rows: list[ComparisonRow] = []
    for m in manifests:
        row = ComparisonRow(model=m.model, variant=m.variant, toolchain=m.toolchain or "?", status="not profiled")
        if m.build is not None and m.build.status == "skipped":
            row.status = f"skipped: {m.build.reason}"
        elif m.profile is not None and m.profile.status == "skipped":
            row.status = f"skipped: {m.profile.reason}"
        elif m.profile is not None and m.profile.details is not None:
            d = m.profile.details
            row.status = f"measured ({d.metric})"
            row.device = d.device
            row.batch_size = d.batch_size
            row.median_ms = d.latency_ms.median
            row.p99_ms = d.latency_ms.p99
            row.cv = d.latency_ms.cv
            row.images_per_s = d.images_per_s
        rows.append(row)

    # Speedup against the toolchain's baseline variant of the same model (first one measured).
    measured = {(r.model, r.toolchain, r.variant): r for r in rows if r.median_ms}
    for row in rows:
        if row.median_ms is None:
            continue
        baselines = catalog.toolchains[row.toolchain].baselines if row.toolchain in catalog.toolchains else ("fp16", "fp32")
        for name in baselines:
            base = measured.get((row.model, row.toolchain, name))
            if base is not None:
                row.baseline = name
                row.speedup = base.median_ms / row.median_ms
                break

    variant_order = {name: i for i, name in enumerate(catalog.variants)}
    rows.sort(key=lambda r: (r.model, r.toolchain, variant_order.get(r.variant, len(variant_order)), r.variant))
    return rows


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


HEADERS = ("engine", "toolchain", "median ms", "p99 ms", "CV", "img/s", "speedup", "status")


def _cells(row: ComparisonRow) -> tuple[str, ...]:
    speedup = f"{row.speedup:.2f}x vs {row.baseline}" if row.speedup is not None else "–"
    return (
        f"{row.model}_{row.variant}",
        row.toolchain,
        _fmt(row.median_ms, ".3f"),
        _fmt(row.p99_ms, ".3f"),
        _fmt(row.cv * 100 if row.cv is not None else None, ".1f", "%"),
        _fmt(row.images_per_s, ".1f"),
        speedup,
        row.status,
    )


def render_markdown(rows: list[ComparisonRow]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(row)) + " |")
    return "\n".join(lines) + "\n"


def render_table(rows: list[ComparisonRow]):
    from rich.table import Table

    table = Table(title="Engines (medians of per-iteration latency; speedup within each toolchain)")
    for header in HEADERS:
        left = header in ("engine", "toolchain", "status")
        table.add_column(header, justify="left" if left else "right", no_wrap=header != "status")
    for row in rows:
        cells = _cells(row)
        style = None if row.median_ms is not None else "dim"
        table.add_row(*cells, style=style)
    return table


def render_json(rows: list[ComparisonRow]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2) + "\n"


FORMATS = ("table", "md", "json")


def compare(catalog: Catalog, workspace: Workspace, toolchains: list[str] | None, fmt: str):
    """Rows plus their rendering in ``fmt`` (a rich Table for "table", text otherwise)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}.", hint=f"use one of {', '.join(FORMATS)}")
    for name in toolchains or []:
        catalog.toolchain(name)
    rows = build_rows(catalog, load_manifests(workspace, toolchains))
    if not rows:
        raise PipelineError(
            f"no engine manifests under {workspace.manifests_dir}" + (f" for {', '.join(toolchains)}" if toolchains else "") + ".",
            hint="run `pipeline run` (or `make demo`) first",
        )
    if fmt == "md":
        return rows, render_markdown(rows)
    if fmt == "json":
        return rows, render_json(rows)
    return rows, render_table(rows)


def write_output(text: str, out: Path) -> None:
    from pipeline.artifacts import atomic_write_text

    atomic_write_text(out, text)
