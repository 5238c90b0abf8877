"""A PyTorch model prepared to be timed, and the ways it runs: eager (without autograd, inside the
SDPA kernel choice), compiled by torch.compile, or replayed from a CUDA graph captured once. What the
profile records of a prepared model beside its takes lives here too: which SDPA kernels it ran,
and the host-synchronised latency. The toolchain itself (what is built, how it is prepared and
refused) is pipeline/runtimes/pytorch/runtime.py."""

from __future__ import annotations

import contextlib
import copyreg
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.measuring.out_of_memory import out_of_memory_as_error
from pipeline.measuring.stats import median
from pipeline.measuring.takes import cuda_take, host_take
from pipeline.runtimes.pytorch.memory import gpu_memory

# Runs before CUDA-graph capture, on a side stream, as PyTorch's CUDA graph notes ask.
CAPTURE_WARMUP_RUNS = 3


@dataclass
class Prepared:
    """A model ready to time: one call of ``run`` is one inference on ``examples``, in place (a
    CUDA graph reads its inputs from fixed addresses), returning the output."""

    # Which engine file this is: (inode, size, mtime), kept by the move the build's write ends
    # with, so a profile can tell its own build's file without hashing hundreds of MB again.
    engine_file: tuple[int, int, int]
    run: Callable[[], Any]
    examples: tuple
    device: str
    # The shape point it was prepared at ("2x512"); None for a model of one shape.
    shape: str | None
    # What preparing it took and found (compile time, graph breaks), for the manifests.
    facts: dict[str, Any] = field(default_factory=dict)
    # The loaded model, kept to prepare it at another shape point without reading the file again.
    model: Any = None
    # torch.compile's module and the shape point it was first compiled at: with `dynamic = true`
    # it serves every point (compiled once for the range), the compilations another point still
    # triggers counted as recompilations.
    compiled: Any = None
    compiled_at: str | None = None
    # What the manifest records of how it runs (versions, settings in force, the facts above),
    # set by TorchRuntime.prepare.
    execution: dict[str, Any] = field(default_factory=dict)
    # Graphs torch.compile compiled while it was being timed (0 when every point is warmed first).
    recompiles: int = 0
    # The host's time to issue the last take's untimed run (pipeline/measuring/takes.py, cuda_take).
    issue_ms: float | None = None
    # The wall time of each take's untimed run, which the host waited for (cuda_take's waited_ms):
    # the host-synchronised latency, the profile's second figure (host_latency).
    waited_ms: list[float] = field(default_factory=list)
    # The untimed runs before the last take's timed ones, inside its energy reading (cuda_take's untimed).
    untimed_runs: int = 1
    # The median of the last take's timed runs: how the next take judges its first issue (cuda_take).
    _steady_ms: float | None = field(default=None, init=False, repr=False)
    # An eager model's output of the run that prepared it, on ``examples`` as they are: what the
    # reference run returns where it is asked for those very values (``infer``), instead of
    # running again. A profile prepares an engine on its point's reference batch and checks it
    # on that batch next: a run of each eager engine, 1.3 s of the seed matrix's 24 at the lent
    # H100's points (eager attention at 4x4096 takes 0.24 s a run). Let go once read, before the
    # rounds (``warm``) or serving: it holds memory, and none over FIRST_OUTPUT_BYTES is kept.
    first_output: Any = None
    # The TF32 setting it was prepared with (its toolchain's ``tf32``), put back in force before
    # each of its runs (``in_force``): the flags are the process's, and each engine prepared sets
    # its own, so a point's engines were all timed under the last one's. None: left as they are.
    tf32: bool | None = None
    # The CUDA streams its serving threads issue on, one a concurrent stream, made at its first
    # serving and kept for every take after (pytorch/streams.py): PyTorch's caching allocator
    # keeps the memory a stream freed for that stream alone, and torch.cuda.Stream() hands out
    # its pool of 32 in turn, so new streams every take would leave up to 32 streams' worth cached.
    serving_streams: list = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.examples[0].shape[0])

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def timing(self) -> str:
        return "GPU time (CUDA events)" if self.cuda else "host latency"

    def in_force(self) -> None:
        """Its toolchain's process-wide settings put back, as it was prepared with them: TF32 for
        matrix products and convolutions on a GPU (preparing.py sets them; torch.compile's guards
        read them too, so a compiled model run under another's would compile again)."""
        if self.cuda and self.tf32 is not None:
            torch = import_torch()
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            torch.backends.cudnn.allow_tf32 = self.tf32

    def take(self, runs: int, min_ms: float) -> list[float]:
        """One take (pipeline/measuring/takes.py): on a GPU enqueued back to back and timed by CUDA
        events, on the CPU by the host's clock. Running out of memory is this point's failure."""
        torch = import_torch()
        self.in_force()
        graphs = compiled_graphs(torch)
        with out_of_memory_as_error(self.batch_size, shape=self.shape):
            if self.cuda:
                issued: list[float] = []
                untimed: list[int] = []
                times = cuda_take(torch, self.run, runs, min_ms, issued, self.waited_ms, untimed, self._steady_ms)
                self.issue_ms, self.untimed_runs = issued[0], untimed[0]
                self._steady_ms = median(times)
            else:
                times = host_take(self.run, runs, min_ms)
        self.recompiles += compiled_graphs(torch) - graphs
        return times

    def warm(self) -> None:
        """One run before the first round, after every engine of the point was prepared: whatever
        preparing the others did to this one (a compiled model whose cache another compilation
        reset recompiles now) happens here, not in a take. On a GPU that run also measures the
        engine's memory (pytorch/memory.py), which a run of its own measured when the engine was
        made ready: a run an engine, 60 of them in the seed matrix, about a second before its
        first point on the lent H100 (sampled: docs/results/sweeps.md). A run that compiled
        again measured the compiler's memory too, so the memory is measured again by one more."""
        torch = import_torch()
        self.first_output = None
        self.in_force()
        graphs = compiled_graphs(torch)
        self.waited_ms.clear()  # the host-synchronised latency is these rounds' takes'
        with out_of_memory_as_error(self.batch_size, shape=self.shape), torch.no_grad():
            if self.cuda:
                self.execution["peak_memory_mib"] = gpu_memory(torch, self)
            else:
                self.run()
        if compiled_graphs(torch) > graphs:
            self.execution["recompiled_before_rounds"] = compiled_graphs(torch) - graphs
            if self.cuda:
                self.execution["peak_memory_mib"] = gpu_memory(torch, self)

    def _measure_memory_unless_warmed(self) -> None:
        """The engine's GPU memory, where no warm-up measured it (an engine timed without rounds)."""
        if self.cuda and "peak_memory_mib" not in self.execution:
            torch = import_torch()
            with torch.no_grad():
                self.execution["peak_memory_mib"] = gpu_memory(torch, self)

    def evidence(self) -> dict[str, Any]:
        """How it ran, for the profile's manifest (ProfileResult's fields)."""
        torch = import_torch()
        self.in_force()
        self._measure_memory_unless_warmed()
        execution = dict(self.execution)
        warnings = []
        if "compile_s" in execution:
            # Each point is warmed before it is timed, so this stays 0; were it not, the figures
            # would include the compiler's time, and the row says so.
            execution["recompiles_during_measurement"] = self.recompiles
            if self.recompiles:
                warnings.append(
                    f"* torch.compile compiled {self.recompiles} graph(s) during the measurement: the figures include compilation"
                )
        gpu, measured_with = None, {}
        if self.cuda:
            gpu = torch.cuda.get_device_name()
            # The input is already on the GPU; runs are enqueued back to back like trtexec's. (CUDA
            # graphs are the backend being compared here, not a measurement setting: not listed.)
            measured_with = {"data_transfers": False, "host_sync_per_run": False}
            with out_of_memory_as_error(self.batch_size, shape=self.shape):
                execution["host_latency_ms"] = host_latency(torch, self.run, self.waited_ms)
        return {
            "device": f"torch {execution.get('backend')} on {gpu or 'CPU'}",
            "metric": self.timing,
            "warnings": warnings,
            "evidence": {"gpu": gpu, "execution": execution, "measured_with": measured_with, **_memory(execution)},
        }

    def infer(self, values: tuple):
        """The output for these input values (arrays of the examples' shapes)."""
        import torch

        kept, self.first_output = self.first_output, None
        self.in_force()
        with torch.no_grad():
            given = [
                torch.from_numpy(value).to(device=example.device, dtype=example.dtype) for example, value in zip(self.examples, values)
            ]
            if kept is not None and all(_same_bits(torch, example, value) for example, value in zip(self.examples, given, strict=True)):
                output = kept  # the preparing run's, on these very values
            else:
                for example, value in zip(self.examples, given):
                    example.copy_(value)
                output = self.run()
            output = output.detach().float()
            # A copy off the GPU is the caller's own; on the CPU the output may be the model's
            # buffer (a compiled graph's), which the next run writes over.
            return output.cpu().numpy() if output.is_cuda else output.numpy().copy()


# The largest preparing run's output kept for the reference run (Prepared.first_output): an
# engine's output is its hidden states or a prefill's last logits, megabytes; a model returning
# every position's logits makes gigabytes, held while the point's other engines are prepared.
FIRST_OUTPUT_BYTES = 256 << 20


def kept_for_reference(output) -> Any:
    """``output`` where it is a tensor of at most FIRST_OUTPUT_BYTES, else None."""
    size = getattr(output, "nbytes", None)
    return output if size is not None and size <= FIRST_OUTPUT_BYTES else None


def _same_bits(torch, a, b) -> bool:
    """The same values bit for bit (equal as numbers is not enough: -0.0 equals 0.0, and a model
    may tell them apart)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def import_torch():
    from pipeline.models.torch_import import import_torch as import_torch_once

    return import_torch_once()  # torchvision's quirk (pipeline/models/torch_import.py) is handled there


def cache_keys_alike_in_every_process(torch) -> None:
    """Make Inductor's cache keys for a graph the same in every process that compiles it: the
    run's own, the processes compiling ahead (pipeline/runtimes/pytorch/compile_ahead.py), a
    cluster's build tasks and GPU workers.

    The keys (FX graph and AOTAutograd caches) hash a pickle of each input's metadata, its
    ``torch.memory_format`` among it. A memory format pickles as a global name with no module of
    its own, and pickle finds one by scanning ``sys.modules`` for the first module through which
    ``torch.contiguous_format`` can be reached: which one depends on what the process imported
    first (``torch._utils`` in a plain process, ``__mp_main__`` in a spawned one), so a graph
    compiled ahead was never found by a Ray worker, which compiled it again (measured:
    docs/results/cluster.md, 'Why a worker per GPU and a CPU share per point'). Pickled here by a
    function of this module's, found by name
    alike everywhere; the format still tells keys apart. Inductor's picklers start from
    ``copyreg``'s table (torch/_inductor/codecache.py, FxGraphCachePickler)."""
    copyreg.pickle(type(torch.contiguous_format), _memory_format_by_name)


def memory_format_named(name: str):
    """The ``torch.memory_format`` called ``name``: what a pickled one is read back as."""
    return getattr(import_torch(), name)


def _memory_format_by_name(memory_format) -> tuple:
    return memory_format_named, (str(memory_format).removeprefix("torch."),)


def compiled_graphs(torch) -> int:
    """How many graphs Dynamo has compiled since its last reset (0 when nothing was compiled)."""
    dynamo = sys.modules.get("torch._dynamo")
    return int(dynamo.utils.counters["stats"]["unique_graphs"]) if dynamo is not None else 0


def compiled_run(torch, compiled, examples: tuple):
    def run():
        # Compiled modes that use CUDA graphs (max-autotune, reduce-overhead) reuse their
        # output buffers; marking each inference as a new step lets them.
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*examples)

    return no_grad(run)


def within(context, fn):
    """``fn`` run inside a fresh ``context()`` each call (the SDPA kernel choice)."""

    if context is contextlib.nullcontext:
        return fn

    def run():
        with context():
            return fn()

    return run


def no_grad(fn):
    import torch

    def run():
        with torch.no_grad():
            return fn()

    return run


def capture(torch, model, examples: tuple):
    """Eager ``model(*examples)`` captured once in a CUDA graph; each call replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(CAPTURE_WARMUP_RUNS):  # lazy initialisation happens outside the capture
            model(*examples)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        output = model(*examples)
    return GraphReplay(graph, output, keep_alive=(model, examples))


@dataclass
class GraphReplay:
    """One call replays the captured graph and returns its output tensor (overwritten by the next
    replay). The graph reads the weights and the input at the addresses they had during capture
    but holds no reference to them, so this does."""

    graph: Any
    output: Any
    keep_alive: tuple

    def __call__(self):
        self.graph.replay()
        return self.output


# Where the takes waited for too few runs (an engine timed outside the rounds), the host-synchronised
# latency (the second figure) is taken over at most this long, after the engine was timed.
HOST_LATENCY_MAX_S = 0.25
HOST_LATENCY_RUNS = 10
# The fewest runs waited for that the figure is read from.
HOST_LATENCY_LEAST_RUNS = 3


def host_latency(torch, run: Callable[[], Any], waited_ms: list[float] = ()) -> dict[str, Any]:
    """The second figure on a GPU: wall time of a run the host waits for (launch, GPU work and the
    synchronisation), what a caller that needs each result before sending the next sees. From the
    runs the takes waited for (``waited_ms``, one a take, each from an idle GPU and warm: takes.py,
    cuda_take), where there are at least HOST_LATENCY_LEAST_RUNS. Runs of its own after the rounds,
    one engine after another, were most of what a point did between its rounds and its profiles'
    lines, which grew from 1.5 to 3.6 s with the point's size on the lent H200 (up to ten runs or
    a quarter second an engine; three of eager attention at 4x4096 alone 0.8 s:
    docs/results/records/2026-12-04-h200-house). Else over HOST_LATENCY_RUNS runs now, or
    HOST_LATENCY_MAX_S, whichever ends first (at least 3 runs)."""
    from pipeline.measuring.stats import LatencyStats

    if len(waited_ms) >= HOST_LATENCY_LEAST_RUNS:
        stats = LatencyStats.from_values(list(waited_ms))
        return {"median_ms": round(stats.median, 4), "mean_ms": round(stats.mean, 4), "p99_ms": round(stats.p99, 4), "runs": stats.count}
    times_ms: list[float] = []
    started = time.perf_counter()
    while len(times_ms) < HOST_LATENCY_LEAST_RUNS or (
        len(times_ms) < HOST_LATENCY_RUNS and time.perf_counter() - started < HOST_LATENCY_MAX_S
    ):
        t0 = time.perf_counter_ns()
        run()
        torch.cuda.synchronize()
        times_ms.append((time.perf_counter_ns() - t0) / 1e6)
    stats = LatencyStats.from_values(times_ms)
    return {"median_ms": round(stats.median, 4), "mean_ms": round(stats.mean, 4), "p99_ms": round(stats.p99, 4), "runs": stats.count}


def _memory(execution: dict[str, Any]) -> dict[str, Any]:
    """The profile's GPU memory (a core fact) from what the preparation measured, where it did."""
    allocated = (execution.get("peak_memory_mib") or {}).get("allocated")
    return {} if allocated is None else {"gpu_memory_mib": float(allocated), "gpu_memory_counts": "peak allocated by PyTorch"}


class KeptModels:
    """The models a torch runtime prepared, by engine file and shape point: the last one of each
    file, kept so a profile right after its build does not compile again and the next shape point
    reuses the loaded model (the variants of a sweep alternate, point after point, in one
    process); and those prepared ahead of their points' profiles (TorchRuntime.prepare_ahead),
    kept until their profile has taken them and moved on."""

    def __init__(self):
        self._models: dict[tuple[tuple[int, int, int], str | None], Prepared] = {}
        self._ahead: set[tuple[tuple[int, int, int], str | None]] = set()  # not yet taken by their profile

    def take(self, identity: tuple[int, int, int], shape: str | None) -> tuple[Prepared | None, Prepared | None]:
        """The file's model prepared at ``shape`` (None), and the newest one prepared at another
        point, which lends its loaded model; the file's others go, but those prepared ahead."""
        self._ahead.discard((identity, shape))
        others = [key for key in self._models if key[0] == identity and key[1] != shape]
        lender = self._models[others[-1]] if others else None
        for key in others:
            if key not in self._ahead:
                del self._models[key]
        return self._models.get((identity, shape)), lender

    def keep(self, prepared: Prepared) -> None:
        self._models[(prepared.engine_file, prepared.shape)] = prepared

    def has(self, identity: tuple[int, int, int], shape: str | None) -> bool:
        return (identity, shape) in self._models

    def hold_for_profiles(self, identity: tuple[int, int, int]) -> None:
        """Keep the file's models prepared so far until their profiles take them."""
        self._ahead.update(key for key in self._models if key[0] == identity)

    def only_at(self, shape: str | None) -> None:
        """Drop those prepared at other points than ``shape``, but those held for their profiles."""
        self._models = {key: kept for key, kept in self._models.items() if kept.shape == shape or key in self._ahead}
