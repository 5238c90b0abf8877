"""How often the product's answer and its claims about pairs are wrong, measured by running its
own procedure on engines whose truth is known.

The rounds loop (pipeline/measuring/rounds.py, ``rounds_loop``) times synthetic engines on a clock of
their own, with the noise shapes measured on this project's machines and on the lent GPUs; the
takes go through the same rows (pipeline/report/rows.py), the same verdict
(pipeline/report/verdict.py) and the same sweep (pipeline/report/sweep.py) as a real run's
manifests. Each point is then checked against the truth:

* **wrong fastest**: the answer (the fastest, with any engines it is tied or undecided with) holds
  no engine within the tie band of the truly fastest one;
* **false claim**: some claim the output makes about a pair is false. The claims are every
  comparison of the verdict (what the JSON's ``comparisons`` list, each with its ``outcome``) and
  every comparison a crossover sentence is made of, read as the output words them: "faster"
  beyond the tie band (the true ratio must lie below the band), "faster" by less or more than the
  tie width (``at_band_edge``: the true ratio must lie below 1), "the same" (the true ratio must
  lie within the band); "slower" alike; "ambiguous" claims nothing. Every pair of the point and
  every look at the data count: a point with any false claim is one error.

Both are rates of points, to be at or below the 5 % the output's "95 % confidence" claims; each
is printed with its exact one-sided 95 % upper bound over the simulated points (Clopper–Pearson).

A second table measures racing's early rule (pipeline/measuring/stopping.py, ``grossly_slower``),
which no interval backs: how often it drops an engine that is not beyond the tie band slower than
the fastest (a **false drop**), or the fastest itself, with a third engine 1x to 5x the fastest.
The true ratio of two engines is the median of their per-round ratio under the same noise, from a
long run (what the paired rounds estimate); with spells that slow only launch-bound engines it is
not their speeds' ratio.

    python scripts/simulate_confidence.py             # the tables docs/confidence.md shows
    python scripts/simulate_confidence.py --points 100  # quicker, coarser
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass, field, fields, replace
from types import SimpleNamespace

from pipeline.catalog import ProfileSettings
from pipeline.measuring.host_speed import HostTake
from pipeline.measuring.pace import HOST_LATENCY, take_length
from pipeline.measuring.rounds import RoundsOutcome, rounds_loop
from pipeline.measuring.stats import at_band_edge, median, tie_band
from pipeline.measuring.stopping import GROSS
from pipeline.precision.bounds import exact_upper
from pipeline.report.flags import launch_bound_flag
from pipeline.report.row_times import take_rounds
from pipeline.report.rows import ComparisonRow
from pipeline.report.sweep import sweeps
from pipeline.report.verdict import verdicts

BASELINE = "torch-eager"
# Points per scenario, noise and rule: the table in docs/confidence.md, which CI prints again.
POINTS = 150
SETTINGS = ProfileSettings()  # the catalog's defaults: take_ms 100, round_ms 1000, min_rounds 6, budget_s 30, tie 0.03


# --- the host: noise shapes measured here ---------------------------------------------------------


@dataclass
class Spells:
    """A host that runs at one of two speeds in spells: ``slow`` times slower for a spell of
    ``shortest_s``–``longest_s`` seconds, then at full speed for another (the CI VM's probe at 1.65
    or 2.7 ms in spells of 0.5–3 s; the lent GPUs' vCPUs 1.8× apart every 0.5–4 s)."""

    slow: float
    shortest_s: float
    longest_s: float
    # The fast spells' length against the slow ones' (2: the host is slow a third of the time).
    fast_longer: float
    rng: random.Random
    _ends: list[float] = field(default_factory=list)
    _slow: list[bool] = field(default_factory=list)

    def slow_share(self, start_s: float, end_s: float) -> float:
        """The share of [start, end) the host ran slow."""
        while not self._ends or self._ends[-1] < end_s:
            begin = self._ends[-1] if self._ends else 0.0
            slow = not self._slow[-1] if self._slow else self.rng.random() < 0.5
            self._ends.append(begin + self.rng.uniform(self.shortest_s, self.longest_s) * (1.0 if slow else self.fast_longer))
            self._slow.append(slow)
        slow, begin = 0.0, 0.0
        for end, is_slow in zip(self._ends, self._slow):
            if end > start_s and begin < end_s and is_slow:
                slow += min(end, end_s) - max(begin, start_s)
            begin = end
            if begin >= end_s:
                break
        return slow / (end_s - start_s)


@dataclass
class Noise:
    """How a take's runs depart from the engine's true time: ``jitter`` (a log-normal sigma per
    take, common to its runs) and, with ``spells``, the host's slow spells on the engines that
    follow the host. The lent GPUs' measured shapes add, on the launch-bound engines, each run's
    own spread (``run_spread``, a log-normal sigma: 0.37 is a quartile spread of half the median)
    and stalls (a run ``stall`` times slower, with probability ``stall_p``), and on every engine a
    drift of the GPU's speed over the point (up to ``drift``, growing over its first 30 s)."""

    name: str
    jitter: float
    spells: tuple[float, float, float, float] | None = None  # Spells: (slow, shortest_s, longest_s, fast_longer)
    # Whether the spells slow every engine (all timed on the CPU) or the launch-bound ones only.
    every_engine: bool = False
    run_spread: float = 0.0
    stall_p: float = 0.0
    stall: tuple[float, float] = (5.0, 20.0)
    drift: float = 0.0
    # The shapes of GPU-bound engines on the lent GPUs (docs/confidence.md, measured from the seed
    # matrix's takes): each take's own jitter (``gpu_jitter``, a log-normal sigma, in place of
    # ``jitter``), a share of takes slowed by a dip of the GPU's clock (``dip_p`` of them, by
    # ``dip``: above the three quarters of the default clock at which a take is dropped), and the
    # first run of a take slower after another engine's take (by up to ``first_run``).
    gpu_jitter: float | None = None
    dip_p: float = 0.0
    dip: tuple[float, float] = (1.01, 1.06)
    first_run: float = 0.0


NOISES = (
    Noise("independent, 1 %", 0.01),
    Noise("independent, 3 %", 0.03),
    Noise("CI VM: two speeds 1.64x apart, spells 0.5-3 s", 0.01, (1.64, 0.5, 3.0, 1.0), every_engine=True),
    Noise("lent GPU: 1.8x spells on launch-bound engines only", 0.01, (1.8, 0.5, 2.0, 2.0)),
    Noise(
        "lent GPU as measured: runs spread to 50 %, stalls 5-20x, drift, 1.5x spells 15 % of the time",
        0.01,
        (1.5, 0.5, 4.0, 17 / 3),
        run_spread=0.37,
        stall_p=0.01,
        drift=0.08,
    ),
    Noise(
        "lent GPU, GPU-bound engines as measured: takes spread 1 %, 15 % of them 1-6 % slower (clock dips), "
        "a first run up to 30 % slower, drift; 1.8x spells on launch-bound engines",
        0.01,
        (1.8, 0.5, 2.0, 2.0),
        drift=0.05,
        gpu_jitter=0.01,
        dip_p=0.15,
        first_run=0.3,
    ),
)


class Clock:
    def __init__(self):
        self.s = 0.0

    def __call__(self) -> float:
        return self.s


# The host's time to issue a run over the run's GPU time, as a take records it (pace.issue_share):
# a launch-bound engine's host needs all of it, a GPU-bound one's a tenth.
LAUNCH_BOUND_SHARE, GPU_BOUND_SHARE = 1.0, 0.1


def timing_under(noise: Noise) -> str:
    """What an engine's times are under ``noise``: the host's clock where its spells slow every
    engine (the CI VM's, where engines run on the CPU), else the GPU's."""
    return HOST_LATENCY if noise.every_engine else "GPU time (CUDA events)"


class SyntheticEngine:
    """An engine of known true time: each take lasts at least take_ms, as many runs as fit; each
    run is the true time, times the host's slow factor where it follows the host and the take fell
    mostly in a slow spell, the point's drift and the take's jitter, and (launch-bound) its own
    spread and stalls; (GPU-bound, under a noise with GPU shapes) a dip of the GPU's clock and a
    slow first run. It says how long its host needs to issue a run (``issue_ms``), as a real take
    does, so the rounds know which engines the host's spells move (pace.host_sets_the_pace);
    under a noise whose spells slow every engine, every engine is timed by the host's clock."""

    def __init__(
        self, true_ms: float, follows_host: bool, noise: Noise, clock: Clock, spells: Spells | None, rng: random.Random, drift: float
    ):
        self.true_ms, self.follows_host, self.noise = true_ms, follows_host, noise
        self.clock, self.spells, self.rng, self.drift = clock, spells, rng, drift
        self.timed_s = 0.0  # how long its takes lasted, together
        self.timing = timing_under(noise)
        self.issue_ms = true_ms * (LAUNCH_BOUND_SHARE if follows_host else GPU_BOUND_SHARE)

    def take(self, runs: int, min_ms: float) -> list[float]:
        start = self.clock.s
        lasted_s = max(min_ms, runs * self.true_ms) / 1000.0
        factor = 1.0 + self.drift * min(start / 30.0, 1.0)
        follows = self.follows_host or self.noise.every_engine
        if self.spells is not None and follows and self.spells.slow_share(start, start + lasted_s) > 0.5:
            factor *= self.spells.slow
        gpu_shapes = not self.follows_host and self.noise.gpu_jitter is not None
        if gpu_shapes and self.rng.random() < self.noise.dip_p:
            factor *= self.rng.uniform(*self.noise.dip)
        self.clock.s += lasted_s * factor
        self.timed_s += lasted_s * factor
        jitter = self.noise.gpu_jitter if gpu_shapes else self.noise.jitter
        center = self.true_ms * factor * math.exp(self.rng.gauss(0.0, jitter))
        count = max(3, round(lasted_s * 1000.0 / self.true_ms))
        if gpu_shapes:  # as many runs as fit, the first slower after another engine's take
            runs = [center * (1 + 0.001 * self.rng.gauss(0.0, 1.0)) for _ in range(max(1, round(lasted_s * 1000.0 / self.true_ms)))]
            runs[0] *= 1.0 + self.rng.uniform(0.0, self.noise.first_run)
            return runs
        if not self.follows_host or (self.noise.run_spread == 0 and self.noise.stall_p == 0):
            return [center * (1 + 0.001 * (i - 1)) for i in range(3)]
        out = []
        for _ in range(count):
            run = center * math.exp(self.rng.gauss(0.0, self.noise.run_spread))
            if self.rng.random() < self.noise.stall_p:
                run *= self.rng.uniform(*self.noise.stall)
            out.append(run)
        return out

    def evidence(self) -> dict:
        return {}


class _QuietHost:
    """A host the rounds see as never slowed by its neighbours: the spells are the host's own."""

    alone_ms, source, noise = 1.0, "simulated", 1.0

    def before_take(self) -> None:
        pass

    def after_take(self) -> HostTake:
        return HostTake(slowdown=1.0, others_cpus=None, throttled=0.0)


class _Unheld:
    mode = None


# --- scenarios: engines of known truth ------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A shape point's engines: (name, true ms, follows the host). The first is the baseline
    toolchain's engine (it stays in every round)."""

    name: str
    engines: tuple[tuple[str, float, bool], ...]
    # Compared as if the rounds had stopped at this round (a compare of manifests whose rounds
    # ended there for reasons of their own, a budget or other engines): a look like any other.
    look: int | None = None
    # A point whose contenders the GPU times: run under the noises of GPU-timed engines only (the
    # CI VM's spells slow every engine, each timed on the CPU: no engine there is GPU-bound).
    gpu_bound: bool = False

    def under(self, noise: Noise) -> bool:
        return not (self.gpu_bound and noise.every_engine)


def _engines(times: list[float], launch_bound: list[bool]) -> tuple[tuple[str, float, bool], ...]:
    names = [f"e{i}/{BASELINE if i == 0 else f'chain{i}'}" for i in range(len(times))]
    return tuple(zip(names, times, launch_bound))


def scenarios() -> list[Scenario]:
    """Engines all equal (every claim of a difference is false); a ladder whose neighbours sit on
    the tie band's edge (the hardest case for both errors); and a matrix's point: three contenders
    within 2 % of each other and seven engines 20-80 % slower (where racing pays). Every other
    engine follows the host (launch-bound)."""
    out = []
    for count in (2, 5, 10):
        bound = [i % 2 == 0 for i in range(count)]
        out.append(Scenario(f"{count} equal", _engines([10.0] * count, bound)))
        out.append(Scenario(f"{count} a tie width apart", _engines([10.0 * 1.03**i for i in range(count)][::-1], bound)))
    matrix = [12.0, 10.0, 10.1, 10.2, 14.0, 15.0, 16.0, 17.0, 18.0, 12.5]
    out.append(Scenario("10: 3 within 2 %, 7 slower", _engines(matrix, [i % 2 == 0 for i in range(10)])))
    # Ten equal engines compared after 6 rounds (a real point of ten engines often stops there,
    # decided by its other engines) and after 11 (the first round a pair of ten can be decided).
    ten = _engines([10.0] * 10, [i % 2 == 0 for i in range(10)])
    out += [Scenario(f"10 equal, compared at round {look}", ten, look) for look in (6, 11)]
    # GPU-bound points, whose open pairs keep take_ms once the first round has shown it
    # (pace.host_sets_the_pace): two equal engines; a ladder a tie width apart; and the seed
    # matrix's largest point, its two best 1 % apart, two more 3.5-4.5 % behind, the rest well
    # behind, and its baseline (eager PyTorch) launch-bound and 1.8x the best.
    out.append(Scenario("2 equal, GPU-bound", _engines([10.0, 10.0], [False, False]), gpu_bound=True))
    ladder = [10.0 * 1.03**i for i in range(5)][::-1]
    out.append(Scenario("5 a tie width apart, GPU-bound", _engines(ladder, [False] * 5), gpu_bound=True))
    point = [18.0, 10.0, 10.1, 10.35, 10.45, 17.0, 17.3, 90.0, 75.0, 18.3]
    bound = [True] + [False] * 8 + [True]
    out.append(Scenario("10 at a GPU-bound point: 2 within 1 %, a launch-bound baseline", _engines(point, bound), gpu_bound=True))
    # The seed matrix's small points: the leader a CUDA graph 1 % ahead of another; eager PyTorch
    # (the baseline, in every round), eager attention and torch.compile launch-bound and 4-25x
    # slower, whose rounds keep take_ms once two rounds have shown every open pair with a
    # launch-bound side beyond the host's reach (pace.beyond_the_hosts_reach).
    small = [30.0, 1.2, 1.212, 2.9, 2.95, 7.5, 5.0, 31.0, 31.5, 29.5]
    bound = [True, False, False, False, False, True, True, True, True, True]
    out.append(Scenario("10 at a launch-bound point: the leader 25x the baseline", _engines(small, bound), gpu_bound=True))
    return out


def at_look(outcome: RoundsOutcome, look: int) -> RoundsOutcome:
    """The rounds as a compare would read them had they stopped after ``look`` rounds."""
    takes = {key: [take for take in entries if take.round < look] for key, entries in outcome.takes.items()}
    times = {key: [take.median_ms for take in entries if take.dropped is None] for key, entries in takes.items()}
    rounds = min(look, outcome.rounds)
    elapsed = outcome.elapsed_s * rounds / outcome.rounds
    return replace(outcome, takes=takes, times_ms=times, rounds=rounds, elapsed_s=elapsed, stop="rounds", raced_out={})


# --- one point, and its truth ----------------------------------------------------------------------


def run_point(scenario: Scenario, noise: Noise, seed: int, settings: ProfileSettings = SETTINGS) -> tuple[RoundsOutcome, dict[str, float]]:
    """The point's rounds, and how long each engine's takes lasted together."""
    rng = random.Random(seed)
    clock = Clock()
    spells = Spells(*noise.spells, random.Random(rng.random())) if noise.spells else None
    drift = rng.uniform(0.0, noise.drift)
    engines = {
        name: SyntheticEngine(ms, bound, noise, clock, spells, random.Random(rng.random()), drift) for name, ms, bound in scenario.engines
    }
    stays = frozenset(name for name in engines if name.endswith("/" + BASELINE))
    if scenario.look is not None:  # every engine in every round until then
        settings = settings.model_copy(update={"racing": False, "min_rounds": scenario.look})
    outcome = rounds_loop(engines, settings, random.Random(seed), None, None, _QuietHost(), _Unheld(), {}, now=clock, stays=stays)
    outcome.seed = seed
    timed = {name: engine.timed_s for name, engine in engines.items()}
    if scenario.look is not None:
        share = min(scenario.look, outcome.rounds) / outcome.rounds  # rounds of one length, every engine in each
        outcome, timed = at_look(outcome, scenario.look), {name: seconds * share for name, seconds in timed.items()}
    return outcome, timed


def rows_of(outcome: RoundsOutcome, timing: str) -> list[ComparisonRow]:
    """The rows a compare of the point's manifests would read: their takes, through the product's
    own reading of them, with what they were timed by (``timing``) and the launch-bound flag their
    takes' issue times give (which make a row follow the host: ComparisonRow.follows_the_host)."""
    rows = []
    for entrant in outcome.entrants:
        _, toolchain = entrant.split("/")
        # One variant on many toolchains, so that the sweep sets them against each other too.
        row = ComparisonRow(model="sim", variant="v", toolchain=toolchain, status=f"measured ({timing})", outcome="measured", shape="1x1")
        kept = outcome.times_ms[entrant]
        row.median_ms = median(kept) if kept else None
        record = outcome.record(entrant)
        take_rounds(row, [record])
        row.flags = [flag] if (flag := launch_bound_flag(SimpleNamespace(rounds=[record]))) else []
        rows.append(row)
    return rows


def true_ratios(scenario: Scenario, noise: Noise, rounds: int = 4000) -> dict[tuple[str, str], float]:
    """Each pair's true ratio: the median of its per-round ratio over a long run under the same
    noise, every engine in every round in a random order (what the rounds estimate)."""
    rng = random.Random(10**6)
    clock = Clock()
    spells = Spells(*noise.spells, random.Random(rng.random())) if noise.spells else None
    engines = {
        name: SyntheticEngine(ms, bound, noise, clock, spells, random.Random(rng.random()), noise.drift / 2)
        for name, ms, bound in scenario.engines
    }
    by_round: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        order = list(engines)
        rng.shuffle(order)
        for name in order:
            by_round[name].append(median(engines[name].take(SETTINGS.take_runs, take_length(SETTINGS, len(order)))))
    names = list(engines)
    return {(a, b): median([x / y for x, y in zip(by_round[a], by_round[b])]) for a in names for b in names if a != b}


@dataclass
class Tally:
    points: int = 0
    wrong_fastest: int = 0
    false_claim: int = 0  # points with any false claim about a pair
    claims: int = 0  # claims about pairs made (comparisons and crossovers), and of them false
    false_claims: int = 0
    # Of those, the claims about pairs timed apart (each engine in a set of rounds of its own), and
    # of them false: scripts/simulate_apart.py.
    unpaired_claims: int = 0
    unpaired_false: int = 0
    decided: int = 0
    rounds: int = 0
    seconds: float = 0.0
    # Seconds the contenders (engines truly within the tie band of the fastest) were timed for.
    contenders_s: float = 0.0

    def add(self, other: Tally) -> None:
        for name in (f.name for f in fields(self)):  # every count and every sum of seconds
            setattr(self, name, getattr(self, name) + getattr(other, name))


def claim_is_false(estimate, true: float, tie: float) -> bool | None:
    """Whether what an interval's outcome claims about a pair is false for its true ratio (None:
    it claims nothing): "faster" beyond the band needs the truth below the band, "faster" by less
    or more than the tie width (at the band's edge) the truth below 1, "the same" the truth within
    the band; "slower" alike."""
    if estimate is None or estimate.outcome == "ambiguous":
        return None
    lowest, highest = tie_band(tie)
    if estimate.outcome == "same":
        return not lowest <= true <= highest
    edge = at_band_edge(estimate.low, estimate.high, tie)
    if estimate.outcome == "faster":
        return true >= (1.0 if edge else lowest)
    return true <= (1.0 if edge else highest)


def truly_fastest(entrants: list[str], truth: dict[tuple[str, str], float]) -> str:
    """The engine whose true ratio against every other is least at its worst."""
    return min(entrants, key=lambda e: max(truth[(e, other)] for other in entrants if other != e))


def judge(outcome: RoundsOutcome, timed_s: dict[str, float], truth: dict[tuple[str, str], float], noise: Noise, tie: float) -> Tally:
    rows = rows_of(outcome, timing_under(noise))
    return judge_rows(rows, outcome.entrants, outcome.rounds, outcome.elapsed_s, timed_s, truth, tie)


def judge_rows(
    rows: list[ComparisonRow],
    entrants: list[str],
    rounds: int,
    seconds: float,
    timed_s: dict[str, float],
    truth: dict[tuple[str, str], float],
    tie: float,
) -> Tally:
    """The point's rows (``entrants``, in their order: one set of rounds, or several timed apart)
    through the verdict and the sweep, every claim they make scored against the truth."""
    (verdict,) = verdicts(rows, BASELINE, tie=tie)
    name = {id(row): entrant for row, entrant in zip(rows, entrants)}
    _, highest = tie_band(tie)
    best = truly_fastest(entrants, truth)
    group = [verdict.fastest, *verdict.tied]
    wrong_fastest = not any(name[id(row)] == best or truth[(name[id(row)], best)] <= highest for row in group)
    claims = [(a, b, estimate) for a, b, estimate in verdict.comparisons]
    for sweep in sweeps(rows, [verdict], tie, BASELINE):
        claims += [(lead.second, lead.first, lead.estimate) for lead in sweep.crossover_leads()]
    judged = [(claim_is_false(estimate, truth[(name[id(a)], name[id(b)])], tie), estimate) for a, b, estimate in claims]
    made = [(false, estimate) for false, estimate in judged if false is not None]
    unpaired = [false for false, estimate in made if not estimate.paired]
    contenders = [e for e in entrants if e == best or truth[(e, best)] <= highest]
    return Tally(
        points=1,
        wrong_fastest=int(wrong_fastest),
        false_claim=int(any(false for false, _ in made)),
        claims=len(made),
        false_claims=sum(false for false, _ in made),
        unpaired_claims=len(unpaired),
        unpaired_false=sum(unpaired),
        decided=int(verdict.fastest is not None and not verdict.tied),
        rounds=rounds,
        seconds=seconds,
        contenders_s=sum(timed_s[e] for e in contenders),
    )


RULES = {"every round": SETTINGS.model_copy(update={"racing": False}), "racing": SETTINGS}


def _one_row(job: tuple[int, int, int, int]) -> dict[str, Tally]:
    """One scenario under one noise: ``points`` points under each rule, against one truth."""
    noise_index, scenario_index, points, seed = job
    noise, scenario = NOISES[noise_index], scenarios()[scenario_index]
    truth = true_ratios(scenario, noise)
    tallies = {}
    for rule, settings in RULES.items():
        tally = Tally()
        for index in range(points):
            tally.add(judge(*run_point(scenario, noise, seed * 10**6 + index, settings), truth, noise, settings.tie))
        tallies[rule] = tally
    return tallies


def simulate(points: int, seed: int = 0, workers: int = 2) -> list[tuple[Scenario, Noise, dict[str, Tally]]]:
    """Every scenario under every noise, in ``workers`` processes (each row is seeded on its own,
    so the table is the same however many)."""
    jobs = [(n, i, points, seed) for n in range(len(NOISES)) for i, scenario in enumerate(scenarios()) if scenario.under(NOISES[n])]
    rows = _each(_one_row, jobs, workers)
    return [(scenarios()[i], NOISES[n], tallies) for (n, i, _, _), tallies in zip(jobs, rows)]


def _each(row, jobs: list, workers: int) -> list:
    """``row`` of each job, in ``workers`` processes."""
    from concurrent.futures import ProcessPoolExecutor

    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            return list(pool.map(row, jobs))
    return [row(job) for job in jobs]


# --- the early rule: engines grossly slower, before the interval can act -----------------------------

# The fastest engine's true time, ms: three engines in rounds of a second take a third of a second
# each, which then holds three runs, the fewest a simulated take has (the noisiest take medians).
EARLY_MS = 100.0
# How many times the fastest the third engine truly is (the baseline toolchain's: 4x, and it stays).
EARLY_RATIOS = (1.0, 1.2, 2.0, 3.0, 5.0)
# Points per ratio, noise and engine the host slows: the second table of docs/confidence.md, which CI prints again.
EARLY_POINTS = 300


def early_scenarios() -> list[tuple[Scenario, Scenario]]:
    """Per ratio, a point of three engines: the baseline toolchain's at 4x the fastest
    (launch-bound; it stays), the fastest, and another at the ratio. First the other follows the
    host (its spells, its runs' spread and stalls make it look slower: how an engine within the
    band could be dropped), then the fastest does (how the fastest itself could)."""
    out = []
    for ratio in EARLY_RATIOS:
        pair = [
            Scenario(
                f"{ratio:g}x",
                ((f"e0/{BASELINE}", 4 * EARLY_MS, True), ("e1/chain1", EARLY_MS, fastest), ("e2/chain2", ratio * EARLY_MS, not fastest)),
            )
            for fastest in (False, True)  # which of the two follows the host
        ]
        out.append((pair[0], pair[1]))
    return out


@dataclass
class Drops:
    """What the early rule (stopping.grossly_slower) did at the points, and how rightly; and the
    points judged as the first table judges them."""

    points: int = 0
    left: int = 0  # points where the third engine left by it
    left_after: int = 0  # the rounds those took part in, together
    # Points where it dropped an engine not beyond the tie band slower than the fastest (a false
    # drop: drops says by which readings), and of them those where it dropped the fastest itself.
    false_drop: int = 0
    fastest: int = 0
    judged: Tally = field(default_factory=Tally)

    def add(self, other: Drops) -> None:
        for name in ("points", "left", "left_after", "false_drop", "fastest"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.judged.add(other.judged)


def drops(outcome: RoundsOutcome, scenario: Scenario, truth: dict[tuple[str, str], float], tie: float) -> Drops:
    """The point's early drops, each false where the engine is not beyond the tie band slower than
    the fastest by either reading of "fastest": its true ratio (what the rounds estimate, which a
    launch-bound engine's spells and spread move: 4 % at 1x on the lent GPU as measured) or its
    speed (the scenario's times)."""
    _, highest = tie_band(tie)
    best = truly_fastest(outcome.entrants, truth)
    speed = {name: ms for name, ms, _ in scenario.engines}
    quickest = min(speed.values())
    early = [entrant for entrant, rule in outcome.raced_out_by.items() if rule == GROSS]
    third = outcome.entrants[-1]
    return Drops(
        points=1,
        left=int(third in early),
        left_after=outcome.raced_out[third] if third in early else 0,
        false_drop=int(any(e == best or truth[(e, best)] <= highest or speed[e] <= quickest * highest for e in early)),
        fastest=int(any(e == best or speed[e] == quickest for e in early)),
    )


def _early_row(job: tuple[int, int, int, int]) -> tuple[Drops, Drops]:
    """One ratio under one noise: ``points`` points of each of its two scenarios, racing."""
    noise_index, ratio_index, points, seed = job
    noise = NOISES[noise_index]
    tallies = []
    for scenario in early_scenarios()[ratio_index]:
        truth = true_ratios(scenario, noise)
        tally = Drops()
        for index in range(points):
            outcome, timed = run_point(scenario, noise, seed * 10**6 + index)
            point = drops(outcome, scenario, truth, SETTINGS.tie)
            point.judged = judge(outcome, timed, truth, noise, SETTINGS.tie)
            tally.add(point)
        tallies.append(tally)
    return tallies[0], tallies[1]


def simulate_early(points: int, seed: int = 0, workers: int = 2) -> list[tuple[float, Noise, tuple[Drops, Drops]]]:
    """Every ratio of EARLY_RATIOS under every noise (each row seeded on its own)."""
    jobs = [(n, i, points, seed) for n in range(len(NOISES)) for i in range(len(EARLY_RATIOS))]
    rows = _each(_early_row, jobs, workers)
    return [(EARLY_RATIOS[i], NOISES[n], tallies) for (n, i, _, _), tallies in zip(jobs, rows)]


def pooled_drops(table: list[tuple[float, Noise, tuple[Drops, Drops]]]) -> dict[str, Drops]:
    """Each noise's points together, every ratio and both scenarios."""
    out: dict[str, Drops] = {}
    for _, noise, tallies in table:
        for tally in tallies:
            out.setdefault(noise.name, Drops()).add(tally)
    return out


def markdown_early(table: list[tuple[float, Noise, tuple[Drops, Drops]]]) -> str:
    """One row per noise and ratio; each figure "the third engine launch-bound / the fastest
    launch-bound"; then each noise's false drops over all its points."""

    def both(tallies: tuple[Drops, Drops], figure) -> str:
        return " / ".join(figure(tally) for tally in tallies)

    def left(t: Drops) -> str:
        share = t.left / t.points
        return (f"{share:.0%}" if share == 0 or share >= 0.005 else "<1%") + (f" ({t.left_after / t.left:.1f})" if t.left else "")

    lines = [
        "| noise | third engine | left early (after rounds, mean) | false drop | the fastest dropped | wrong fastest | false claim "
        "| stopped decided |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ratio, noise, tallies in table:
        cells = [
            both(tallies, left),
            both(tallies, lambda t: rate(t.false_drop, t.points)),
            both(tallies, lambda t: rate(t.fastest, t.points)),
            both(tallies, lambda t: rate(t.judged.wrong_fastest, t.points)),
            both(tallies, lambda t: rate(t.judged.false_claim, t.points)),
            both(tallies, lambda t: f"{t.judged.decided / t.points:.0%}"),
        ]
        lines.append(f"| {noise.name} | {ratio:g}x the fastest | " + " | ".join(cells) + " |")
    lines.append("")
    pooled = pooled_drops(table)
    pooled["every noise"] = Drops()
    for name in list(pooled)[:-1]:
        pooled["every noise"].add(pooled[name])
    for name, t in pooled.items():
        false, fastest = exact_upper(t.false_drop, t.points), exact_upper(t.fastest, t.points)
        lines.append(
            f"- {name}: false drops {t.false_drop} of {t.points} points (≤ {false:.2%}), the fastest {t.fastest} (≤ {fastest:.2%})"
        )
    return "\n".join(lines)


def rate(count: int, points: int) -> str:
    """ "2.0% (≤ 5.1%)": a rate of points and its exact one-sided 95 % upper bound."""
    return f"{count / points:.1%} (≤ {exact_upper(count, points):.1%})"


def markdown(table: list[tuple[Scenario, Noise, dict[str, Tally]]]) -> str:
    """One row per scenario and noise; each figure under every rule, "every round / racing"."""

    def rates(tallies: dict[str, Tally], figure) -> str:
        return " / ".join(figure(tally) for tally in tallies.values())

    lines = [
        "| noise | engines | wrong fastest | false claim | claims false (of made) | stopped decided | rounds (mean) "
        "| seconds (mean) | contenders timed (s, mean) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario, noise, tallies in table:
        cells = [
            rates(tallies, lambda t: rate(t.wrong_fastest, t.points)),
            rates(tallies, lambda t: rate(t.false_claim, t.points)),
            rates(tallies, lambda t: f"{t.false_claims} of {t.claims}"),
            rates(tallies, lambda t: f"{t.decided / t.points:.0%}"),
            rates(tallies, lambda t: f"{t.rounds / t.points:.1f}"),
            rates(tallies, lambda t: f"{t.seconds / t.points:.1f}"),
            rates(tallies, lambda t: f"{t.contenders_s / t.points:.1f}"),
        ]
        lines.append(f"| {noise.name} | {scenario.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--points",
        type=int,
        default=POINTS,
        help=f"points per scenario, noise and rule (default {POINTS}, the table docs/confidence.md shows)",
    )
    parser.add_argument(
        "--early-points",
        type=int,
        default=EARLY_POINTS,
        help=f"points per ratio, noise and scenario of the early rule's table (default {EARLY_POINTS})",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    table = simulate(args.points, args.seed, args.workers)
    print(markdown(table))
    early = simulate_early(args.early_points, args.seed, args.workers)
    print("\n" + markdown_early(early))
    points = len(table) * args.points * len(RULES) + len(early) * args.early_points * 2
    print(f"\n{points} points in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
