"""A PyTorch engine serving N concurrent streams in this process: N threads, each with its own copy
of the inputs and, on a GPU, its own CUDA stream (torch.cuda.Stream) that its inferences are issued
on and waited for: eager or compiled, the one module called from every thread; CUDA graphs, a graph
captured for each stream from its own inputs (a graph reads the addresses it was captured with, so
streams sharing one would share their inputs and outputs), replayed on that stream.

Python holds the GIL between the kernels it launches, so N threads issue one at a time: where the
launches are the work (eager, small shapes) the threads add little, where one replay launches a
whole graph they overlap on the GPU. Hence the runtime also serves N processes
(TorchRuntime.serves_in_processes, pipeline/stages/serving.py), each its own interpreter, CUDA
context and copy of the engine."""

from __future__ import annotations

from typing import Any

from pipeline.measuring.serving import THREADS, ServedRun, StartAt, serve_threads
from pipeline.runtimes.pytorch.prepared import Prepared, capture, import_torch
from pipeline.runtimes.pytorch.spec import needs_cuda_graphs

# Why threads of one process cannot show what N callers get from PyTorch (EngineRuntime.serves_in_processes).
GIL_WORDS = "PyTorch's Python holds the GIL between kernel launches: N threads of one process issue one at a time"


def serve_streams(spec, attention, prepared: Any, streams: int, seconds: float, start_at: StartAt) -> ServedRun:
    """``prepared`` (what TorchRuntime.prepare gave) serving ``streams`` threads for ``seconds``;
    ``attention``: a fresh SDPA-kernel context per call, as the prepared run uses."""
    if not isinstance(prepared, Prepared):
        return ServedRun.cannot(
            streams,
            THREADS,
            "its point is neither prepared in this process nor held by one that serves it (pytorch/served.py)",
        )
    torch = import_torch()
    cuda = prepared.cuda
    if cuda and needs_cuda_graphs(spec) and spec.backend != "cudagraphs":
        # torch.compile's own CUDA graphs (reduce-overhead, max-autotune, capture) keep one graph
        # per compiled function and input addresses, not one a stream: not served side by side.
        return ServedRun.cannot(streams, THREADS, "torch.compile's CUDA graphs are one a compiled graph, not one a stream")
    inputs = [tuple(example.clone() for example in prepared.examples) for _ in range(streams)]
    # Not `compiled or model`: a compiled module's truth is its len(), which torch.compile's
    # wrapper refuses for a module that is no container (TypeError).
    module = prepared.compiled if prepared.compiled is not None else prepared.model
    if cuda:  # a stream a concurrent caller, kept from take to take (Prepared.serving_streams)
        while len(prepared.serving_streams) < streams:
            prepared.serving_streams.append(torch.cuda.Stream())
    requests = []
    for index, mine in enumerate(inputs):
        if not cuda:
            requests.append(_on_host(torch, attention, module, mine))
            continue
        stream = prepared.serving_streams[index]
        with torch.cuda.stream(stream):
            run = capture(torch, prepared.model, mine) if spec.backend == "cudagraphs" else None
        requests.append(_on_stream(torch, attention, run, module, mine, stream))
    # Each stream's first inference (its allocations, lazy set-up) is untimed in the thread that
    # serves it (serve_threads): per-thread set-up done here would still fall on the first request.
    span, latencies = serve_threads(requests, seconds, start_at)
    where = "its own inputs and CUDA stream" if cuda else "its own inputs"
    graphs = ", a CUDA graph captured per stream" if cuda and spec.backend == "cudagraphs" else ""
    how = f"{streams} thread{'s' if streams > 1 else ''} on one {spec.backend} model{graphs}, each {where}"
    return ServedRun(streams, THREADS, span, len(latencies), latencies, how=how)


def _on_host(torch, attention, module, mine: tuple):
    def request():
        with torch.no_grad(), attention():
            return module(*mine)

    return request


def _on_stream(torch, attention, replay, module, mine: tuple, stream):
    def request():
        with torch.cuda.stream(stream):
            if replay is not None:
                replay()
            else:
                with torch.no_grad(), attention():
                    module(*mine)
        stream.synchronize()  # the request ends when its result is there

    return request
