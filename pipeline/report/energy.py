"""Each row's energy per inference, from the joules its takes read (pipeline/measuring/energy.py), or
why it has none; and the words every format says of them under its table.

A row's figure is the joules of its kept takes whose counter resolved, over the inferences those
takes ran (each take's timed runs and the untimed ones before them, which the counter also saw):
a ratio of sums, as energy adds up. It includes the idle power of whatever the counter measures —
the whole GPU, or the whole CPU package, every process on it — nothing is subtracted, since no
idle power was measured to subtract. Each round's take gives that round's figure, so two rows timed
together are compared round by round (confidence.energy_ratio), as their times are.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pipeline.measuring.energy import NOT_ASKED

# A row is rows.ComparisonRow, named here as Any: rows.py asks this module for a row's energy, and
# this one importing it back would make the two a circle.
Row = Any

ALONE = "measured alone by its tool, one whole run and no takes: no counter was read around its inferences"
BEFORE = "not read: its manifest was written before energy was"


def attach_energy(row: Row, records) -> None:
    """The row's joules per inference and its per-round figures, from its rounds' records (a
    measured row's ``rounds``); else why it has none (energy_why_not)."""
    if not records:
        row.energy_why_not = ALONE
        return
    hows = [record.energy for record in records if record.energy is not None]
    if not hows:
        row.energy_why_not = next((record.energy_why_not for record in records if record.energy_why_not), BEFORE)
        return
    joules, runs = 0.0, 0
    for record in records:
        if record.energy is None:
            continue
        per_round: list[float | None] = [None] * record.rounds
        for take in record.takes:
            if take.dropped is not None or not take.energy_resolved or take.joules is None or not take.energy_runs:
                continue
            joules, runs = joules + take.joules, runs + take.energy_runs
            if take.round < record.rounds:
                per_round[take.round] = take.joules / take.energy_runs
        row.round_energies[record.group] = per_round
    how = hows[0]
    if runs == 0 or joules <= 0:
        row.round_energies.clear()
        row.energy_why_not = (
            f"{how.source}'s counter did not resolve in any take (fewer than {how.min_steps} steps, "
            f"takes lengthened up to {how.least_take_ms:g} ms)"
        )
        return
    row.energy_source, row.energy_scope = how.source, how.scope
    row.joules_per_inference = joules / runs
    row.inferences_per_joule = runs / joules
    if row.tokens_per_s and row.images_per_s and row.batch_size:  # tokens a run, as its throughput counts them
        row.tokens_per_joule = row.tokens_per_s / row.images_per_s * row.batch_size * row.inferences_per_joule


def energy_notes(rows: list[Row], shown: Collection[str] | None = None) -> list[str]:
    """What the energy columns are, and why the rows without a figure have none: one note each,
    the rows named where not all of them share it. ``shown``: the keys of the table's columns,
    of which the note names as shown only the inverses there (inf/j, tok/j) and says where the
    others are; None: every column (a file's table)."""
    notes = []
    measured = [row for row in rows if row.median_ms is not None]
    scopes = list(dict.fromkeys(f"{row.energy_source}: {row.energy_scope}" for row in measured if row.energy_source))
    if scopes:
        notes.append(
            "J/inf: joules per inference (a run of its batch) from the energy counter read around each take, "
            + "; ".join(scopes)
            + _inverses(any(row.tokens_per_joule for row in rows), shown)
        )
    whys: dict[str, list[str]] = {}
    for row in measured:
        if row.energy_why_not and row.energy_why_not != NOT_ASKED:  # the user did not ask: nothing to explain
            whys.setdefault(row.energy_why_not, []).append(f"{row.variant}/{row.target}")
    for why, names in whys.items():
        who = "" if len(names) == len([row for row in measured if not row.energy_source]) and not scopes else f" ({', '.join(names)})"
        notes.append(f"no energy{who}: {why}")
    return notes


def _inverses(tokens: bool, shown: Collection[str] | None) -> str:
    names = {"inf/j": "inf/J", "tok/j": "tok/J"} if tokens else {"inf/j": "inf/J"}
    there = [name for key, name in names.items() if shown is None or key in shown]
    elsewhere = [name for key, name in names.items() if name not in there]
    parts = [f"{', '.join(there)}: its inverse"] if there else []
    if elsewhere:
        parts.append(f"{', '.join(elsewhere)}{', its inverse' if not there else ''}: --wide, or --format md")
    return f" ({'; '.join(parts)})"
