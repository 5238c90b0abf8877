"""The measurement of a shape point: its engines prepared, checked and timed, and each profile given
what it measured to record.

This is the one room where a point's engines are measured, whoever asks (a local run, a cluster's
task, a profile asked for alone):

- Every engine is prepared once — an engine that runs in this process (PyTorch, ONNX Runtime)
  loaded, compiled, captured and warmed — and its accuracy checked on the point's reference batch.
- Then all of them are timed by the protocol in pipeline/measuring/rounds.py: one take each per round,
  in a seeded random order, until the comparisons the verdict needs are decided or the point's
  budget is spent. An engine a tool times in a process of its own (trtexec, the TensorRT-RTX driver)
  takes part by a short run of the tool per take (pipeline/runtimes/base.py, ToolTakes).
- ``--repeat N`` measures the group N times, the first here and each other one in a fresh process
  (``_in_fresh_process``), as independent measurements whose medians show how repeatable the
  numbers are.
- A tool's engine with nothing beside it is measured as the tool alone would measure it: ``repeats``
  whole runs of the tool, taken again (up to ``retakes`` times) while their medians disagree.

The group is measured as a whole: when any of its profiles must run (new settings, a rebuilt
engine), all of them are measured again, so that every engine of the point shares one set of
rounds. Each profile (pipeline/stages/profile.py) then records what it was given: its own takes and
the group they were measured in, so a report pairs them round by round.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.launchers.child import Child, answer_with
from pipeline.machine.environment import machine_load, measuring_gpu, running_on
from pipeline.manifest import StageRecord
from pipeline.measuring.energy import Energy
from pipeline.measuring.host_rounds import HostRounds
from pipeline.measuring.machine_watch import MachineWatch
from pipeline.measuring.records import RoundsRecord
from pipeline.measuring.rounds import helper_processes, measure_in_rounds
from pipeline.measuring.sm_clock import SmClock
from pipeline.measuring.stats import LatencyStats
from pipeline.measuring.stopping import stop_words
from pipeline.running.errors import DeviceFault, EnvironmentMissing, PipelineError
from pipeline.runtimes.base import ProfileResult
from pipeline.stages.serving import serve_point

# Seconds a repeat's process has to end after an interruption before it is killed.
STOP_GRACE_S = 10


@dataclass
class Measured:
    """What one profile's engine measured: a result per measurement (in rounds: the first in this
    process, the others in fresh ones; a tool alone: each run of the tool), what the machine did
    meanwhile and its load when the measurement started, the rounds' records (none for a tool alone),
    the engine's accuracy, and the medians of measurements taken again because they disagreed (a
    tool alone)."""

    results: list[ProfileResult]
    watched: list[dict]
    load_at_start: dict
    rounds: list[RoundsRecord]
    accuracy: tuple[Any, str | None, Any]
    retaken: list[list[float]] = field(default_factory=list)
    # The GPU the point was measured on (environment.measuring_gpu), None without one.
    gpu_device: dict[str, Any] | None = None
    # The wall time the measurement took: the rounds' (shared with the point's other engines), or
    # the tool's runs alone. What the profile's line reports, not the instant it took to record it.
    seconds: float | None = None
    # What preparing the engine at its point cost before the rounds (ProfileDetails.preparation_s),
    # and whether that was done ahead of the point, while the run waited (prepare_points_ahead).
    preparation_s: dict[str, float] = field(default_factory=dict)
    prepared_ahead: bool = False
    # Its runs at each stream count after the rounds, where the settings serve (pipeline/stages/serving.py).
    served: list = field(default_factory=list)
    # The machine's load when the measurement ended: read once for a point's engines, whose rounds
    # (and serving) ended together (two nvidia-smi calls an engine cost the seed matrix ~0.5 s a
    # point). None: read when the profile is recorded (a tool's engine measured alone).
    load_at_end: dict | None = None


def profile_point(stages: list) -> dict[Any, StageRecord | PipelineError]:
    """Run the profiles (ProfileStage) of one shape point as one group: measure them if any must
    run, then let each record its result. What each recorded, or the error that stopped it (a
    refusal — a capture refused — is recorded in its manifest as failed; out of memory as a result
    of its own). A kernel that faults is recorded for the engine it is pinned to and raised: the
    process can time nothing more (pipeline/running/faults.py)."""
    # A result kept without a number (out of memory, a fault) is not measured again beside the
    # others when they are: it would only run out, or fault, again; --force tries it.
    measuring = _measured(stages)
    measured = measure_point(measuring) if measuring else {}
    fault = next((stage for stage, result in measured.items() if isinstance(result, DeviceFault)), None)
    if fault is not None:  # recorded for its engine, then raised: this process can time nothing more
        fault.run(force=True, measured=measured[fault])
    out: dict[Any, StageRecord | PipelineError] = {}
    for stage in stages:
        try:
            out[stage] = stage.run(force=stage in measuring, measured=measured.get(stage))
        except EnvironmentMissing:
            raise
        except PipelineError as exc:
            out[stage] = exc
    return out


def measure_point(stages: list) -> dict[Any, Measured | PipelineError]:
    """Prepare every profile's engine and check its accuracy, then time them: in rounds, or a tool's
    engine alone as the tool would. Each profile's measurement, or why it has none."""
    if not stages:
        return {}
    if len(stages) == 1 and not stages[0].runtime.measures_in_this_process:
        stage = stages[0]
        try:
            return {stage: _tool_alone(stage)}
        except EnvironmentMissing:
            raise
        except PipelineError as exc:
            return {stage: exc}
    return _in_rounds(stages)


def entrant_name(stage) -> str:
    """How the rounds name an engine: "fp16/torch-compile"."""
    return f"{stage.engine.variant}/{stage.toolchain}"


def point_seed(stages: list) -> int:
    """The rounds' order is drawn from a generator seeded by the model and the shape point: the
    same order each time the same point is measured."""
    first = stages[0]
    return zlib.crc32(f"{first.engine.model}@{first.shape}".encode())


def baseline_entrants(catalog, stages: list) -> frozenset[str]:
    """The engines of the catalog's baseline toolchain: they stay in every round when racing, so
    that every speedup over them keeps its paired interval."""
    return frozenset(entrant_name(stage) for stage in stages if stage.toolchain == catalog.baseline_toolchain)


# --- in rounds --------------------------------------------------------------------------------------


def _in_rounds(stages: list) -> dict[Any, Measured | PipelineError]:
    ctx, settings = stages[0].ctx, stages[0].settings
    reporter = ctx.reporter
    out: dict[Any, Measured | PipelineError] = {}
    engines, prepared = {}, {}
    load_at_start, gpu_device = machine_load(), measuring_gpu()
    label = f"{stages[0].engine.model}{f' at {stages[0].shape}' if stages[0].shape else ''}"
    working = reporter.working("profile", f"{label} ({len(stages)} engine{'s' if len(stages) > 1 else ''} in rounds)")
    with working, HostRounds(on_wait=reporter.progress) as held:
        # Preparing is CPU work that would slow another point's launch-bound rounds: it holds the
        # host shared, and the rounds hold it as their engines need (pipeline/measuring/host_rounds.py).
        held.share()
        for stage in stages:
            ahead, stage.ahead = stage.ahead, None
            try:
                ready = ahead or _prepared_and_checked(stage)
            except EnvironmentMissing:
                raise
            except DeviceFault as exc:  # the process is poisoned: this engine's result, and no more
                return {stage: exc}
            except PipelineError as exc:
                out[stage] = exc
                continue
            engines[entrant_name(stage)] = ready[0]
            prepared[stage] = (*ready, ahead is not None)
        if not engines:
            return out
        reporter.measuring(f"{len(engines)} engine(s) in rounds")
        uuid = gpu_device["uuid"] if gpu_device else None
        with MachineWatch(gpu_uuid=uuid, helpers=helper_processes(engines)) as watch, running_on(settings.host_cpus):
            clock = SmClock(uuid)
            try:
                stays = baseline_entrants(ctx.catalog, stages)
                seed, energy = point_seed(stages), Energy.where_asked(settings.reads_energy, uuid)
                outcome = measure_in_rounds(engines, settings, seed, reporter.progress, clock, held=held, stays=stays, energy=energy)
            except DeviceFault as exc:  # pinned to the engine whose take saw it (every take waits for its GPU work)
                return {next(stage for stage in prepared if entrant_name(stage) == exc.entrant): exc}
        held.release()  # each repeat's process holds the host for itself
        for words in stop_words(outcome):  # once for the point: the engines' manifests say so each (rounds[].stop)
            reporter.warn(f"{label}: {words}")
        repeats = [(outcome, None)]
        try:
            for number in range(2, settings.repeats + 1):
                reporter.detail(f"{label}: measurement {number} of {settings.repeats}, in a fresh process")
                reporter.measuring(f"measurement {number} of {settings.repeats}, in a fresh process")
                repeats.append(_in_fresh_process(list(prepared), settings))
        except EnvironmentMissing:
            raise
        except DeviceFault as exc:  # in the repeat's process: the engine it was pinned to there
            faulted = next((stage for stage in prepared if entrant_name(stage) == exc.entrant), None)
            if faulted is not None:
                return {faulted: exc}
            return {**out, **dict.fromkeys(prepared, PipelineError(exc.message, exc.hint))}
        except PipelineError as exc:  # the group's repeat failed: every engine of it is without its figures
            return {**out, **dict.fromkeys(prepared, exc)}
        # Serving after every measurement of the rounds, never between them; its threads or
        # processes keep the host's CPUs busy, so it holds the host alone, as launch-bound rounds do.
        servers = {stage: ready[0] for stage, ready in prepared.items() if entrant_name(stage) not in outcome.errors}
        try:
            with running_on(settings.host_cpus), HostRounds(on_wait=reporter.progress) as alone:
                if settings.serves:
                    alone.take_whole()
                served = serve_point(servers, settings, reporter, point_seed(stages))
        except DeviceFault as exc:
            faulted = next((stage for stage in servers if entrant_name(stage) == exc.entrant), None)
            return {faulted: exc} if faulted is not None else {**out, **dict.fromkeys(prepared, PipelineError(exc.message, exc.hint))}
    load_at_end = machine_load()
    for stage, (engine, accuracy, cost, ahead) in prepared.items():
        key = entrant_name(stage)
        if key in outcome.errors:  # recorded in its manifest where it is a refusal (out of memory)
            out[stage] = outcome.errors[key]
            continue
        results, records = [], []
        try:
            for number, (rounds, evidence) in enumerate(repeats):
                said = engine.evidence() if number == 0 else evidence[key]
                results.append(_of_takes(said, rounds.times_ms[key], rounds.elapsed_s))
                records.append(rounds.record(key))
        except PipelineError as exc:
            out[stage] = exc
            continue
        seconds = sum(record.elapsed_s for record in records)
        watched = [watch.summary] * len(repeats)
        out[stage] = Measured(
            results,
            watched,
            load_at_start,
            records,
            accuracy,
            gpu_device=gpu_device,
            seconds=seconds,
            preparation_s=cost,
            prepared_ahead=ahead,
            served=served.get(stage, []),
            load_at_end=load_at_end,
        )
    return out


def _prepared_and_checked(stage) -> tuple[Any, Any, dict[str, float]]:
    """The profile's engine prepared at its point and its accuracy checked: (engine, accuracy, what
    each cost, ProfileDetails.preparation_s)."""
    reporter, settings = stage.ctx.reporter, stage.settings
    reporter.step(f"preparing {entrant_name(stage)}")
    engine_path, workload = stage.engine_file(), stage.workload()
    with running_on(settings.host_cpus):
        started = time.perf_counter()
        engine = stage.runtime.prepare(engine_path, workload)
        reporter.step(f"checking {entrant_name(stage)}'s outputs on the reference batch")
        checked = time.perf_counter()
        accuracy = stage.check_accuracy(engine_path, workload)
    return engine, accuracy, {"prepare": round(checked - started, 3), "check": round(time.perf_counter() - checked, 3)}


def prepare_points_ahead(points: list[list], room: Callable[[], str | None]) -> int:
    """Every engine of the run's shape points that is prepared in this process and has no work
    ahead of its own (eager, CUDA graphs, ONNX Runtime: EngineRuntime.builds_long) prepared and
    checked now, while the run waits for its work ahead (compiling, pipeline/stages/runner.py),
    instead of between one point's rounds and the next's: each point's profile then starts with
    its engines ready. Only the profiles that will measure (profile_point's choice), and only
    while ``room()`` says there is room (None; else why not): what is prepared holds memory until
    its point. A point that fails here is left to its profile, which prepares it again and records
    what it finds; a kernel fault is recorded for its engine and raised, as a point's measurement
    does (this process is replaced). How many were prepared."""
    count = 0
    for stages in points:
        for stage in _measured(stages):
            if not stage.runtime.measures_in_this_process or stage.runtime.builds_long or stage.ahead is not None:
                continue
            why = room()
            if why is not None:
                stage.ctx.reporter.progress(f"engines left to their profiles from {stage.progress_label} on: {why}")
                return count
            try:
                stage.ahead = _prepared_and_checked(stage)
                count += 1
            except EnvironmentMissing:
                raise
            except DeviceFault as exc:
                stage.run(force=True, measured=exc)
                raise
            except PipelineError as exc:
                stage.ctx.reporter.progress(f"not prepared ahead: {stage.progress_label}: {exc.message}")
    return count


def _measured(stages: list) -> list:
    """The profiles of one point that its measurement prepares: all that can run and have no result
    kept without a number, where any of them must run (profile_point)."""
    runnable = [stage for stage in stages if stage.skip_reason() is None and not stage.kept_outcome()]
    return runnable if any(not stage.is_current() for stage in runnable) else []


def _of_takes(said: dict[str, Any], times_ms: list[float], elapsed_s: float) -> ProfileResult:
    if not times_ms:
        raise PipelineError(
            "every take of the rounds was dropped: the GPU's clock stayed below three quarters of its default (throttled)",
            hint="let the GPU cool or lift its power cap, then profile again; `nvidia-smi -q -d PERFORMANCE` says why it throttles",
        )
    return ProfileResult.of_takes(said, times_ms, elapsed_s)


# --- a tool alone ------------------------------------------------------------------------------------


def _tool_alone(stage) -> Measured:
    """``repeats`` whole runs of the tool, each watched (pipeline/measuring/machine_watch.py), taken again
    while their medians disagree by more than ``max_repeat_cv`` (at most ``retakes`` times); then
    the engine's accuracy on the reference batch."""
    reporter = stage.ctx.reporter
    engine_path, workload = stage.engine_file(), stage.workload()
    started = time.perf_counter()
    with reporter.working("profile", stage.progress_label):
        measured = _tool_runs(stage, engine_path, workload)
        measured.accuracy = stage.check_accuracy(engine_path, workload)
        with running_on(stage.settings.host_cpus):
            engine = stage.runtime.prepare(engine_path, workload)
            measured.served = serve_point({stage: engine}, stage.settings, reporter, point_seed([stage])).get(stage, [])
    measured.seconds = time.perf_counter() - started
    return measured


def _tool_runs(stage, engine_path: Path, workload) -> Measured:
    settings, reporter = stage.settings, stage.ctx.reporter
    retaken: list[list[float]] = []
    load_at_start, gpu_device = machine_load(), measuring_gpu()
    gpu_uuid = gpu_device["uuid"] if gpu_device else None
    while True:
        results, watched = [], []
        for run in range(settings.repeats):
            if settings.repeats > 1 or retaken:
                again = f", take {len(retaken) + 1}" if retaken else ""
                reporter.detail(f"{stage.engine.name}: measurement {run + 1} of {settings.repeats}{again}")
                reporter.measuring(f"measurement {run + 1} of {settings.repeats}{again}")
            with MachineWatch(gpu_uuid=gpu_uuid) as watch, running_on(settings.host_cpus):
                results.append(stage.runtime.profile(engine_path, settings, workload))
            watched.append(watch.summary)
        medians = [round(LatencyStats.from_values(r.per_iteration_ms).median, 6) for r in results]
        repeat_cv = LatencyStats.from_values(medians).cv if len(medians) > 1 else None
        if repeat_cv is None or repeat_cv <= settings.max_repeat_cv or len(retaken) >= settings.retakes:
            break
        retaken.append(medians)
        reporter.warn(
            f"{stage.engine.name}: the {len(medians)} measurements disagree (medians {min(medians):.3f}–{max(medians):.3f} ms, "
            f"CV {repeat_cv:.2%} > {settings.max_repeat_cv:.0%}): taking them again ({len(retaken)} of {settings.retakes})"
        )
    return Measured(results, watched, load_at_start, [], (None, None, None), retaken, gpu_device=gpu_device)


# --- a repeat in a fresh process ---------------------------------------------------------------------
#
# Measuring again in the same process would repeat whatever lives in the process: the allocator's
# state, a compiled graph and the autotuning it chose, a thread pool, a warmed cache. So each repeat
# after the first runs in a new interpreter that loads, prepares and times the engines from scratch,
# in rounds, as the best benchmark harnesses do; a tool's engines take part there by short runs of
# the tool, as in the first measurement.


def _in_fresh_process(stages: list, settings):
    """The group measured again in a new interpreter: (RoundsOutcome, each engine's evidence by name)."""
    ctx = stages[0].ctx
    members = [(entrant_name(stage), stage.toolchain, stage.engine_file(), stage.workload()) for stage in stages]
    child = Child(_fresh_process, ctx.catalog, members, settings, point_seed(stages), ctx.reporter.verbose, name="pipeline-repeat")
    names = ", ".join(name for name, *_ in members)
    return child.start().result(f"repeating the measurement of {names}", STOP_GRACE_S)


def _fresh_process(channel, catalog, members: list[tuple[str, str, Path, Any]], settings, seed: int, verbose: bool) -> None:
    answer_with(channel, lambda: _measured_again(catalog, members, settings, seed, verbose))


def _measured_again(catalog, members: list[tuple[str, str, Path, Any]], settings, seed: int, verbose: bool):
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import create_runtime

    reporter = Reporter(verbose=verbose)
    runtimes: dict[str, Any] = {}
    engines = {}
    with running_on(settings.host_cpus), HostRounds() as held:
        held.share()  # preparing, as in the first measurement
        for name, toolchain, engine_path, workload in members:
            if toolchain not in runtimes:
                runtimes[toolchain] = create_runtime(toolchain, catalog.toolchain(toolchain), reporter, catalog.root)
            try:
                engines[name] = runtimes[toolchain].prepare(engine_path, workload)
            except DeviceFault as exc:
                exc.pinned_to(name)  # the engine being prepared
                raise
        gpu = measuring_gpu()
        stays = frozenset(name for name, toolchain, _, _ in members if toolchain == catalog.baseline_toolchain)
        uuid = gpu["uuid"] if gpu else None
        outcome = measure_in_rounds(
            engines, settings, seed, None, SmClock(uuid), held=held, stays=stays, energy=Energy.where_asked(settings.reads_energy, uuid)
        )
    evidence = {name: engine.evidence() for name, engine in engines.items() if name not in outcome.failed}
    outcome.errors = {name: error.plain() for name, error in outcome.errors.items()}
    return outcome, evidence
