"""A measurement taken again in a fresh process.

When a profile's repeats disagree, measuring again in the same process would repeat whatever made
them disagree that lives in the process: the allocator's state, a compiled graph and the autotuning
it chose, a thread pool, a warmed cache. So a runtime that measures inside the pipeline's own
process (ONNX Runtime, PyTorch) takes each retake in a new interpreter that loads the engine from
scratch, as the best benchmark harnesses do; runtimes that measure in a process of their own
(trtexec, the TensorRT-RTX driver) are fresh each time already.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from pipeline.errors import PipelineError

# Seconds a retake's process has to end after an interruption before it is killed.
STOP_GRACE_S = 10


def measure_in_fresh_process(catalog, toolchain: str, engine_path: Path, settings, workload, verbose: bool) -> tuple[list, list[dict]]:
    """``settings.repeats`` measurements of the engine in a new interpreter, each watched, fed
    ``workload`` (the inputs at a shape point, or None): (results, what was seen during each), as
    ProfileStage._measure returns them."""
    spawn = multiprocessing.get_context("spawn")  # a new interpreter, not a copy of this one
    receive, send = spawn.Pipe(duplex=False)
    child = spawn.Process(target=_child, args=(send, catalog, toolchain, engine_path, settings, workload, verbose), name="pipeline-retake")
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
        raise PipelineError(
            f"the process retaking the measurement of {engine_path.name} ended without a result (exit status {child.exitcode}).",
            hint="run the same command again; -v shows what it printed",
        )
    kind, payload = outcome
    if kind == "error":
        raise payload
    return payload


def _child(send, catalog, toolchain: str, engine_path: Path, settings, workload, verbose: bool) -> None:
    from pipeline.environment import running_on
    from pipeline.machine_watch import MachineWatch
    from pipeline.reporting import Reporter
    from pipeline.runtimes import create_runtime

    try:
        runtime = create_runtime(toolchain, catalog.toolchain(toolchain), Reporter(verbose=verbose), catalog.root)
        results, watched = [], []
        for _ in range(settings.repeats):
            with MachineWatch() as watch, running_on(settings.host_cpus):
                results.append(runtime.profile(engine_path, settings, workload))
            watched.append(watch.summary)
        send.send(("ok", (results, watched)))
    except PipelineError as exc:
        send.send(("error", exc.plain()))
