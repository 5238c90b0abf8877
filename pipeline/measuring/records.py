"""What the rounds (rounds.py) record: each engine's takes, one set of rounds as a manifest keeps it
(RoundsRecord), and the rounds of one shape point as the protocol hands them back (RoundsOutcome)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from pipeline.catalog import ProfileSettings
from pipeline.measuring.energy import EnergyHow
from pipeline.running.errors import PipelineError


class Take(BaseModel):
    """One engine's take in one round, as the manifest keeps it."""

    round: int
    # Its place in the round's order (0: first).
    order: int
    runs: int
    median_ms: float
    sm_clock_mhz: float | None = None
    # Why it is not used (its GPU throttled), or None.
    dropped: str | None = None
    # The host's time to issue the take's untimed run, the GPU idle (cuda_take), where the engine says it.
    issue_ms: float | None = None
    # How much slower the measuring process's CPUs ran around the take than alone (1.0: as fast;
    # pipeline/measuring/host_speed.py). Absent in manifests written before it was measured.
    host_slowdown: float | None = None
    # Who slowed it: the CPUs other processes used over the last quarter second up to its end, and
    # the share of it the process's cgroup CPU quota held it off. Absent (None) as above, and
    # others where the kernel does not say.
    host_others_cpus: float | None = None
    host_throttled: float | None = None
    # The energy counter read around the take (pipeline/measuring/energy.py): joules over the take,
    # the inferences they cover (its runs and the untimed ones before them), the counter's steps in
    # it (None where counted from its length) and whether that resolved it. None where not read.
    joules: float | None = None
    energy_runs: int | None = None
    energy_steps: int | None = None
    energy_resolved: bool | None = None
    # When the counter was read from (epoch seconds) and for how long (ms): the span a reading
    # taken beside the product's, by another process, is read over to check it.
    energy_from_s: float | None = None
    energy_ms: float | None = None


class RoundsRecord(BaseModel):
    """What one engine's manifest keeps of the rounds it was measured in: enough for a report to
    recompute every comparison from the takes of the group's manifests."""

    # Shared by the engines measured together at this point, and only by them.
    group: str
    # This engine, and every engine of the group ("variant/toolchain").
    entrant: str
    entrants: list[str]
    takes: list[Take]
    rounds: int
    # Why the rounds ended: "decided", "budget" (budget_s spent first), "alone" (nothing to compare
    # with), "rounds" (MAX_ROUNDS).
    stop: str
    elapsed_s: float
    take_ms: float
    take_runs: int
    # A round's least length, its takes lengthened to fill it (take_length). Absent (None) in
    # manifests written before: their takes were take_ms whatever the round.
    round_ms: float | None = None
    # The rounds (from 0) whose takes kept take_ms, not lengthened to round_ms: every pair still
    # open then was of engines the GPU times, or beyond the host's reach (host_sets_the_pace).
    # Empty in manifests written before, whose takes were all lengthened where their rounds were short.
    short_rounds: list[int] = []
    min_rounds: int
    budget_s: float
    tie: float
    seed: int
    default_sm_clock_mhz: float | None = None
    # Engines that failed during the rounds, and why (they stop taking part; the rounds go on).
    failed: dict[str, str] = {}
    # Engines that left the rounds out of the running (racing, pipeline/measuring/stopping.py), and after how
    # many rounds: their takes end there. Absent in manifests written before racing.
    raced_out: dict[str, int] = {}
    # The rule that took each of them out: "interval" (the leader faster by the interval) or
    # "grossly slower" (every take over GROSS_FACTOR times the leader's slowest, before the interval
    # can act). Absent in manifests written before the second rule: all theirs are "interval".
    raced_out_by: dict[str, str] = {}
    # The host's probe alone, in ms, that each take's host_slowdown is against, and whose
    # calibration it was ("this process" or "host record": pipeline/measuring/host_speed.py).
    host_alone_probe_ms: float | None = None
    host_alone_from: str | None = None
    # The host's own spread of the probe when calibrated (its 90th percentile against its median):
    # a take slowed within it is the host's noise.
    host_noise: float | None = None
    # How its rounds held the host (pipeline/measuring/host_rounds.py): "shared" beside other points' GPU-bound
    # rounds, "whole" alone; None where not held (a cache that cannot be written) or not recorded.
    host_held: str | None = None
    # How this engine's energy was read (its takes' joules), or why it was not; both None in
    # manifests written before energy was read.
    energy: EnergyHow | None = None
    energy_why_not: str | None = None

    @property
    def dropped(self) -> int:
        return sum(1 for take in self.takes if take.dropped is not None)

    @property
    def kept_medians_ms(self) -> list[float]:
        """Its kept takes' medians, one a round: what its median and the median's interval are
        read from (each take weighs alike, however many runs it held)."""
        return [take.median_ms for take in self.takes if take.dropped is None and take.round < self.rounds]


def kept_take_medians(records) -> list[float]:
    """An engine's kept take medians over all its rounds records (a measurement each): the values
    its median is — in compare's row (report/row_times.py) and in the profile's line alike."""
    return [value for record in records for value in record.kept_medians_ms]


@dataclass
class RoundsOutcome:
    """The rounds of one shape point: every engine's takes and per-run times."""

    group: str
    entrants: list[str]
    takes: dict[str, list[Take]]
    # Each engine's per-run times from the takes that were kept, in order.
    times_ms: dict[str, list[float]]
    rounds: int
    stop: str
    elapsed_s: float
    settings: ProfileSettings
    seed: int
    default_sm_clock_mhz: float | None
    failed: dict[str, str] = field(default_factory=dict)
    raced_out: dict[str, int] = field(default_factory=dict)
    raced_out_by: dict[str, str] = field(default_factory=dict)
    # The rounds whose takes kept take_ms (RoundsRecord.short_rounds).
    short_rounds: list[int] = field(default_factory=list)
    host_alone_probe_ms: float | None = None
    host_alone_from: str | None = None
    host_noise: float | None = None
    # How the rounds held the host: "shared", "whole", or None (unheld).
    host_held: str | None = None
    # Each engine's energy, where the rounds were asked to read it: (how it was read, or None; why
    # not, or None) (RoundsRecord.energy, energy_why_not).
    energy: dict[str, tuple[EnergyHow | None, str | None]] = field(default_factory=dict)
    # The errors themselves, for the stage to record (a refusal such as out of memory is evidence).
    errors: dict[str, PipelineError] = field(default_factory=dict, repr=False)
    # What the rounds stopped on (rounds.stopping_rule): the catalog's ranking's name, or "median"
    # where it was energy and fewer than two engines could be read; None: the catalog's.
    stopped_by: str | None = None

    def record(self, entrant: str) -> RoundsRecord:
        how, why_not = self.energy.get(entrant, (None, None))
        return RoundsRecord(
            group=self.group,
            entrant=entrant,
            entrants=self.entrants,
            takes=self.takes[entrant],
            rounds=self.rounds,
            stop=self.stop,
            elapsed_s=round(self.elapsed_s, 3),
            take_ms=self.settings.take_ms,
            take_runs=self.settings.take_runs,
            round_ms=self.settings.round_ms,
            short_rounds=self.short_rounds,
            min_rounds=self.settings.min_rounds,
            budget_s=self.settings.budget_s,
            tie=self.settings.tie,
            seed=self.seed,
            default_sm_clock_mhz=self.default_sm_clock_mhz,
            failed=self.failed,
            raced_out=self.raced_out,
            raced_out_by=self.raced_out_by,
            host_alone_probe_ms=None if self.host_alone_probe_ms is None else round(self.host_alone_probe_ms, 6),
            host_alone_from=self.host_alone_from,
            host_noise=None if self.host_noise is None else round(self.host_noise, 4),
            host_held=self.host_held,
            energy=how,
            energy_why_not=why_not,
        )
