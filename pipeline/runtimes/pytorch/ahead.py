"""The torch backend's work ahead of its profiles: a compiled engine's shape points compiled in
processes of their own (compile_ahead.py) and, in a run that profiles, each point made ready for
its profile as its compilation comes back — served by the process that compiled it (served.py),
else traced here while the run waits. TorchRuntime (runtime.py) fills EngineRuntime's WorksAhead
with these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.measuring.accuracy import ReferenceBatch
from pipeline.running.errors import DeviceFault, PipelineError, RefusedByTool
from pipeline.runtimes.base import AheadWork, too_little_to_keep
from pipeline.runtimes.pytorch.engine_file import file_identity
from pipeline.runtimes.pytorch.prepared import Prepared, import_torch
from pipeline.runtimes.pytorch.preparing import NotPrepared, TorchPreparation
from pipeline.runtimes.pytorch.served import engine_name


class TorchWorksAhead:
    """TorchRuntime's work ahead (EngineRuntime's WorksAhead, filled). It reads the runtime's spec,
    reporter, kept models (``_kept``), served points (``_served``), the engine files whose graph
    breaks were said (``_warned``) and the point the current build prepares itself
    (``_building_point``)."""

    @property
    def builds_long(self) -> bool:
        # A compilation specialised to each shape point: a build compiles every point (its own,
        # the others ahead of the profiles), where an eager or CUDA graph build only saves weights.
        return self.spec.backend == "compile" and not self.spec.dynamic

    @property
    def builds_where_timed(self) -> bool:
        # Loading the model (and capturing, or compiling once) is most of an eager, CUDA graph or
        # dynamic build, and of a profile in a fresh process, so it is built in the process that
        # times it (measured: docs/results/cluster.md, 'Why a worker per GPU and a CPU share per point').
        return not self.builds_long

    def expect_ahead_work(self) -> None:
        """The server the compiling processes are forked from, started as the run starts: it
        imports what they need while the run exports, instead of holding up the build that hands
        the first point over (compile_process.start_server)."""
        from pipeline.runtimes.pytorch import compile_process

        if self.builds_long:
            compile_process.start_server()

    def ahead_work(self, engine_path: Path, workloads: list[ReferenceBatch]) -> AheadWork | None:
        """torch.compile at every shape point, in processes of their own beside the other compiled
        engines' points, leaving the graphs in Inductor's cache for the profiles
        (pipeline/runtimes/pytorch/compile_ahead.py). Only a compilation specialised to each point
        has work to share out; a dynamic one is compiled once, and eager runs and CUDA graphs cost
        a point little."""
        from pipeline.runtimes.pytorch import compile_ahead

        if not self.builds_long:
            return None
        # The build compiles its own point (its graphs go to the same cache): compiled again beside
        # it, at the same moment, neither would find the other's, and a process would be spent on it.
        workloads = [workload for workload in workloads if workload.shape != self._building_point]
        if not workloads:
            return None
        jobs = [compile_ahead.CompileJob(self.name, self.spec, self.workspace_root, engine_path, workload) for workload in workloads]
        return AheadWork(engine_path, jobs, compile_ahead.CompilePool, f"compiling at {len(jobs)} shape points")

    def prepared_from(self, leader: Prepared, engine_path: Path) -> Prepared:
        """This engine at ``leader``'s point from ``leader``'s compiled graph, compiled once for both
        (TorchPreparation.shared; pipeline/runtimes/pytorch/compile_ahead.py, graph_key)."""
        try:
            return TorchPreparation(self.spec, self.reporter).shared(leader, file_identity(engine_path))
        except NotPrepared as exc:
            raise RefusedByTool(exc.message, exc.hint) from exc.__cause__

    def prepare_ahead(self, engine_path: Path, workload: ReferenceBatch | None, served=None) -> str | None:
        """A compiled engine at a point its compilation ahead has just finished, while the run waits
        for the rest. ``served``: the process that compiled it kept it and serves it
        (served.ServedPoint), and the point's profile times it there: nothing to do here.
        Else it is prepared in this process: Dynamo's tracing (seconds an engine and point) done
        before anything is measured, not between the points' rounds. Not where
        under AHEAD_FREE_GPU of the GPU's memory is free: what is kept holds some, and a point's
        profile would run out sooner than alone. Why not, where it was not."""
        if not self.builds_long or workload is None:
            return "nothing to prepare ahead"
        if served is not None:
            identity = file_identity(engine_path)
            self._served[(identity, workload.shape)] = served
            self._say_graph_breaks(engine_path, identity, served.facts)
            return None
        torch = import_torch()
        if self._cuda_available():
            short = too_little_to_keep(*torch.cuda.mem_get_info())
            if short is not None:
                return f"{short}: left to its profile"
        identity = file_identity(engine_path)
        self._kept.hold_for_profiles(identity)  # those prepared so far too (a build's own point)
        known = self._kept.has(identity, workload.shape)
        try:
            prepared = self.load(engine_path, workload)
        except DeviceFault:  # the process is replaced, where the point's profile records the fault
            raise
        except PipelineError as exc:  # its profile prepares it again and records what it finds
            if self._cuda_available():
                torch.cuda.empty_cache()
            return exc.message
        if not known:
            prepared.facts["prepared_ahead"] = True
            self._say_graph_breaks(engine_path, identity, prepared.facts)
        self._kept.hold_for_profiles(identity)
        return None

    def _say_graph_breaks(self, engine_path: Path, identity: tuple[int, int, int], facts: dict[str, Any]) -> None:
        """An engine's graph breaks, once, as its build would have said them had it compiled itself."""
        if facts.get("graph_breaks") and identity not in self._warned:
            self._warned.add(identity)
            self.reporter.warn(f"{engine_name(str(engine_path))}: {graph_break_words(facts)}{FULLGRAPH_WORDS}")

    def _served_at(self, engine_path: Path, workload):
        if workload is None or not self._served:
            return None
        return self._served.get((file_identity(engine_path), workload.shape))


FULLGRAPH_WORDS = " (set fullgraph = true to refuse them)"


def graph_break_words(facts: dict[str, Any]) -> str:
    """A compilation's graph breaks in words, for a build's note and a warning."""
    return f"{facts['graph_breaks']} graph break(s): the model runs as {facts['graphs']} compiled graphs with eager code between them"
