"""What a cluster run says at its end: its jobs as a table, and the run summary the command line
reports (pipeline/cluster/scheduler.py drives the run)."""

from __future__ import annotations

import time

from pipeline.cluster.plan import Member
from pipeline.running.errors import PipelineError
from pipeline.stages.runner import RunSummary


def print_jobs_table(run) -> None:
    """A ClusterRun's jobs: engine, stage, toolchain, node, result, seconds and tries."""
    from rich.table import Table

    ran = [job for job in run.matrix.jobs() if job.state not in ("unchanged",) or run.verbose]
    if not ran:
        return
    table = Table(title="cluster run", title_justify="left", box=None, pad_edge=False)
    for column in ("engine", "stage", "toolchain", "node", "result", "seconds", "tries"):
        # Names are never cut short: a narrow terminal wraps them instead.
        table.add_column(column, justify="right" if column in ("seconds", "tries") else "left", overflow="fold")
    for job in ran:
        result = job.state + (f" ({job.note})" if job.note else "")
        table.add_row(
            job.name,
            job.stage,
            job.target,
            job.node.label() if job.node else "–",
            result,
            f"{job.seconds:.1f}" if job.seconds else "–",
            str(job.attempts or "–"),
        )
    run.reporter.console.print(table)


def run_summary(run) -> RunSummary:
    """What a ClusterRun did: the engines that succeeded and those that failed (with their errors), its
    table of jobs, how its GPUs held the host, and one line in all."""
    summary = RunSummary()
    failures: dict[str, tuple[str | None, PipelineError]] = {}
    for job in run.matrix.jobs():
        failed = [(member, job.error) for member in job.members] if job.state == "failed" else job.failures
        failed = [*job.faults, *failed]
        for member, error in failed:
            failures.setdefault(f"{member.engine.name} ({job.stage} {member_target(member)})", (member.toolchain, error))
    for engine in run.engines:
        if not any(name.startswith(engine.name + " ") for name in failures):
            summary.succeeded.append(engine.name)
    summary.failed = [(name, toolchain, error) for name, (toolchain, error) in failures.items()]
    counts: dict[str, int] = {}
    for job in run.matrix.jobs():
        counts[job.state] = counts.get(job.state, 0) + 1
    elapsed = time.monotonic() - run.started
    print_jobs_table(run)
    for line in run.holds.sentences():
        run.reporter.info(f"host     {line}")
    run.reporter.info(
        f"summary  {run.dispatched} task(s) dispatched in {elapsed:.1f}s — "
        + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        + f"; over the network: nodes fetched {_size(run.bytes_fetched)} of the {_size(run.blobs.bytes_put)} offered, "
        f"and sent back {_size(run.bytes_back)}"
    )
    return summary


def member_target(member: Member) -> str:
    where = f"{member.toolchain}@{member.gpu_type}" if member.gpu_type else str(member.toolchain)
    return f"{where} at {member.shape}" if member.shape else where


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"
