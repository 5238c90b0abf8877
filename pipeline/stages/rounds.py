"""The engines of one shape point, timed together in rounds.

Every profile of a run at a shape point is prepared once — an engine that runs in this process
(PyTorch, ONNX Runtime) loaded, compiled, captured and warmed; every one's accuracy checked —
then all of them are measured by the protocol in pipeline/measurement.py: one take each per round,
in a seeded random order, until the comparisons the verdict needs are decided or the point's budget
is spent. An engine a tool times in a process of its own (trtexec, the TensorRT-RTX driver) takes
part by a short run of the tool per take (pipeline/runtimes/base.py, ToolTakes). Each profile's
manifest then keeps its own takes and the group they were measured in, so a report pairs them round
by round. A profile asked for alone is a group of one; a tool's engine alone is one whole
measurement by the tool, as `trtexec` alone would make it.

The group is measured as a whole: when any of its profiles must run (new settings, a rebuilt
engine), all of them are measured again, so that every engine of the point shares one set of
rounds. `--repeat N` measures the group N times, the first here and each other one in a fresh
process, as independent measurements whose medians show how repeatable the numbers are.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.environment import running_on
from pipeline.errors import EnvironmentMissing, PipelineError
from pipeline.machine_watch import MachineWatch
from pipeline.measurement import RoundsOutcome, RoundsRecord, SmClock, measure_in_rounds, open_pair_words, undecided
from pipeline.runtimes.base import EngineRuntime, ProfileResult

if TYPE_CHECKING:
    from pipeline.stages.profile import ProfileStage


@dataclass
class Measured:
    """What the rounds gave one profile: a result per measurement of the group (the first in this
    process, the others in fresh ones), what the machine did meanwhile, the rounds' records and the
    engine's accuracy, checked while it was prepared."""

    results: list[ProfileResult]
    watched: list[dict]
    rounds: list[RoundsRecord]
    accuracy: tuple[Any, str | None, Any] | None = None


def entrant_name(stage: ProfileStage) -> str:
    """How the rounds name an engine: "fp16/torch-compile"."""
    return f"{stage.engine.variant}/{stage.toolchain}"


def point_seed(stages: list[ProfileStage]) -> int:
    """The rounds' order is drawn from a generator seeded by the model and the shape point: the
    same order each time the same point is measured."""
    first = stages[0]
    return zlib.crc32(f"{first.engine.model}@{first.shape}".encode())


def profile_together(stages: list[ProfileStage]) -> list[tuple[ProfileStage, PipelineError]]:
    """Run the profiles of one shape point as one group; the failures, each recorded in its own
    manifest where it is a refusal (out of memory, a capture refused)."""
    failures: list[tuple[ProfileStage, PipelineError]] = []
    runnable = [stage for stage in stages if stage.skip_reason() is None]
    stale = [stage for stage in runnable if not stage.is_current()]
    # A tool's engine with nothing beside it is one whole measurement by the tool (its own run).
    alone_in_a_tool = len(runnable) == 1 and not runnable[0].runtime.measures_in_this_process
    measured = measure_together(runnable) if stale and not alone_in_a_tool else {}
    for stage in stages:
        stage.measured = measured.get(stage)
        try:
            stage.run(force=bool(stale) and stage in runnable)
        except EnvironmentMissing:
            raise
        except PipelineError as exc:
            failures.append((stage, exc))
    return failures


def measure_together(stages: list[ProfileStage]) -> dict[ProfileStage, Measured | PipelineError]:
    """Prepare every profile's engine and check its accuracy, then time them in rounds."""
    if not stages:
        return {}
    ctx, settings = stages[0].ctx, stages[0].settings
    reporter = ctx.reporter
    out: dict[ProfileStage, Measured | PipelineError] = {}
    engines, prepared = {}, {}
    label = f"{stages[0].engine.model}{f' at {stages[0].shape}' if stages[0].shape else ''}"
    with reporter.working("profile", f"{label} ({len(stages)} engine{'s' if len(stages) > 1 else ''} in rounds)"):
        for stage in stages:
            runtime: EngineRuntime = stage.runtime
            try:
                reporter.step(f"preparing {entrant_name(stage)}")
                engine_path, workload = stage.engine_file(), stage.workload()
                with running_on(settings.host_cpus):
                    engine = runtime.prepare(engine_path, workload)
                    reporter.step(f"checking {entrant_name(stage)}'s outputs on the reference batch")
                    accuracy = stage.check_accuracy(engine_path, workload)
            except EnvironmentMissing:
                raise
            except PipelineError as exc:
                out[stage] = exc
                continue
            engines[entrant_name(stage)] = engine
            prepared[stage] = (engine, accuracy)
        if not engines:
            return out
        reporter.step(f"{len(engines)} engine(s) in rounds")
        with MachineWatch() as watch, running_on(settings.host_cpus):
            outcome = measure_in_rounds(engines, settings, point_seed(stages), reporter.progress, SmClock())
        if outcome.stop == "budget":  # once for the point: the engines' manifests say so each (rounds[].stop)
            reporter.warn(f"{label}: {undecided_words(outcome)}")
        repeats = [(outcome, None)]
        try:
            for number in range(2, settings.repeats + 1):
                reporter.detail(f"{label}: measurement {number} of {settings.repeats}, in a fresh process")
                reporter.step(f"measurement {number} of {settings.repeats}, in a fresh process")
                repeats.append(_in_fresh_process(list(prepared), settings))
        except EnvironmentMissing:
            raise
        except PipelineError as exc:  # the group's repeat failed: every engine of it is without its figures
            return {**out, **dict.fromkeys(prepared, exc)}
    for stage, (engine, accuracy) in prepared.items():
        key = entrant_name(stage)
        if key in outcome.errors:  # recorded in its manifest where it is a refusal (out of memory)
            out[stage] = outcome.errors[key]
            continue
        results, records = [], []
        for number, (rounds, evidence) in enumerate(repeats):
            said = engine.evidence() if number == 0 else evidence[key]
            results.append(_result(said, rounds.times_ms[key], rounds.elapsed_s))
            records.append(rounds.record(key))
        out[stage] = Measured(results, [watch.summary] * len(repeats), records, accuracy)
    return out


def undecided_words(outcome: RoundsOutcome) -> str:
    """What the budget left open: "undecided after 8 rounds (budget_s = 30): bf16/torch-compile
    against bf16/torch-reduce-overhead undecided (0.981–1.034)"."""
    open_pairs = undecided({k: v for k, v in outcome.takes.items() if k not in outcome.failed}, outcome.settings.tie)
    pairs = "; ".join(open_pair_words(*pair) for pair in open_pairs)
    return f"undecided after {outcome.rounds} rounds (budget_s = {outcome.settings.budget_s:g})" + (f": {pairs}" if pairs else "")


def _result(said: dict[str, Any], times_ms: list[float], elapsed_s: float) -> ProfileResult:
    if not times_ms:
        raise PipelineError(
            "every take of the rounds was dropped: the GPU's clock stayed below three quarters of its default (throttled)",
            hint="let the GPU cool or lift its power cap, then profile again; `nvidia-smi -q -d PERFORMANCE` says why it throttles",
        )
    return ProfileResult.of_takes(said, times_ms, elapsed_s)


def _in_fresh_process(stages: list[ProfileStage], settings):
    """The group measured again in a new interpreter (pipeline/stages/fresh_measurement.py)."""
    from pipeline.stages.fresh_measurement import measure_group_in_fresh_process

    ctx = stages[0].ctx
    members = [(entrant_name(stage), stage.toolchain, stage.engine_file(), stage.workload()) for stage in stages]
    return measure_group_in_fresh_process(ctx.catalog, members, settings, point_seed(stages), ctx.reporter.verbose)
