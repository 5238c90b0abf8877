"""How a compiling process (compile_ahead.py) starts, and what it says of its start: the server it
is forked from, which imported what it needs (PRELOAD, ``start_server``); its share of the
machine's CPUs (``share_cpus``); and where each point's time went in it (``timeline``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from pipeline.launchers.child import Child, answer_with, forks_from_a_server, this_process_name
from pipeline.launchers.child import start_server as start
from pipeline.running.errors import PipelineError
from pipeline.runtimes.pytorch.compile_sizing import CPUS_KEPT, usable_cpus

# What every compiling process imports, imported once in the server they are forked from.
PRELOAD = ("pipeline.runtimes.pytorch.preload",)
# Where a point's time went in its process (``timeline``): the keys a point that shares another's
# graph leaves out, as they are that process's time, not its own.
TIMELINE = ("taken_s", "prepare_s", "start_s", "import_s")


# Why the compiling processes cannot be forked from the server, "" where they can
# (``forking_usable``); None until asked.
_not_forked: str | None = None


def start_server() -> None:
    """Start the server the compiling processes are forked from (PRELOAD), in the background, where
    the machine has CPUs for two processes at least (compile_sizing.py; fewer: no process is ever
    started, and the server would only cost its imports)."""
    if usable_cpus() - CPUS_KEPT >= 2:
        start(PRELOAD)


# How long a first process forked from the server may take to say whether CUDA is usable there:
# its start waits for the server's imports (20-35 s seen on the lent H200 beside a run's export).
PROBE_TIMEOUT_S = 300.0


def forking_usable(gpu: bool = False) -> str | None:
    """Why the compiling processes cannot be forked from the server (they are then each a new
    interpreter, which imports for itself), or None where they can: a first process forked from
    it found CUDA unusable where the run has a GPU (``gpu``: an import in the server initialised
    CUDA's driver, preload.py), or could not say. Asked once a run. Its start waits for the
    server's imports, as the first compiling process's would."""
    global _not_forked
    if _not_forked is None:
        if not forks_from_a_server():
            _not_forked = "this platform has no forkserver"
            return _not_forked
        try:
            probe = Child(_cuda_after_fork, gpu, name="pipeline-compile-probe", preload=PRELOAD).start()
            said = probe.result("checking CUDA after a fork", timeout_s=PROBE_TIMEOUT_S)
            _not_forked = f"a process forked from their server found CUDA unusable ({said})" if said else ""
        except PipelineError as exc:
            _not_forked = exc.message
        except (OSError, EOFError) as exc:  # the server gone (killed, or an import that failed)
            _not_forked = f"their server could not fork a process ({type(exc).__name__}: {exc})"
    return _not_forked or None


class Starting:
    """The compiling processes, started on a thread of their own as many as are asked for
    (``want``), so that the build handing over the first points goes on: a process forked from the
    server starts only once the server has imported PRELOAD, and the run's process would stand
    still until then (its first compiled build took 7.2 s in the lent H200's warm seed matrix, 2.4
    s in the cold one, where its export had taken longer: docs/results/sweeps.md). ``start(index,
    preload)`` starts process ``index`` and records it; whether they are forked at all is asked
    first (``forking_usable``: ``not_forked``, "" where they are)."""

    def __init__(self, start: Callable[[int, tuple[str, ...]], None]):
        self._start = start
        self.gpu = False  # whether the run has a GPU, so CUDA must be usable in the processes (set by the pool)
        self._lock = threading.Lock()
        self.wanted = self._count = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._error: BaseException | None = None
        self.not_forked: str | None = None

    def want(self, count: int) -> None:
        """At least ``count`` processes started, on the thread (started now where it is not running)."""
        with self._lock:
            self.wanted = max(self.wanted, count)
            # After a failure none more: ``wait`` raises it, and the pool closes those started.
            if self._thread is None and self._count < self.wanted and not self._stopping and self._error is None:
                self._thread = threading.Thread(target=self._run, name="pipeline-compile-starting", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            if self.not_forked is None:
                self.not_forked = forking_usable(self.gpu) or ""
            while True:
                with self._lock:
                    if self._stopping or self._count >= self.wanted:
                        self._thread = None
                        return
                    index, self._count = self._count, self._count + 1
                self._start(index, () if self.not_forked else PRELOAD)
        except BaseException as exc:  # raised in the run's own thread, by ``wait``
            with self._lock:
                self._error, self._thread = exc, None

    def wait(self, timeout: float | None = None) -> None:
        """Until every process asked for so far is started; what stopped the thread raised here."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if self._error is not None:
            raise self._error

    def stop(self, grace_s: float) -> None:
        """No more processes started: the one starting now, if any, given ``grace_s`` to."""
        with self._lock:
            self._stopping = True
        try:
            self.wait(grace_s)
        except BaseException:  # stopping: what went wrong starting is of no use now
            pass


def _cuda_after_fork(channel, gpu: bool) -> None:
    """In a process forked from the server: None where CUDA is as usable as in a new interpreter,
    else why not — PyTorch's word on a fork after CUDA was initialised, or, where the run has a
    GPU (``gpu``), no GPU found from here (the driver initialised in the server by other means)."""

    def unusable() -> str | None:
        import torch

        if torch.cuda._is_in_bad_fork():
            return "torch.cuda reports a bad fork"
        if gpu and not torch.cuda.is_available():
            return "torch.cuda finds no GPU"
        return None

    answer_with(channel, unusable)


def share_cpus(threads: int, gpu: bool = False) -> str | None:
    """On a GPU, PyTorch's own CPU threads (one per CPU by default) shared out among the compiling
    processes as Inductor's workers are. Twelve processes of sixteen threads each on the lent
    H200's 16 vCPUs spent 20-35 s a point beyond compiling it (the model read and placed, the
    warm-up), where a lone process on a 2-core VM imports torch and reads the model in 6.5 s
    (docs/results/sweeps.md); threads of a parallel section wait on one another where every CPU is
    busy, as numpy's BLAS did (measuring/accuracy.py, ErrorSums). Not on a CPU, where a point
    this process keeps is timed here, with the threads every other engine has; nor is the count
    in Inductor's cache key for a graph of GPU kernels alone (torch/_inductor/codecache.py,
    cpp_runtime_thread_count). Why this process cannot compile for the GPU the run has (``gpu``),
    where it cannot (a CUDA its server made unusable by touching it before the fork, say)."""
    from pipeline.runtimes.pytorch.prepared import import_torch

    torch = import_torch()
    from torch._inductor import config as inductor

    inductor.compile_threads = max(1, threads)
    if not torch.cuda._is_in_bad_fork() and torch.cuda.is_available():
        torch.set_num_threads(max(1, threads))
    elif gpu:
        return f"CUDA is not usable in the compiling process {this_process_name()}, where the run's process has a GPU"
    return None


def timeline(clocks: tuple[float, float], began: tuple[float, float] | None, taken: float, prepared: float) -> dict[str, float]:
    """Where a compiled point's time went, in seconds, for the build manifest: ``taken_s``, when
    its process took it, from the pool's first hand-over (so a late start or a queue shows);
    ``prepare_s``, its whole preparation there (the model read, ``compile_s``, the warm-up and
    the checks), or its failure; and for a process's first point (``began``: when its first line
    ran, and when it had torch and had found CUDA), ``start_s``, from the process's start to its
    first line (a fork, or a new interpreter and the imports that unpickle its work), and
    ``import_s``, torch's import (none where the server had it) and CUDA's driver found."""
    handed_over, started = clocks
    facts = {"taken_s": round(taken - handed_over, 3), "prepare_s": round(prepared - taken, 3)}
    if began is not None:
        entered, primed = began
        facts["start_s"], facts["import_s"] = round(entered - started, 3), round(primed - entered, 3)
    return facts
