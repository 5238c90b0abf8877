"""A shape point's engines measured again in a fresh process (`--repeat N`).

Measuring again in the same process would repeat whatever lives in the process: the allocator's
state, a compiled graph and the autotuning it chose, a thread pool, a warmed cache. So each repeat
after the first of the engines that run in the pipeline's own process (ONNX Runtime, PyTorch)
runs in a new interpreter that loads, prepares and times them from scratch, in rounds, as the best
benchmark harnesses do; the engines of a tool that measures in a process of its own (trtexec, the
TensorRT-RTX driver) take part there by short runs of the tool, as in the first measurement.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

# Seconds a repeat's process has to end after an interruption before it is killed.
STOP_GRACE_S = 10


def measure_group_in_fresh_process(catalog, members: list[tuple[str, str, Path, Any]], settings, seed: int, verbose: bool):
    """The engines ``members`` — (name in the rounds, toolchain, engine file, workload) — prepared
    and measured in rounds in a new interpreter: (RoundsOutcome, each engine's evidence by name)."""
    spawn = multiprocessing.get_context("spawn")  # a new interpreter, not a copy of this one
    receive, send = spawn.Pipe(duplex=False)
    child = spawn.Process(target=_child, args=(send, catalog, members, settings, seed, verbose), name="pipeline-repeat")
    child.start()
    send.close()
    try:
        outcome = receive.recv()
    except EOFError:  # it ended without a word: killed, or crashed in native code
        outcome = None
    except BaseException:  # Ctrl-C, SIGTERM: the measurement goes with this process
        child.terminate()
        child.join(STOP_GRACE_S)
        if child.is_alive():
            child.kill()
        raise
    child.join()
    if outcome is None:
        names = ", ".join(name for name, *_ in members)
        raise PipelineError(
            f"the process repeating the measurement of {names} ended without a result (exit status {child.exitcode}).",
            hint="run the same command again; -v shows what it printed",
        )
    kind, payload = outcome
    if kind == "error":
        raise payload
    return payload


def _child(send, catalog, members, settings, seed: int, verbose: bool) -> None:
    from pipeline.environment import running_on
    from pipeline.measurement import SmClock, measure_in_rounds
    from pipeline.reporting import Reporter
    from pipeline.runtimes import create_runtime

    try:
        reporter = Reporter(verbose=verbose)
        runtimes: dict[str, Any] = {}
        engines = {}
        with running_on(settings.host_cpus):
            for name, toolchain, engine_path, workload in members:
                if toolchain not in runtimes:
                    runtimes[toolchain] = create_runtime(toolchain, catalog.toolchain(toolchain), reporter, catalog.root)
                engines[name] = runtimes[toolchain].prepare(engine_path, workload)
            outcome = measure_in_rounds(engines, settings, seed, None, SmClock())
        evidence = {name: engine.evidence() for name, engine in engines.items() if name not in outcome.failed}
        outcome.errors = {name: error.plain() for name, error in outcome.errors.items()}
        send.send(("ok", (outcome, evidence)))
    except PipelineError as exc:
        send.send(("error", exc.plain()))
