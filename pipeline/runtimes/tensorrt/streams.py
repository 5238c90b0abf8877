"""A TensorRT engine serving N concurrent streams: trtexec with --infStreams=N, N execution contexts
each on its own CUDA stream, every stream enqueueing its inferences one ahead as a single stream
does (NVIDIA's trtexec documentation, "Cross-Inference Multi-Streaming"). Its throughput line is
every stream's inferences over the host's wall time; each inference's latency comes from the
--exportTimes file, as trtexec times it (H2D + GPU compute + D2H; GPU compute alone where data
transfers are off), so the p99 is bounded by the requests as an in-process engine's is
(pipeline/measuring/serving.py)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from pipeline.measuring.serving import TOOL_STREAMS, ServedRun
from pipeline.running.errors import PipelineError
from pipeline.trtexec.command import Dialect, ProfileCommand, parse_version
from pipeline.trtexec.exports import read_times


def serve_with_inf_streams(runtime, engine_path: Path, workload, streams: int, seconds: float) -> ServedRun:
    """``engine_path`` at ``workload``'s point run by ``runtime``'s trtexec with ``streams``
    inference streams for ``seconds``: the ServedRun of its throughput and exported times."""
    if not Dialect(parse_version(runtime.spec.trt)).has_inf_streams:
        return ServedRun.cannot(streams, TOOL_STREAMS, f"trtexec of TensorRT {runtime.spec.trt} has no --infStreams (added in 8.6)")
    point = f"@{workload.shape}" if workload is not None and workload.shape else ""
    log_path = runtime.sidecar(engine_path, f"{point}.streams{streams}.log")
    times_path = runtime.sidecar(engine_path, f"{point}.streams{streams}.times.json")
    partial = runtime._partial(times_path)
    argv = serve_argv(runtime, engine_path, partial, workload, streams, seconds)
    try:
        execution = runtime.execute(argv, log_path, f"serving {streams} streams")
        log = runtime._parse(execution)
        runtime._check(execution, log, f"serving {streams} streams", argv, log_path)
        if not partial.exists():
            raise PipelineError(f"trtexec wrote no --exportTimes file for {engine_path.name}.", hint=f"full log: {log_path}")
        os.replace(partial, times_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    times = read_times(times_path)
    # trtexec's throughput is its inferences over its total host walltime (its documentation,
    # "Throughput"); where its log has not both, the exported inferences over their own span.
    if log.throughput_qps and log.total_host_walltime_s:
        span, completed = log.total_host_walltime_s, round(log.throughput_qps * log.total_host_walltime_s)
    else:
        span, completed = _exported_span_s(times_path), times.count
    if not span:
        return ServedRun.cannot(
            streams, TOOL_STREAMS, f"neither trtexec's log nor its exported times give the run's span (full log: {log_path})"
        )
    how = f"trtexec {runtime.spec.trt} --infStreams={streams}: {streams} execution contexts, each its own CUDA stream"
    return ServedRun(streams, TOOL_STREAMS, span, completed, list(times.latency_ms), how=how)


def _exported_span_s(path: Path) -> float | None:
    """Seconds from the first exported inference's enqueue to the last one's end (--exportTimes'
    records: startEnqMs … endD2hMs, every release from 8.4), or None where they do not say."""
    records = json.loads(path.read_text())
    starts = [record["startEnqMs"] for record in records if "startEnqMs" in record]
    ends = [record.get("endD2hMs", record.get("endComputeMs")) for record in records]
    ends = [end for end in ends if end is not None]
    return (max(ends) - min(starts)) / 1000.0 if starts and ends and max(ends) > min(starts) else None


def serve_argv(runtime, engine_path: Path, times: Path, workload, streams: int, seconds: float) -> list[str]:
    """The exact command: the profile's measurement settings, ``streams`` streams, ``seconds`` long."""
    command = ProfileCommand(
        engine=runtime.container_path(engine_path),
        warmup_ms=200,
        iterations=1,
        duration_s=seconds,
        times_json=runtime.container_path(times),
        use_cuda_graph=runtime.spec.use_cuda_graph,
        no_data_transfers=runtime.spec.no_data_transfers,
        spin_wait=runtime.spec.spin_wait,
        shapes=dict(workload.shapes) if workload is not None and workload.shape else {},
        inf_streams=streams,
    )
    return command.argv(runtime.spec.trt, runtime.trtexec_path())
