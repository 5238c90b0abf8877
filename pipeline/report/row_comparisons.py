"""What each comparison row is compared by, from the other rows: its speedup over the variant it is
measured against, its change from the reference toolchain, its ratio to the baseline toolchain's
engine — each with whether it is beyond the noise (paired rounds where the two were timed
together, their takes' intervals where both were timed in rounds apart, else the bootstrap of their
medians' difference) — and where it stands on the roofline."""

from __future__ import annotations

from pipeline.catalog import Catalog
from pipeline.measuring.stats import ratio_of_rounds
from pipeline.report.confidence import apart_ratio, pair_confidence
from pipeline.report.pairs import grossly_beaten
from pipeline.report.rows import ComparisonRow, shape_order, trusted_rounds


def compare_rows(catalog: Catalog, rows: list[ComparisonRow], toolchain_order: list[str] | None, cache) -> list[ComparisonRow]:
    """Fill in what each row is compared by (speedups, changes, their significance, the roofline)
    and sort the rows; ``cache`` (a RowCache) supplies and keeps the confidence intervals."""
    trusted_rounds(rows)
    flops_by_model = {(row.model, row.export_flops[0]): row.export_flops[1] for row in rows if row.export_flops}
    for row in rows:
        _add_roofline(row, flops_by_model)
    cache.fill_median_cis(rows)
    # Each comparison names the two rows and the field its significance goes in; the intervals
    # of all of them are computed together (pipeline/measuring/stats.py), or remembered from an earlier call.
    comparisons = _speedups(catalog, rows) + _toolchain_changes(rows, toolchain_order)
    if catalog.baseline_toolchain:
        comparisons += _against_baseline_toolchain(rows, catalog.baseline_toolchain)
    # Rows timed together in rounds: significant when the interval of their paired per-round
    # ratio excludes 1, read at the point's level for all its pairs (pipeline/report/confidence.py);
    # rows timed in rounds apart, when their medians' intervals do not overlap; the others by the
    # bootstrap below.
    unpaired = []
    for row, base, field_name in comparisons:
        shared = set(row.round_medians) & set(base.round_medians)
        estimate = ratio_of_rounds(row.round_ratios(base, shared), catalog.profile.tie, pair_confidence(row, shared)) if shared else None
        if estimate is not None:
            # Rounds too few for an interval tell nothing apart, whatever their range (the verdict
            # says "cannot be told apart in N rounds"): its low and high are no interval. But one
            # of the two left its rounds grossly slower than the other: apart by that rule, as the
            # sweep's words say it (pairs.grossly_beaten).
            apart = (
                estimate.low > 1.0 or estimate.high < 1.0 if estimate.bounded else grossly_beaten(row, base) or grossly_beaten(base, row)
            )
            setattr(row, field_name, apart)
        elif row.round_medians and base.round_medians and row.median_ci_ms and base.median_ci_ms:
            # Timed in other sets of rounds: their medians are their takes' (row_times.py), told
            # apart by the takes' intervals as the verdict tells them (confidence.time_ratio), not
            # by a bootstrap of pooled runs whose median the row no longer shows.
            estimate = apart_ratio(row, base, catalog.profile.tie)
            setattr(row, field_name, estimate.low > 1.0 or estimate.high < 1.0)
        else:
            unpaired.append((row, base, field_name))
    intervals = cache.difference_cis([(row, base) for row, base, _ in unpaired])
    for (row, _, field_name), (low, high) in zip(unpaired, intervals):
        # Significant when the 95% bootstrap interval of the difference of the medians excludes zero.
        setattr(row, field_name, not (low <= 0.0 <= high))
    variant_order = {name: i for i, name in enumerate(catalog.variants)}
    chain_order = {name: i for i, name in enumerate(toolchain_order or sorted({r.toolchain for r in rows}))}
    rows.sort(
        key=lambda r: (
            r.model,
            variant_order.get(r.variant, len(variant_order)),
            r.variant,
            shape_order(r.shape),
            chain_order.get(r.toolchain, 99),
            r.gpu_type or "",
        )
    )
    return rows


def _add_roofline(row: ComparisonRow, flops_by_model: dict[tuple[str, int], float]) -> None:
    from pipeline.report.roofline import peak_tflops

    flops = (row.point_flops or flops_by_model.get((row.model, row.batch_size))) if row.median_ms else None
    if flops:
        row.matmul_gflops = flops / 1e9
        row.achieved_tflops = flops / (row.median_ms / 1000.0) / 1e12
        peak = peak_tflops(row.gpu, row.precision)
        row.peak_fraction = row.achieved_tflops / peak if peak else None


# (row, its baseline row, the field of row that says whether they differ beyond the noise)
Comparison = tuple[ComparisonRow, ComparisonRow, str]


def _speedups(catalog: Catalog, rows: list[ComparisonRow]) -> list[Comparison]:
    comparisons: list[Comparison] = []
    measured = {(r.model, r.toolchain, r.point, r.variant): r for r in rows if r.median_ms}
    for row in rows:
        if row.median_ms is None:
            continue
        spec = catalog.toolchains.get(row.toolchain)
        for name in spec.baselines if spec else ("fp16", "fp32"):
            base = measured.get((row.model, row.toolchain, row.point, name))
            if base is not None:
                row.baseline = name
                row.speedup = base.median_ms / row.median_ms
                if base is not row:
                    comparisons.append((row, base, "speedup_significant"))
                break
    return comparisons


def _toolchain_changes(rows: list[ComparisonRow], order: list[str] | None) -> list[Comparison]:
    comparisons: list[Comparison] = []
    chains = order or sorted({r.toolchain for r in rows if r.median_ms})
    if len(chains) < 2:
        return comparisons
    reference = chains[0]
    by_key = {(r.model, r.variant, r.toolchain, r.point): r for r in rows if r.median_ms}
    for row in rows:
        ref = by_key.get((row.model, row.variant, reference, row.point))
        if row.median_ms is None or ref is None or row.toolchain == reference:
            continue
        row.reference_toolchain = reference
        differ = [
            f"{key} {'on' if row.measured_with[key] else 'off'} here, {'on' if ref.measured_with[key] else 'off'} there"
            for key in sorted(row.measured_with.keys() & ref.measured_with.keys())
            if row.measured_with[key] != ref.measured_with[key]
        ]
        if differ:
            row.flags.append(f"measured differently from {reference}: {', '.join(differ)}")
        row.change_ms = row.median_ms - ref.median_ms
        row.change_pct = row.change_ms / ref.median_ms * 100
        comparisons.append((row, ref, "change_significant"))
    return comparisons


def _against_baseline_toolchain(rows: list[ComparisonRow], baseline: str) -> list[Comparison]:
    comparisons: list[Comparison] = []
    measured = {(r.model, r.variant, r.batch_size, r.point): r for r in rows if r.median_ms and r.toolchain == baseline}
    for row in rows:
        base = measured.get((row.model, row.variant, row.batch_size, row.point))
        if row.median_ms is None or base is None:
            continue
        row.baseline_toolchain = baseline
        row.vs_baseline_toolchain = base.median_ms / row.median_ms
        if base is not row:
            comparisons.append((row, base, "vs_baseline_toolchain_significant"))
    return comparisons
