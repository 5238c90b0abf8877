"""PyTorch itself: eager, ``torch.compile`` (Inductor) and CUDA graphs — the baseline every
engine is measured against, because it is what users run before they have an engine.

The stages mean what they mean for every toolchain:

* **build** writes the runnable model (``engines/<toolchain>/<engine>.pt``: the timm architecture's
  name and its weights in the variant's precision, so the file pins exactly what is timed) and
  prepares it: for ``compile`` the compilation, timed, with the graph breaks counted and where
  Inductor keeps its cache recorded — and, for a model of several shape points, the compilation
  at every point in processes side by side (pipeline/runtimes/torch_compile_ahead.py), so that
  each point's profile finds its graphs in Inductor's cache; for ``cudagraphs`` the capture.
* **profile** prepares it (:meth:`TorchRuntime.prepare`) and hands it to the measurement protocol
  (pipeline/measurement.py), which times it in rounds beside the other engines of the shape point.
  On a GPU the runs of a take are enqueued back to back and each is bracketed by CUDA events, so a
  run's time is the GPU's, as trtexec's GPU compute time is; the host-synchronised latency is kept
  beside it as a second figure. On the CPU a run's time is host time. A profile right after the
  build, in the same process, reuses the prepared model; a later one prepares it again from
  Inductor's cache (recorded as ``prepare_s``). The prepared model — what the protocol times, and
  the ways it runs (eager, compiled, a CUDA graph replayed) — is pipeline/runtimes/torch_prepared.py;
  GPU memory and running out of it, pipeline/runtimes/torch_memory.py.

Quantized and 2:4-sparse variants are ModelOpt's fake-quantized or pruned-dense PyTorch models:
they compute in high precision and time nothing a deployment would run, so they are recorded as
skipped here. Their engines are TensorRT's job.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sysconfig
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from pipeline.accuracy import ReferenceBatch
from pipeline.catalog import ProfileSettings, ToolchainSpec, VariantSpec
from pipeline.environment import nvidia_gpus, package_version
from pipeline.errors import EnvironmentMissing, PipelineError, RefusedByTool
from pipeline.models import TORCH_DTYPES, ModelSource
from pipeline.runtimes.base import AheadWork, BuildResult, InProcessRuntime, ReferenceRun, ToolchainStatus, rounds_words
from pipeline.runtimes.torch_memory import gpu_memory, is_out_of_memory, out_of_memory_as_error
from pipeline.runtimes.torch_prepared import (
    Prepared,
    capture,
    compiled_run,
    import_torch,
    no_grad,
    sdpa_kernels,
    within,
)

# What the engine file holds; checked on load so a stray .pt is a clear error, not a crash.
ENGINE_FORMAT = "trt-pipeline torch model"
# 2: the model is described by its family and catalog settings (1: a timm architecture's name).
ENGINE_FORMAT_VERSION = 2


Backend = Literal["eager", "compile", "cudagraphs"]
# torch.compile's modes that capture the compiled model in CUDA graphs (torch/_inductor: "mode
# reduce-overhead ... uses CUDA graphs"; max-autotune too, unless "-no-cudagraphs").
CAPTURING_MODES = ("reduce-overhead", "max-autotune")
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
SdpaBackend = Literal["flash", "efficient", "cudnn", "math"]
# torch.nn.attention.SDPBackend's member for each.
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}


class TorchSpec(ToolchainSpec):
    """PyTorch running the model itself: eager, torch.compile, or eager captured in a CUDA graph."""

    kind: Literal["torch"]
    backend: Backend = "eager"
    # torch.compile's mode (Inductor); only for backend = "compile". None: torch's "default".
    mode: CompileMode | None = None
    # Fail the build on any graph break instead of running the broken graph piecewise.
    fullgraph: bool = False
    # torch.compile's `dynamic`: False specialises the compiled graph to each shape point's shapes,
    # True compiles it for symbolic shapes. Either way every point is compiled (warmed) before it
    # is timed: a compilation is never inside a measurement.
    dynamic: bool = False
    # The model's attention: "sdpa" (PyTorch's fused scaled-dot-product attention) or "eager" (the
    # model's own matmul-softmax-matmul); None keeps the model's (the catalog's model setting).
    attn_implementation: Literal["sdpa", "eager"] | None = None
    # Which of PyTorch's SDPA kernels may run (torch.nn.attention.sdpa_kernel); None lets PyTorch
    # choose per call. A kernel that cannot run this dtype or GPU is a refusal, with PyTorch's reason.
    sdpa_backend: SdpaBackend | None = None
    # FP32 matrix products on TF32 tensor cores. Off is PyTorch's default (real FP32); TensorRT
    # uses TF32 for FP32 by default, so turn it on for a like-for-like FP32 comparison.
    tf32: bool = False

    @model_validator(mode="after")
    def _sdpa_backend_needs_sdpa(self):
        if self.sdpa_backend is not None and self.attn_implementation == "eager":
            raise ValueError('sdpa_backend chooses among SDPA kernels: it needs attn_implementation = "sdpa" (or unset), not "eager"')
        return self

    @model_validator(mode="after")
    def _compile_options_need_compile(self):
        if self.backend != "compile" and (self.mode is not None or self.fullgraph or self.dynamic):
            raise ValueError(
                f'mode, fullgraph and dynamic are torch.compile settings: they need backend = "compile" (got backend = "{self.backend}")'
            )
        return self


class NotPrepared(Exception):
    """torch.compile, or the attention kernel the toolchain asks for, refused the model: a fact
    about the model, the release and the GPU, recorded as a refusal (see RefusedByTool)."""

    def __init__(self, message: str, hint: str, facts: dict[str, Any]):
        super().__init__(message)
        self.message, self.hint, self.facts = message, hint, facts


class TorchRuntime(InProcessRuntime):
    kind = "torch"
    # Engines are made from the PyTorch model: a model the exporter refused still runs here.
    reads_onnx = False
    Spec = TorchSpec
    engine_suffix = ".pt"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The last model this runtime prepared of each engine file, kept so a profile right after
        # its build does not compile again, and the next shape point reuses the loaded model (the
        # variants of a sweep alternate, point after point, in one process).
        self._prepared: dict[tuple[int, int, int], Prepared] = {}

    # --- what it is -----------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return package_version("torch") or "not installed"

    @property
    def mode(self) -> str | None:
        return (self.spec.mode or "default") if self.spec.backend == "compile" else None

    @property
    def captures(self) -> bool:
        """Whether torch.compile's mode captures the compiled model in CUDA graphs."""
        return self.mode in CAPTURING_MODES

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
        what = {"eager": "eager", "compile": f"torch.compile (Inductor, mode {self.mode}{dynamic})", "cudagraphs": "eager in a CUDA graph"}
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
        cuda = self._cuda_available()
        if (self.spec.backend == "cudagraphs" or self.captures) and not cuda:
            how = "captures" if self.spec.backend == "cudagraphs" else f"compiles with mode {self.spec.mode}, which captures"
            return (
                f"toolchain {self.name} {how} CUDA graphs, which need an NVIDIA GPU; torch {self.version} sees none.",
                "here, use a torch toolchain whose backend is eager or compile (without CUDA graphs); or run on a GPU machine",
            )
        if self.spec.backend == "compile":
            if cuda and find_spec("triton") is None:
                return (
                    f"toolchain {self.name} compiles with Inductor, which needs Triton on GPUs; it is not installed.",
                    "install the triton release your torch was built with (CUDA wheels of torch bring it)",
                )
            if not cuda and not any(shutil.which(cxx) for cxx in (os.environ.get("CXX", ""), "g++", "clang++", "c++") if cxx):
                return (
                    f"toolchain {self.name} compiles with Inductor, which needs a C++ compiler on the CPU; none is on PATH.",
                    "install one (`apt-get install g++`) or set CXX",
                )
            if not cuda and not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
                # Inductor's CPU kernels are C++ that includes Python.h.
                return (
                    f"toolchain {self.name} compiles with Inductor, which needs Python's C headers on the CPU; Python.h is not installed.",
                    "install them (`apt-get install python3-dev`, matching this Python)",
                )
        return None

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
        return settings

    def describe_build(self, onnx_path: Path | None, engine_path: Path, variant: VariantSpec, source: ModelSource) -> list[str]:
        points = len(source.shape_points())
        prepare = {
            "eager": "nothing to prepare",
            "compile": f"torch.compile(mode={self.mode!r}, fullgraph={self.spec.fullgraph}, dynamic={self.spec.dynamic}), compiled by one run"
            + ("" if self.spec.dynamic or points < 2 else f", then at each of the {points} shape points in processes side by side")
            + " (Inductor's cache: $TORCHINDUCTOR_CACHE_DIR, else torchinductor_<user> in the temp directory)",
            "cudagraphs": "capture one run in a CUDA graph",
        }[self.spec.backend]
        return [
            f"build: torch {self.version}: {source.describe()} ({TORCH_DTYPES.get(variant.precision, variant.precision)})"
            f"{self._attention_words()} → {engine_path}; {prepare}"
        ]

    def build(self, onnx_path: Path | None, engine_path: Path, variant: VariantSpec, source: ModelSource) -> BuildResult:
        torch = import_torch()
        dtype = getattr(torch, TORCH_DTYPES[variant.precision])
        created = source.create()
        model = source.cast(source.runnable(created), dtype)
        if self.spec.attn_implementation:
            source.use_attention(model, self.spec.attn_implementation)
        points = source.shape_points()
        # Prepared (compiled, captured) at the first shape point (a static engine's own); the others
        # are prepared when they are profiled.
        point = source.static_point or (points[0] if points else None)
        examples = source.sample_inputs(created, point, 0)
        torch.save(
            {
                "format": ENGINE_FORMAT,
                "format_version": ENGINE_FORMAT_VERSION,
                # What makes the model again: its family and catalog settings (weights below).
                "source": {"name": source.name, "family": source.family, "spec": source.spec.model_dump(mode="json")},
                "precision": variant.precision,
                "input_shapes": [list(t.shape) for t in examples],
                "state_dict": model.state_dict(),
            },
            engine_path,
        )
        device = "cuda" if self._cuda_available() else "cpu"
        settings = self.settings(variant.precision, device)
        self._prepared.clear()  # free the previous models' memory before preparing this one
        try:
            prepared = self._prepare(model, examples, dtype, device, _file_identity(engine_path), point and point.label)
        except NotPrepared as exc:
            result = BuildResult(engine_path=None, settings=settings, evidence={"compiler": {**self.versions(), **exc.facts}})
            raise RefusedByTool(exc.message, exc.hint, result=result) from exc.__cause__
        self._prepared[prepared.engine_file] = prepared
        facts = prepared.facts
        notes = []
        if facts.get("graph_breaks"):
            notes.append(
                f"{facts['graph_breaks']} graph break(s): the model runs as {facts['graphs']} compiled graphs with eager code between them"
            )
            self.reporter.warn(f"{engine_path.name}: {notes[-1]} (set fullgraph = true to refuse them)")
        return BuildResult(engine_path=engine_path, settings=settings, notes=notes, evidence={"compiler": {**self.versions(), **facts}})

    def ahead_work(self, engine_path: Path, workloads: list[ReferenceBatch]) -> AheadWork | None:
        """torch.compile at every shape point, in processes of their own beside the other compiled
        engines' points, leaving the graphs in Inductor's cache for the profiles
        (pipeline/runtimes/torch_compile_ahead.py). Only a compilation specialised to each point
        has work to share out; a dynamic one is compiled once, and eager runs and CUDA graphs cost
        a point little."""
        from pipeline.runtimes import torch_compile_ahead

        if self.spec.backend != "compile" or self.spec.dynamic or len(workloads) < 2:
            return None
        jobs = [torch_compile_ahead.CompileJob(self.name, self.spec, self.workspace_root, engine_path, workload) for workload in workloads]
        return AheadWork(engine_path, jobs, torch_compile_ahead.CompilePool, f"compiling at {len(jobs)} shape points")

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

    def _prepare(
        self,
        model,
        examples: tuple,
        dtype,
        device: str,
        engine_file: tuple[int, int, int],
        shape: str | None,
        reuse: Prepared | None = None,
    ) -> Prepared:
        """``model`` ready to run on ``examples`` (CPU tensors; floating ones become ``dtype``), run
        once (compiled, captured, warmed) so that nothing is compiled inside a measurement. ``reuse``:
        the same model prepared at another shape point, whose dynamic compilation serves this one."""
        torch = import_torch()
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.spec.tf32
            torch.backends.cudnn.allow_tf32 = self.spec.tf32
        attention = self._attention_kernel(torch)
        with out_of_memory_as_error(int(examples[0].shape[0]), shape=shape):
            model = model.to(device)
            placed = tuple(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in examples)
            facts: dict[str, Any] = {}
            compiled, compiled_at = None, None
            with attention():
                if self.spec.backend == "eager":
                    run = no_grad(lambda: model(*placed))
                    self._first_run(torch, run)
                elif self.spec.backend == "cudagraphs":
                    self.reporter.progress("capturing a CUDA graph")
                    run = self._first_run(torch, lambda: self._captured(torch, model, placed))
                else:
                    if reuse is not None and reuse.compiled is not None and self.spec.dynamic:
                        self.reporter.progress(f"warming the dynamic compilation at {shape}")
                        compiled, compiled_at = reuse.compiled, reuse.compiled_at
                        run, facts = self._warm_compiled(torch, compiled, placed, reuse.facts)
                    else:
                        self.reporter.progress(f"compiling with torch.compile (mode {self.mode or 'default'})")
                        compiled, compiled_at = (
                            torch.compile(model, mode=self.mode, fullgraph=self.spec.fullgraph, dynamic=self.spec.dynamic),
                            shape,
                        )
                        run, facts = self._compile(torch, compiled, placed)
            run = within(attention, run)
            # The kernel PyTorch chose for scaled-dot-product attention (it prefers cuDNN's where its
            # bundled cuDNN is new enough): a CUDA graph's replay passes no operator, so the eager
            # model it captured is asked instead.
            chose = sdpa_kernels(torch, run if self.spec.backend != "cudagraphs" else within(attention, no_grad(lambda: model(*placed))))
            if chose:
                facts = {**facts, "sdpa_kernels": chose}
            wanted = self.spec.sdpa_backend
            if wanted and chose and chose != [wanted]:
                # Seen on the H100 (torch 2.11): compiled engines of one module asking for the
                # cudnn, efficient and flash kernels all ran flash, torch.compile's own choice, not
                # the SDPA setting's. Their times would be another kernel's under this name.
                raise NotPrepared(
                    f"the {wanted} SDPA kernel was asked for, but the prepared model ran {' and '.join(chose)}",
                    "compare SDPA kernels eagerly (sdpa_backend on an eager toolchain); compiled, PyTorch chooses its own",
                    {"sdpa_backend": wanted, "sdpa_kernels": chose},
                )
        return Prepared(engine_file, self._refusing_later(run), placed, device, shape, facts, model, compiled, compiled_at)

    def _attention_kernel(self, torch):
        """A fresh context per call that restricts SDPA to the toolchain's kernel (a no-op context without one)."""

        if self.spec.sdpa_backend is None:
            return contextlib.nullcontext
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[self.spec.sdpa_backend])
        return lambda: sdpa_kernel([backend])

    def _first_run(self, torch, run: Callable[[], Any]):
        """``run()``, once, with the SDPA kernel PyTorch could not use turned into a refusal naming
        PyTorch's reasons (its warnings say why each kernel was passed over)."""
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with torch.no_grad():
                    return run()
            except RuntimeError as exc:
                refusal = self._attention_refusal(str(exc), [str(w.message) for w in caught])
                if refusal is None:
                    raise
                raise refusal from exc

    def _refusing_later(self, run: Callable[[], Any]) -> Callable[[], Any]:
        """``run``, with PyTorch refusing the toolchain's SDPA kernel at a later call a refusal too.
        A later call can see values the first run did not: on the H100 a BERT prepared at 2×16 on
        an unpadded batch ran the flash kernel, and the reference batch at the same point, padded,
        made PyTorch give up (`No available kernel`). The refusal is then this point's, recorded
        where it was found. PyTorch's reasons are warnings it gives once per place, so the run is
        repeated, recording them, only when it has failed."""
        if self.spec.sdpa_backend is None:
            return run

        def run_or_refuse():
            try:
                return run()
            except RuntimeError as exc:
                if self._attention_refusal(str(exc), []) is None:
                    raise
                refusal = self._attention_refusal(str(exc), _warnings_of(run))
                raise RefusedByTool(refusal.message, refusal.hint) from exc

        return run_or_refuse

    def _attention_refusal(self, error: str, warned: list[str]) -> NotPrepared | None:
        if self.spec.sdpa_backend is None or not any(words in error for words in ("No available kernel", "No viable backend")):
            return None
        because = "; ".join(dict.fromkeys(_kernel_reasons(warned, self.spec.sdpa_backend))) or error.strip().splitlines()[0]
        return NotPrepared(
            f"PyTorch cannot run scaled-dot-product attention with the {self.spec.sdpa_backend} kernel here: {because}",
            "choose another sdpa_backend for this dtype and GPU, or leave it unset for PyTorch to choose",
            {"sdpa_backend": self.spec.sdpa_backend, "error": error[:4000], "pytorch_warnings": warned[:20]},
        )

    def _compile(self, torch, compiled, examples: tuple):
        """Compile ``compiled`` (torch.compile's module) by running it once on ``examples``.

        Dynamo caches compiled code on the code object of forward(), which every model of one
        class shares (each timm ViT, each dtype and shape point of one transformer), guarded by the
        inputs' dtypes and shapes and the backend (the mode), not by the model instance. Several
        compiled models live in this process while a shape point is timed, so the cache is not
        reset before each: its recompile limit (past which Dynamo silently runs eagerly) is raised
        to the accumulated limit instead. A model another one's compilation served — same class,
        shapes and mode, so no graph was traced, and fullgraph and the graph facts untested — is
        compiled afresh after a reset; the others recompile when they next run, which the
        protocol's warm-up does before any take (pipeline/measurement.py)."""
        import torch._dynamo
        from torch._inductor.runtime import cache_dir_utils

        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, config.accumulated_recompile_limit)
        counters = torch._dynamo.utils.counters
        started = time.perf_counter()
        for fresh in (False, True):
            if fresh:
                torch._dynamo.reset()
            counters.clear()
            self._compile_once(torch, compiled, examples, started)
            if int(counters["stats"]["unique_graphs"]):
                break
        else:
            raise NotPrepared(
                "torch.compile compiled no graph: Dynamo ran the model eagerly (it skipped the frame)",
                "-v shows Dynamo's log; try the torch-eager toolchain",
                {"compile_s": round(time.perf_counter() - started, 3), "recompile_limit": config.recompile_limit},
            )
        facts = {
            "compile_s": round(time.perf_counter() - started, 3),
            "graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "graph_break_reasons": sorted(counters["graph_break"])[:20],
            "inductor_cache_dir": cache_dir_utils.cache_dir(),
            "inductor_cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
            "dynamic": self.spec.dynamic,
            "recompiles": 0,
            "compiled_after_a_reset": fresh,
        }
        return compiled_run(torch, compiled, examples), facts

    def _compile_once(self, torch, compiled, examples: tuple, started: float) -> None:
        # A mode that captures CUDA graphs skips the capture, with a warning, where it cannot hold
        # the model (a CPU tensor, an input it mutates, …) and runs it uncaptured: here that is an
        # error, so the point records a refusal with Inductor's reason instead of timing something else.
        graphs_captured = self.captures and examples[0].is_cuda
        strict = torch._inductor.config.patch({"triton.cudagraph_or_error": True}) if graphs_captured else contextlib.nullcontext()
        try:
            # Inductor prints its autotuning tables: shown with -v, like the export's tools.
            with self.reporter.captured("torch.compile"), strict:
                self._first_run(torch, lambda: compiled(*examples))
            if examples[0].is_cuda:
                torch.cuda.synchronize()
        except (torch.cuda.OutOfMemoryError, NotPrepared):
            raise
        except Exception as exc:  # Dynamo/Inductor raise many types: Unsupported, BackendCompilerFailed, …
            text = str(exc).strip()
            refusal = self._attention_refusal(text, [])
            if refusal is not None:
                raise refusal from exc
            skipped = re.search(r"skipping cudagraphs due to (.+)", text)
            if skipped:
                raise NotPrepared(
                    f"torch.compile (mode {self.mode}) cannot capture the model in a CUDA graph: {skipped.group(1).strip().splitlines()[0]}",
                    "the model does what a capture cannot hold at this point; torch-compile without CUDA graphs runs it",
                    {"error": text[:4000], "compile_s": round(time.perf_counter() - started, 3)},
                ) from exc
            first = text.splitlines()[0] if text else type(exc).__name__
            fullgraph = self.spec.fullgraph and "graph break" in text.lower()
            raise NotPrepared(
                f"torch.compile failed: {first}",
                "the model breaks the graph and the toolchain has fullgraph = true; set it to false to run the pieces"
                if fullgraph
                else "run with -v for the compiler's traceback; try another mode, or the torch-eager toolchain",
                {"error": text[:4000], "error_type": type(exc).__name__, "compile_s": round(time.perf_counter() - started, 3)},
            ) from exc

    def _captured(self, torch, model, examples: tuple):
        """``model`` captured in a CUDA graph; a model the capture cannot hold (one that synchronises
        with the host, or branches on a value it computes) is a refusal with PyTorch's reason."""
        try:
            return capture(torch, model, examples)
        except RuntimeError as exc:
            if is_out_of_memory(type(exc), exc) or self._attention_refusal(str(exc), []) is not None:
                raise
            torch.cuda.synchronize()
            raise NotPrepared(
                f"the CUDA graph capture failed: {str(exc).strip().splitlines()[0]}",
                "the model does what a capture cannot hold (a host synchronisation, control flow on a computed value); "
                "torch-eager or torch-compile runs it",
                {"error": str(exc)[:4000]},
            ) from exc

    def _warm_compiled(self, torch, compiled, examples: tuple, compiled_facts: dict[str, Any]):
        """The dynamic compilation, run once at another shape point: whatever Dynamo compiles
        now (a guard the new shapes fail) is counted as recompilations, before any timing."""
        counters = torch._dynamo.utils.counters
        graphs_before = int(counters["stats"]["unique_graphs"])
        started = time.perf_counter()
        self._first_run(torch, lambda: compiled(*examples))
        if examples[0].is_cuda:
            torch.cuda.synchronize()
        recompiles = int(counters["stats"]["unique_graphs"]) - graphs_before
        facts = {
            **{
                key: compiled_facts[key]
                for key in ("compile_s", "graphs", "graph_breaks", "graph_break_reasons", "inductor_cache_dir", "dynamic")
            },
            "compiled_at_another_point": True,
            "warm_s": round(time.perf_counter() - started, 3),
            "recompiles": recompiles,
        }
        if recompiles:
            self.reporter.warn(f"torch.compile (dynamic) compiled {recompiles} more graph(s) for this shape point, before timing it")
        return compiled_run(torch, compiled, examples), facts

    # --- profile ------------------------------------------------------------------------------------

    def describe_profile(self, engine_path: Path, settings: ProfileSettings, workload=None) -> list[str]:
        clock = "runs enqueued back to back, each timed by CUDA events on the GPU, like trtexec (host time on a CPU)"
        return [f"profile: torch {self.version} {self.spec.backend}: {engine_path.name}{_at(workload)}, {rounds_words(settings)}; {clock}"]

    def load(self, engine_path: Path, workload: ReferenceBatch | None = None) -> Prepared:
        """The prepared model for this engine file at the workload's shape point: the one the build
        (or the last profile) left, else prepared again — from the file, or from the model already
        loaded when only the shape point differs."""
        identity = _file_identity(engine_path)
        shape = workload.shape if workload is not None else None
        prepared = self._prepared.pop(identity, None)
        if prepared is not None and prepared.shape == shape:
            self._prepared[identity] = prepared
            return prepared
        torch = import_torch()
        saved = None
        if prepared is not None:
            model = prepared.model
        else:
            saved = self._read(engine_path)
            model = self._model_from(saved)
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
            prepared = self._prepare(model, examples, dtype, device, identity, shape, reuse)
        except NotPrepared as exc:
            # Recorded in this point's profile manifest (this shape, this GPU, this release).
            raise RefusedByTool(exc.message, exc.hint) from exc.__cause__
        prepared.facts["prepare_s"] = round(time.perf_counter() - started, 3)
        self._prepared[identity] = prepared
        return prepared

    def _read(self, engine_path: Path) -> dict[str, Any]:
        torch = import_torch()
        try:
            saved = torch.load(engine_path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise PipelineError(f"{engine_path} is not a readable PyTorch file: {exc}", hint="rebuild it with --force") from exc
        if not isinstance(saved, dict) or saved.get("format") != ENGINE_FORMAT or saved.get("format_version") != ENGINE_FORMAT_VERSION:
            raise PipelineError(f"{engine_path} was not written by this pipeline's torch toolchain.", hint="rebuild it with --force")
        return saved

    def _model_from(self, saved: dict[str, Any]):
        """The model an engine file describes, with its weights, in its precision, in eval mode."""
        from pipeline.models import model_source, source_class

        torch = import_torch()
        described = saved["source"]
        spec = source_class(described["family"]).Spec.model_validate(described["spec"])
        source = model_source(described["name"], spec, self.workspace_root)
        dtype = getattr(torch, TORCH_DTYPES[saved["precision"]])
        model = source.cast(source.runnable(source.create()), dtype)
        model.load_state_dict(saved["state_dict"])
        if self.spec.attn_implementation:
            source.use_attention(model, self.spec.attn_implementation)
        return model.eval()

    def prepare(self, engine_path: Path, workload: ReferenceBatch | None = None) -> Prepared:
        """The engine ready to time at the workload's shape point (pipeline/measurement.py), with
        what the manifest records of how it runs."""
        prepared = self.load(engine_path, workload)
        execution: dict[str, Any] = {**self.versions(), **self.settings_in_force(prepared), **prepared.facts}
        if prepared.cuda:
            torch = import_torch()
            execution["peak_memory_mib"] = gpu_memory(torch, prepared)
            execution["compute_capability"] = "{}.{}".format(*torch.cuda.get_device_capability())
        prepared.execution = execution
        return prepared

    def run_reference(self, engine_path: Path, reference: ReferenceBatch) -> ReferenceRun:
        prepared = self.load(engine_path, reference if reference.shape else None)
        expected = [list(t.shape) for t in prepared.examples]
        given = [list(t.shape) for t in reference.inputs]
        if expected != given:
            raise PipelineError(
                f"{engine_path.name} takes input(s) of shape {expected}; the reference batch has {given}.",
                hint="the engine and the reference come from different exports; rebuild it (`--force`)",
            )
        with out_of_memory_as_error(prepared.batch_size, shape=prepared.shape):
            output = prepared.infer(tuple(t.values() if t.is_integer else t.as_float32() for t in reference.inputs))
        return ReferenceRun(
            outputs={reference.output.name: output},
            checked_by=f"torch {self.version} {self.spec.backend} on {prepared.device}, in this process",
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


def _kernel_reasons(warned: list[str], kernel: str) -> list[str]:
    """PyTorch's reasons for passing over SDPA kernels, from its warnings, without what only
    restates the restriction of the toolchain to ``kernel``. Recorded on the H100 (torch 2.11),
    flash refusing a padded batch warns "Flash attention kernel not used because: (Triggered
    internally at …)", then "Flash Attention does not support non-null attn_mask. (Triggered
    internally at …)", and each other kernel "… has been runtime disabled.": the second alone
    says why."""
    reasons = []
    for warning in warned:
        line = re.sub(r"\s*\(Triggered internally at [^)]*\)\s*", " ", warning.strip().splitlines()[0] if warning.strip() else "").strip()
        if not ("kernel" in line.lower() or "attention" in line.lower()):
            continue
        if line.endswith("because:"):
            continue  # a heading of the reasons that follow
        if "has been runtime disabled" in line and kernel not in line.lower():
            continue  # a kernel the toolchain itself turned off
        reasons.append(line)
    return reasons


def _warnings_of(run: Callable[[], Any]) -> list[str]:
    """The warnings one more call of a run that failed gives (it fails again)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught, contextlib.suppress(RuntimeError):
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught]


def _file_identity(path: Path) -> tuple[int, int, int]:
    stat = Path(path).stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
