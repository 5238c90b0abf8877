"""PyTorch itself: eager, ``torch.compile`` (Inductor) and CUDA graphs — the baseline every
engine is measured against, because it is what users run before they have an engine.

The stages mean what they mean for every toolchain:

* **build** writes the runnable model (``engines/<toolchain>/<engine>.pt``: the timm architecture's
  name and its weights in the variant's precision, so the file pins exactly what is timed) and
  prepares it: for ``compile`` the compilation, timed, with the graph breaks counted and where
  Inductor keeps its cache recorded — and, for a model of several shape points, the compilation
  at every point in processes side by side (pipeline/runtimes/pytorch/compile_ahead.py), so that
  each point's profile finds its graphs in Inductor's cache (in a run that profiles, the build's
  own point too, each point then traced in this process while the run waits: prepare_ahead);
  for ``cudagraphs`` the capture.
* **profile** prepares it (:meth:`TorchRuntime.prepare`) and hands it to the measurement protocol
  (pipeline/measuring/rounds.py), which times it in rounds beside the other engines of the shape point.
  On a GPU the runs of a take are enqueued back to back and each is bracketed by CUDA events, so a
  run's time is the GPU's, as trtexec's GPU compute time is; the host-synchronised latency is kept
  beside it as a second figure. On the CPU a run's time is host time. A profile at the build's
  point, in the same process, reuses the prepared model (each variant's); one elsewhere prepares
  it again from Inductor's cache (recorded as ``prepare_s``). The prepared model — what the
  protocol times, and the ways it runs (eager, compiled, a CUDA graph replayed) — is
  pipeline/runtimes/pytorch/prepared.py; the GPU memory an engine holds,
  pipeline/runtimes/pytorch/memory.py (running out of it: pipeline/measuring/out_of_memory.py).

Quantized and 2:4-sparse variants are ModelOpt's fake-quantized or pruned-dense PyTorch models:
they compute in high precision and time nothing a deployment would run, so they are recorded as
skipped here. Their engines are TensorRT's job.
"""

from __future__ import annotations

import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pipeline.catalog import ProfileSettings, VariantSpec
from pipeline.machine.environment import nvidia_gpus, package_version
from pipeline.measuring.accuracy import ReferenceBatch
from pipeline.measuring.out_of_memory import out_of_memory_as_error
from pipeline.measuring.serving import ServedRun, StartAt
from pipeline.models import TORCH_DTYPES, ModelSource
from pipeline.running.errors import EnvironmentMissing, OutOfMemory, PipelineError, RefusedByTool
from pipeline.runtimes.base import BuildResult, InProcessRuntime, ReferenceRun, ToolchainStatus, rounds_words
from pipeline.runtimes.pytorch.ahead import FULLGRAPH_WORDS, TorchWorksAhead, graph_break_words
from pipeline.runtimes.pytorch.cache import use_workspace_cache
from pipeline.runtimes.pytorch.cast_weights import cast_model
from pipeline.runtimes.pytorch.engine_file import ENGINE_FORMAT_VERSION, file_identity, model_from, read_engine, write_engine
from pipeline.runtimes.pytorch.prepared import KeptModels, Prepared, import_torch
from pipeline.runtimes.pytorch.preparing import NotPrepared, TorchPreparation, compile_mode
from pipeline.runtimes.pytorch.served import ProcessGone, ServedEngine
from pipeline.runtimes.pytorch.spec import TorchSpec
from pipeline.runtimes.pytorch.streams import GIL_WORDS, serve_streams


class TorchEvidence(BaseModel):
    """What PyTorch leaves beside the core facts: at the build, the compiler's facts (versions,
    compile time, graph breaks, Inductor's cache, the compilation ahead at each point); at the
    profile, how it ran (backend, mode, device, TF32, attention, prepare time, peak memory)."""

    model_config = ConfigDict(extra="forbid")
    compiler: dict[str, Any] | None = None
    execution: dict[str, Any] | None = None


class TorchRuntime(TorchWorksAhead, InProcessRuntime):
    kind = "torch"
    product = "PyTorch"
    # Engines are made from the PyTorch model: a model the exporter refused still runs here.
    reads_onnx = False
    Spec = TorchSpec
    Evidence = TorchEvidence
    engine_suffix = ".pt"
    # Its builds load the model and compile on the CPU; a local run already compiles in several
    # processes on one GPU (pytorch/compile_ahead.py). One build to a GPU made a cluster's builds
    # wait in waves (docs/cluster.md).
    builds_share_gpu = True
    serves_in_processes = GIL_WORDS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # torch.compile's caches in the workspace, for this process and those it starts (pytorch/cache.py).
        self.compile_cache = use_workspace_cache(self.workspace_root)
        self._kept = KeptModels()
        # Points a compiling process kept and serves, by engine file and shape point (pytorch/served.py).
        self._served: dict[tuple[tuple[int, int, int], str], Any] = {}
        self._warned: set[tuple[int, int, int]] = set()  # engine files whose graph breaks were said
        # The shape point the current build prepares itself, in this process: no work ahead for it.
        self._building_point: str | None = None

    # --- what it is -----------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return package_version("torch") or "not installed"

    @property
    def mode(self) -> str | None:
        return compile_mode(self.spec)

    def identity(self) -> dict[str, Any]:
        # Read from package metadata and nvidia-smi, so a warm rerun need not import torch.
        return {
            "runtime": "torch",
            "torch": self.version,
            "timm": package_version("timm"),
            "triton": package_version("triton"),
            "backend": self.spec.backend,
            "mode": self.mode,
            "fullgraph": self.spec.fullgraph,
            "dynamic": self.spec.dynamic,
            "tf32": self.spec.tf32,
            "attn_implementation": self.spec.attn_implementation,
            "sdpa_backend": self.spec.sdpa_backend,
            "gpus": [gpu.name for gpu in nvidia_gpus()],
            "engine_format": ENGINE_FORMAT_VERSION,
        }

    def describe(self) -> str:
        dynamic = ", once for every shape (dynamic)" if self.spec.dynamic else ""
        compiled = f"torch.compile (Inductor, mode {self.mode}{dynamic})" + (" in a CUDA graph" if self.spec.capture else "")
        what = {"eager": "eager", "compile": compiled, "cudagraphs": "eager in a CUDA graph"}
        return f"PyTorch {self.version}: {what[self.spec.backend]}{self._attention_words()}"

    def _attention_words(self) -> str:
        """ ", sdpa attention, SDPA kernel flash" for a toolchain that chooses; empty for the model's own."""
        words = []
        if self.spec.attn_implementation:
            words.append(f"{self.spec.attn_implementation} attention")
        if self.spec.sdpa_backend:
            words.append(f"SDPA kernel {self.spec.sdpa_backend}")
        return (", " + ", ".join(words)) if words else ""

    def status(self) -> ToolchainStatus:
        if find_spec("torch") is None:
            return ToolchainStatus(present=False, usable=False, detail="torch is not installed (`make setup`)")
        problem = self._machine_problem()
        if problem:
            return ToolchainStatus(present=True, usable=False, detail=problem[0])
        return ToolchainStatus(present=True, usable=True, detail=self.describe())

    def _machine_problem(self) -> tuple[str, str] | None:
        """(what is missing, how to get it) for this backend on this machine, or None."""
        return self.spec.machine_problem(self.name, self.version, self._cuda_available())

    @staticmethod
    def _cuda_available() -> bool:
        if not nvidia_gpus():  # no driver: no need to import torch to know
            return False
        return import_torch().cuda.is_available()

    def check_usable(self) -> None:
        if find_spec("torch") is None:
            import_torch()  # raises EnvironmentMissing with the install hint
        problem = self._machine_problem()
        if problem:
            raise EnvironmentMissing(problem[0], hint=problem[1])

    def unsupported_reason(self, variant: VariantSpec) -> str | None:
        if variant.precision not in TORCH_DTYPES:
            return f"{variant.precision} in PyTorch is fake quantization (high-precision arithmetic): it times nothing a deployment runs"
        if variant.sparsity:
            return "2:4 sparsity in PyTorch is a pruned dense model (no sparse kernels): it times nothing a deployment runs"
        return None

    def unsupported_model(self, source: ModelSource) -> str | None:
        if not source.has_pytorch_model:
            return f"{source.describe()} has no PyTorch model to run"
        return None

    # --- build: the runnable model ----------------------------------------------------------------

    def settings(self, precision: str, device: str) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "backend": self.spec.backend,
            "dtype": TORCH_DTYPES[precision],
            "device": device,
            "tf32": self.spec.tf32,
            "attn_implementation": self.spec.attn_implementation,
            "sdpa_backend": self.spec.sdpa_backend,
        }
        if self.spec.backend == "compile":
            settings.update(mode=self.mode, fullgraph=self.spec.fullgraph, dynamic=self.spec.dynamic)
            if self.spec.capture:  # absent where unset: a manifest written before it stays current
                settings.update(capture=True)
        return settings

    def describe_build(self, onnx_path: Path | None, engine_path: Path, variant: VariantSpec, source: ModelSource) -> list[str]:
        points = len(source.shape_points())
        prepare = {
            "eager": "nothing to prepare",
            "compile": f"torch.compile(mode={self.mode!r}, fullgraph={self.spec.fullgraph}, dynamic={self.spec.dynamic}), compiled by one run"
            + (
                ""
                if self.spec.dynamic or points < 2
                else f", then at each of the {points} shape points in processes side by side (in a run that profiles them, the first too)"
            )
            + (", replayed from a CUDA graph" if self.spec.capture else "")
            + f" (compiled work kept in {self.compile_cache})",
            "cudagraphs": "capture one run in a CUDA graph",
        }[self.spec.backend]
        return [
            f"build: torch {self.version}: {source.describe()} ({TORCH_DTYPES.get(variant.precision, variant.precision)})"
            f"{self._attention_words()} → {engine_path}; {prepare}"
        ]

    def build(self, onnx_path: Path | None, engine_path: Path, variant: VariantSpec, source: ModelSource) -> BuildResult:
        torch = import_torch()
        dtype = getattr(torch, TORCH_DTYPES[variant.precision])
        created, model = cast_model(source, dtype)  # the last build's weights, where they are these
        if self.spec.attn_implementation:
            source.use_attention(model, self.spec.attn_implementation)
        points = source.shape_points()
        # Prepared (compiled, captured) at the first shape point (a static engine's own); the others
        # are prepared when they are profiled. A run whose profiles follow may take that point too
        # into its work ahead (leave_build_point_ahead): compiled there beside the other points,
        # not in this process one engine after another.
        point = source.static_point or (points[0] if points else None)
        examples = source.sample_inputs(created, point, 0)
        leave_point = self.leave_build_point_ahead and self.builds_long and source.static_point is None and len(points) > 1
        self._building_point = point.label if point is not None and not leave_point else None
        write_engine(engine_path, source, variant.precision, examples, model)
        if self.engine_written is not None:  # the other points compile beside this one's
            self.engine_written(engine_path)
        device = "cuda" if self._cuda_available() else "cpu"
        settings = self.settings(variant.precision, device)
        if leave_point:  # every point, this one too, is compiled ahead: its facts join this manifest then
            return BuildResult(engine_path=engine_path, settings=settings, evidence={"compiler": self.versions()})
        # The models the earlier builds prepared at this build's point are what that point's profile
        # times next, beside this one, so they stay rather than be read and prepared again (measured:
        # docs/results/cluster.md, 'The seed matrix's bf16 half'). Those prepared at another point
        # (a model of one shape per point) would only hold memory.
        self._kept.only_at(self._building_point)
        try:
            preparation = TorchPreparation(self.spec, self.reporter)
            prepared = preparation.prepare(model, examples, dtype, device, file_identity(engine_path), point and point.label)
        except NotPrepared as exc:
            result = BuildResult(engine_path=None, settings=settings, evidence={"compiler": {**self.versions(), **exc.facts}})
            raise RefusedByTool(exc.message, exc.hint, result=result) from exc.__cause__
        except OutOfMemory as exc:
            if source.static_point is not None or len(points) < 2:
                raise  # the engine's one point: the build's own result
            # One point of an engine of several: that point's result, which its profile finds and
            # records when it prepares there again; the engine (its weights) is built.
            note = f"preparing at {point.label} ran out of memory; that point's profile records it: {exc.message}"
            self.reporter.warn(f"{engine_path.name}: {note}")
            return BuildResult(engine_path=engine_path, settings=settings, notes=[note], evidence={"compiler": self.versions()})
        self._kept.keep(prepared)
        facts = prepared.facts
        notes = []
        if facts.get("graph_breaks"):
            notes.append(graph_break_words(facts))
            self.reporter.warn(f"{engine_path.name}: {notes[-1]}{FULLGRAPH_WORDS}")
        return BuildResult(engine_path=engine_path, settings=settings, notes=notes, evidence={"compiler": {**self.versions(), **facts}})

    def versions(self) -> dict[str, Any]:
        torch = import_torch()
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": cudnn,
            "triton": package_version("triton"),
            "timm": package_version("timm"),
        }

    def describe_profile(self, engine_path: Path, settings: ProfileSettings, workload=None) -> list[str]:
        clock = "runs enqueued back to back, each timed by CUDA events on the GPU, like trtexec (host time on a CPU)"
        return [f"profile: torch {self.version} {self.spec.backend}: {engine_path.name}{_at(workload)}, {rounds_words(settings)}; {clock}"]

    def load(self, engine_path: Path, workload: ReferenceBatch | None = None) -> Prepared:
        """The prepared model for this engine file at the workload's shape point: the one the build
        (or the last profile) left, else prepared again — from the file, or from the model already
        loaded when only the shape point differs."""
        identity = file_identity(engine_path)
        shape = workload.shape if workload is not None else None
        prepared, lender = self._kept.take(identity, shape)
        if prepared is not None:
            return prepared
        prepared = lender
        torch = import_torch()
        saved = None
        if prepared is not None:
            model = prepared.model
        else:
            saved = read_engine(engine_path)
            model = model_from(saved, self.workspace_root, self.spec.attn_implementation)
        # The model's floating type; a module without weights (attention alone) has it from the
        # engine's precision, or from the inputs it was prepared with.
        floating = [t.dtype for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
        if floating:
            dtype = floating[0]
        elif saved is not None:
            dtype = getattr(torch, TORCH_DTYPES[saved["precision"]])
        else:
            dtype = next((t.dtype for t in prepared.examples if t.is_floating_point()), torch.float32)
        if workload is not None:
            examples = tuple(torch.from_numpy(t.values() if t.is_integer else t.as_float32()) for t in workload.inputs)
        else:
            shapes = saved["input_shapes"] if saved is not None else [list(t.shape) for t in prepared.examples]
            examples = (torch.randn(*shapes[0], generator=torch.Generator().manual_seed(0)),)
        device = "cuda" if self._cuda_available() else "cpu"
        reuse, prepared = prepared, None  # the same model at another point: its dynamic compilation serves this one
        started = time.perf_counter()
        try:
            prepared = TorchPreparation(self.spec, self.reporter).prepare(model, examples, dtype, device, identity, shape, reuse)
        except NotPrepared as exc:
            # Recorded in this point's profile manifest (this shape, this GPU, this release).
            raise RefusedByTool(exc.message, exc.hint) from exc.__cause__
        prepared.facts["prepare_s"] = round(time.perf_counter() - started, 3)
        self._kept.keep(prepared)
        return prepared

    def prepare(self, engine_path: Path, workload: ReferenceBatch | None = None):
        """The engine ready to time at the workload's shape point (pipeline/measuring/rounds.py), with
        what the manifest records of how it runs: served by the process that compiled it where one
        kept it (served.ServedEngine), else prepared here."""
        served = self._served_at(engine_path, workload)
        if served is not None:
            try:
                return served.ready()
            except ProcessGone as exc:  # prepared here instead, from Inductor's cache
                self.reporter.warn(f"{Path(engine_path).name} at {served.shape}: {exc.message}; preparing it in this process")
                self._served.pop((file_identity(engine_path), served.shape), None)
        return self.ready(self.load(engine_path, workload))

    def ready(self, prepared: Prepared) -> Prepared:
        """A loaded model made ready for the rounds: what the manifest records of how it runs (this
        process's, or a compiling process's that serves it). Its GPU memory is measured by the
        run that warms it before the rounds (Prepared.warm), not by a run of its own here."""
        # A model its build left prepared at this point took nothing to prepare here (its build's
        # compilation is in the build manifest); one prepared here says how long it took.
        execution: dict[str, Any] = {**self.versions(), **self.settings_in_force(prepared), "prepare_s": 0.0, **prepared.facts}
        if prepared.cuda:
            torch = import_torch()
            execution["compute_capability"] = "{}.{}".format(*torch.cuda.get_device_capability())
        prepared.execution = execution
        return prepared

    def serve(self, engine, streams: int, seconds: float, start_at: StartAt = None) -> ServedRun:
        if isinstance(engine, ServedEngine):  # a compiled point held by the process that compiled it
            return engine.serve_streams(streams, seconds, start_at)
        if isinstance(engine, Prepared):  # else serve_streams says why it cannot
            engine.first_output = None  # no reference run follows: the memory is the streams'
            engine.in_force()
        attention = TorchPreparation(self.spec, self.reporter).attention_kernel(import_torch())
        return serve_streams(self.spec, attention, engine, streams, seconds, start_at)

    def run_reference(self, engine_path: Path, reference: ReferenceBatch) -> ReferenceRun:
        served = self._served_at(engine_path, reference if reference.shape else None)
        if served is not None and served.alive():
            return served.reference_run(reference)
        return self.reference_run(self.load(engine_path, reference if reference.shape else None), reference, engine_path.name)

    def reference_run(self, prepared: Prepared, reference: ReferenceBatch, name: str) -> ReferenceRun:
        """The prepared model's outputs on the reference batch (its inputs copied into the model's
        own); ``name``: the engine's, for an error."""
        expected = [list(t.shape) for t in prepared.examples]
        given = [list(t.shape) for t in reference.inputs]
        if expected != given:
            raise PipelineError(
                f"{name} takes input(s) of shape {expected}; the reference batch has {given}.",
                hint="the engine and the reference come from different exports; rebuild it (`--force`)",
            )
        with out_of_memory_as_error(prepared.batch_size, shape=prepared.shape):
            output = prepared.infer(tuple(t.values() if t.is_integer else t.as_float32() for t in reference.inputs))
        where = prepared.execution.get("served_by", {}).get("process", "this process")
        return ReferenceRun(
            outputs={reference.output.name: output},
            checked_by=f"torch {self.version} {self.spec.backend} on {prepared.device}, in {where}",
        )

    def settings_in_force(self, prepared: Prepared) -> dict[str, Any]:
        return {
            "backend": self.spec.backend,
            "mode": self.mode,
            "device": prepared.device,
            "tf32": self.spec.tf32,
            "attn_implementation": self.spec.attn_implementation,
            "sdpa_backend": self.spec.sdpa_backend,
        }


def _at(workload) -> str:
    return " at " + ", ".join(f"{n} {'×'.join(map(str, d))}" for n, d in workload.shapes.items()) if workload is not None else ""
