"""A comparison row's times (rows.py makes the row): its per-iteration and per-layer times read
from its manifest, split into the takes its rounds kept, its take medians by round with the
median's interval from them, the p90 and p99 intervals those takes bound, and percentiles as numpy
computes them."""

from __future__ import annotations

from pipeline.manifest import EngineManifest

# A row is rows.ComparisonRow, not named here: rows.py imports this module.


def tail_bounds(row, records) -> None:
    """The row's p90 and p99 intervals, bounded by its takes: its per-iteration times split as its
    rounds kept them (each kept take's runs, in order, record after record); none where they do not
    split so (a manifest edited by hand)."""
    from pipeline.measuring.quantiles import runs_needed, take_quantile_interval

    takes = take_runs(row.samples_ms, records)
    if not takes:
        return
    row.tail_takes = len(takes)
    row.p90_interval_ms = take_quantile_interval(takes, 0.90)
    row.p99_interval_ms = take_quantile_interval(takes, 0.99)
    row.p90_takes_needed = runs_needed(0.90) if row.p90_interval_ms is None else None
    row.p99_takes_needed = runs_needed(0.99) if row.p99_interval_ms is None else None


def take_runs(samples_ms: list[float], records) -> list[list[float]]:
    """The per-iteration times split as the rounds kept them: each kept take's runs, in order,
    record after record; none where they do not split so (a manifest edited by hand)."""
    takes, start = [], 0
    for record in records:
        for take in record.takes:
            if take.dropped is None:
                takes.append(samples_ms[start : start + take.runs])
                start += take.runs
    return takes if start == len(samples_ms) else []


def take_rounds(row, records) -> None:
    """A row timed in rounds: its take medians by group and round, its median and the median's
    interval from them (takes spread over the whole measurement, so a host that changed speed
    widens it)."""
    import statistics

    from pipeline.measuring.records import kept_take_medians
    from pipeline.measuring.stats import median_interval

    for record in records:
        medians: list[float | None] = [None] * record.rounds
        for take in record.takes:
            if take.dropped is None and take.round < record.rounds:
                medians[take.round] = take.median_ms
        row.round_medians[record.group] = medians
        row.round_entrants[record.group] = (record.entrant, tuple(record.entrants))
    kept = kept_take_medians(records)
    if kept:
        # The median of the take medians, the figure its interval bounds. The pooled runs' median
        # weighs a take by its runs, and takes are as long in milliseconds, so the faster ones weigh
        # more: it fell outside its own interval (ONNX Runtime, bert_tiny at 2x64, 30 rounds on a
        # 2-core VM: 0.4524 ms pooled, interval 0.4379–0.4499 ms).
        row.median_ms = statistics.median(kept)
        row.median_ci_ms = median_interval(kept)
    row.rounds = sum(record.raced_out.get(record.entrant, record.rounds) for record in records)
    row.rounds_stop = records[0].stop
    if any(record.entrant in record.raced_out for record in records):
        from pipeline.measuring.stopping import GROSS, INTERVAL, gross_rule

        row.raced_out_after = row.rounds
        rules = {record.raced_out_by.get(record.entrant, INTERVAL) for record in records if record.entrant in record.raced_out}
        row.raced_out_by = GROSS if GROSS in rules else INTERVAL
        of = sum(record.rounds for record in records)
        rule = f"racing: {gross_rule()}" if row.raced_out_by == GROSS else "racing"
        row.flags.append(f"out of the running after {row.rounds} of {of} rounds ({rule}): its figures are from those rounds")


def attach_timings(row, m: EngineManifest) -> None:
    """The row's per-iteration and per-layer times, from its manifest (a cached row has neither)."""
    timings = timings_of(m)
    if timings is not None:
        row.samples_ms, row.layers = timings


def timings_of(m: EngineManifest) -> tuple[list[float], list[tuple[str, float]]] | None:
    """A manifest's per-iteration times and its layers' (name, average ms); None where its
    profile did not finish."""
    if m.profile is not None and m.profile.status == "done" and m.profile.details is not None:
        return list(m.profile.details.per_iteration_ms), [(layer.name, layer.average_ms) for layer in m.profile.details.layer_times]
    return None


def percentiles(values: list[float], percents: tuple[float, ...]) -> tuple[float, ...]:
    """numpy.percentile's default (linear) method, without numpy's per-call cost: compare reads
    thousands of rows."""
    ordered = sorted(values)
    last = len(ordered) - 1
    result = []
    for percent in percents:
        position = percent / 100 * last
        below = int(position)
        low, high = ordered[below], ordered[min(below + 1, last)]
        weight = position - below
        # numpy's interpolation, term for term, so the figures agree to the last bit.
        result.append(high - (high - low) * (1 - weight) if weight >= 0.5 else low + (high - low) * weight)
    return tuple(result)
