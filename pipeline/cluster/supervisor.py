"""The Ray driver runs in a child process that the `pipeline` command watches.

Ray ends a driver abruptly, from C++ and without a word, when the node it is attached to (the
head, where drivers usually run) goes away. In a child process that exit can be seen and
explained: the command says the head was lost, and every result the child had finished is
already in the workspace (it writes each as it arrives). The child has a process group of its
own, so whatever Ray signals there stays there; Ctrl-C and SIGTERM come to this process and are
passed on, and the child cancels what is outstanding before both end.

The child holds the workspace lock with this process (it inherits the locked descriptor) and
watches it: if this process dies without a word (kill -9, the OOM killer), the child cancels the
work it dispatched and ends, and until it has, the next run on the workspace waits for it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from pipeline.launchers.child import ERROR, OK, Child, Reply, ended_words, send_quietly
from pipeline.running.errors import EnvironmentMissing, PipelineError
from pipeline.stages.base import RunRequest
from pipeline.stages.runner import RunSummary

# Seconds to let the child cancel its tasks after an interruption before it is killed.
CANCEL_GRACE_S = 30
# How often the child looks for its parent.
PARENT_POLL_S = 0.5
# What the driver says beside a result or an error: it was interrupted (Ray ended it), or it failed
# with a bug (its traceback printed there).
INTERRUPTED, BUG = "interrupted", "bug"


@dataclass(frozen=True)
class ClusterLauncher:
    """Runs the stages as Ray tasks on the cluster at ``address``, placed by GPU type."""

    address: str
    verbose: bool = False
    # `--gpus 0,1`: the GPUs of this machine a local Ray instance ("local") may use, each timing a
    # shape point at a time (CUDA_VISIBLE_DEVICES of the instance; Ray gives each task one of them).
    visible_gpus: str | None = None

    def run(self, ctx, request: RunRequest) -> RunSummary:
        """Every toolchain in one cluster run: each shape point's engines are timed together."""
        return run_on_cluster(ctx, self.address, request, self.verbose, self.visible_gpus)


def run_on_cluster(ctx, address: str, request: RunRequest, verbose: bool = False, visible_gpus: str | None = None) -> RunSummary:
    """What `--cluster ADDRESS` does for run/export/build/profile."""
    from pipeline.cluster.connection import preflight
    from pipeline.workspace.lock import inherited_lock

    preflight(address)
    settings = (ctx.catalog, ctx.force, ctx.argv, ctx.exports_write_onnx, address, request, verbose, visible_gpus)
    lock = inherited_lock(ctx.workspace.manifests_dir)
    # A fresh interpreter: Ray must not inherit a fork.
    child = Child(_child, settings, lock, os.getpid(), name="pipeline-cluster-driver").start()
    try:
        child.join()
    except KeyboardInterrupt as exc:
        from pipeline.running.signals import Terminated

        # The child has a process group of its own (below): pass Ctrl-C or SIGTERM on to it.
        child.signal(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
        child.join(CANCEL_GRACE_S)
        child.stop(0)
        raise
    outcome = child.reply_if_any()
    if outcome is None or outcome.kind == INTERRUPTED:
        # Nobody interrupted this process, yet the driver stopped: Ray ended it (on losing its node
        # it exits, or interrupts the driver's main thread), or its connection to Ray broke.
        raise driver_ended(outcome, child.exitcode, address)
    if outcome.kind == BUG:
        raise RuntimeError(f"the cluster driver failed (its traceback is above): {outcome.value}")
    return outcome.result().raise_for_failures(len(request.engines), request.toolchains)


def driver_ended(outcome: Reply | None, exitcode: int | None, address: str) -> EnvironmentMissing:
    """The error for a driver that stopped with no result: how it ended (its reply's words, else
    its exit), and that finished stages are kept."""
    how = outcome.value if outcome is not None and outcome.value else ended_words(exitcode)
    return EnvironmentMissing(
        f"the Ray driver ended without a result ({how}): Ray ends a driver when the node it "
        f"runs on, usually the cluster's head at {address}, goes away. Every stage that had finished is in the workspace.",
        hint="check the head (`ray status`), restart it and its workers if needed, then run the same command: "
        "finished stages are not run again",
    )


def _child(channel, settings, lock, parent: int) -> None:
    from pipeline.running.reporting import Reporter
    from pipeline.running.signals import terminate_like_interrupt
    from pipeline.stages.base import RunContext
    from pipeline.workspace import Workspace

    # A process group of its own: what Ray signals when it loses its node stays in this process.
    os.setsid()
    terminate_like_interrupt()
    # `lock` (the workspace lock's descriptor) stays open until this process ends.
    threading.Thread(target=_end_with_parent, args=(parent,), name="parent-watch", daemon=True).start()
    catalog, force, argv, write_onnx, address, request, verbose, visible_gpus = settings
    if visible_gpus:  # the local Ray instance sees these GPUs only, and hands one to each task
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_gpus
    ctx = RunContext(
        catalog=catalog,
        workspace=Workspace(catalog.root),
        reporter=Reporter(verbose=verbose),
        force=force,
        argv=argv,
        exports_write_onnx=write_onnx,
    )
    outcome = driven(ctx, address, request, verbose)
    send_quietly(channel, outcome)  # the parent may be gone: nobody to tell


def driven(ctx, address: str, request: RunRequest, verbose: bool) -> Reply:
    """The driver's run, as the reply its parent reads: the summary, a user's error, INTERRUPTED
    (Ctrl-C, or the connection to Ray broken as its node went away) or a bug, its traceback printed."""
    from pipeline.cluster.scheduler import DriverDisconnected, drive

    try:
        summary = drive(ctx, address, request, verbose)
        return Reply(OK, RunSummary(summary.succeeded, [(name, chain, exc.plain()) for name, chain, exc in summary.failed]))
    except PipelineError as exc:
        return Reply(ERROR, exc.plain())
    except DriverDisconnected as exc:  # its node went away: what Ray otherwise says by ending the driver
        return Reply(INTERRUPTED, str(exc))
    except KeyboardInterrupt:
        return Reply(INTERRUPTED)
    except Exception as exc:  # a bug: its traceback here, and the command exits as for any bug
        import traceback

        traceback.print_exc()
        return Reply(BUG, f"{type(exc).__name__}: {exc}")


def _end_with_parent(parent: int) -> None:
    """When the command that started this driver dies unannounced, interrupt the driver as Ctrl-C
    would (it cancels what it dispatched and writes nothing more), and end it if that takes longer
    than the parent would have waited."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(CANCEL_GRACE_S)
    os._exit(1)
