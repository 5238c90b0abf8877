"""TensorRT for RTX: a TensorRT compiler that installs from the package index, one release per toolchain.

TensorRT-RTX is NVIDIA's TensorRT for RTX-class GPUs (GeForce RTX, RTX PRO): TensorRT's Python
API, strongly typed networks only, and an ahead-of-time build for a chosen GPU architecture that
runs on a machine without any GPU. Its engines run only on the GPUs it targets; it is not
datacenter TensorRT and its engines do not run on Hopper (H100) or other datacenter parts.

Each release lives in its own environment (a venv under the cache directory, made by
``pipeline toolchains pull``), holding NVIDIA's two wheels and nothing else. Builds and profiles
run there as a child process (``tensorrt_rtx/driver.py``), so two releases never share a process
and this package never imports TensorRT. What the compiler refuses (an op it cannot parse, a data
type the target GPU lacks) is recorded with its own message, and the other engines go on.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pipeline.catalog import ProfileSettings, VariantSpec
from pipeline.machine.environment import nvidia_gpus
from pipeline.measuring.accuracy import ReferenceBatch
from pipeline.models import ModelSource
from pipeline.running.cache import cache_dir
from pipeline.running.errors import EnvironmentMissing, OutOfMemory, PipelineError, RefusedByTool, ToolCrashed, ToolStopped, UsageError
from pipeline.running.files import atomic_write_text
from pipeline.runtimes.base import BuildResult, EngineRuntime, ProfileResult, ToolchainStatus
from pipeline.runtimes.tensorrt_rtx.release import DRIVER, ReleaseEnvironment, cuda_flavour, pin_of
from pipeline.runtimes.tensorrt_rtx.reports import layer_times, parser_failure_of, tidy
from pipeline.runtimes.tensorrt_rtx.spec import ARCHS, RUNS_ON, TensorRtRtxSpec
from pipeline.trtexec.onnx_parser import ParserFailure

# Runs of the separate per-layer profiling pass.
LAYER_PROFILE_RUNS = 10


class TensorRtRtxEvidence(BaseModel):
    """What the TensorRT-RTX driver leaves beside the core facts: the compiler's release, targets,
    build time and log (errors, warnings, parser errors by node); at the profile, the device, the
    CUDA graph, the tensors and the per-layer profile as the driver reported them."""

    model_config = ConfigDict(extra="forbid")
    compiler: dict[str, Any] | None = None


class TensorRtRtxRuntime(EngineRuntime):
    kind = "tensorrt-rtx"
    product = "TensorRT-RTX"
    Spec = TensorRtRtxSpec
    Evidence = TensorRtRtxEvidence
    engine_suffix = ".engine"
    placement = "ahead-of-time"
    # Its driver (driver.py) times one execution context on one CUDA stream; N contexts, each on
    # its own stream in one process, as trtexec's --infStreams runs them, are not written yet.
    serves_no_streams = "does not serve concurrent streams yet: its driver runs one execution context on one CUDA stream"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.environment = ReleaseEnvironment(self.spec.release, cuda_flavour(self.spec.cuda), cache_dir())

    @property
    def version(self) -> str:
        return self.spec.release

    @classmethod
    def machine_check(cls) -> tuple[str, bool, str]:
        root = cache_dir() / "tensorrt-rtx"
        pulled = sorted(path.name for path in root.glob("*-cu1*") if (path / "pipeline-env.json").is_file()) if root.is_dir() else []
        if not pulled:
            return (
                "TensorRT-RTX releases",
                False,
                f"none pulled in {root} (`pipeline toolchains pull NAME`, NAME a tensorrt-rtx toolchain of the catalog)",
            )
        return "TensorRT-RTX releases", True, f"pulled in {root}: {', '.join(pulled)}"

    def targets(self) -> tuple[str, ...]:
        """The architectures a build compiles for; () means the compiler's own default."""
        if self.spec.archs:
            return tuple(self.spec.archs)
        local = self._local_arch()
        return (local,) if local else ()

    def _local_arch(self) -> str | None:
        gpus = nvidia_gpus()
        capability = gpus[0].compute_capability if gpus else None
        return next((arch for arch, cc in ARCHS.items() if cc == capability), None)

    def _describe_targets(self) -> str:
        targets = self.targets()
        return "+".join(targets) if targets else "the compiler's default targets (a portable engine)"

    def supports_gpu(self, compute_capability: str | None) -> bool:
        allowed = {ARCHS[t] for t in self.targets()} if self.targets() else set(RUNS_ON)
        return compute_capability in allowed

    def identity(self) -> dict[str, Any]:
        return {"runtime": "tensorrt-rtx", "release": self.spec.release, "cuda": self.environment.cuda, "targets": list(self.targets())}

    def describe(self) -> str:
        return f"TensorRT-RTX {self.spec.release} ({self.environment.cuda}), builds for {self._describe_targets()}"

    def status(self) -> ToolchainStatus:
        state, why = self.environment.state()
        if state != "ready":
            return ToolchainStatus(present=False, usable=False, detail=f"{why} (`pipeline toolchains pull {self.name}`)")
        runs = self._cannot_run_here(self.targets())
        detail = f"{why}; runs its engines here: " + ("yes" if runs is None else f"no ({runs})")
        return ToolchainStatus(present=True, usable=True, detail=detail, pin=pin_of(self.environment.facts()))

    def pin(self) -> dict[str, Any] | None:
        state, why = self.environment.state()
        if state != "ready":
            raise EnvironmentMissing(f"{why}.", hint=f"`pipeline toolchains pull {self.name}` first")
        facts = self.environment.facts()
        return {
            "pin": pin_of(facts),
            "release": facts["release"],
            "cuda": facts["cuda"],
            "packages": facts["packages"],
            "wheels": facts.get("wheels", {}),
        }

    def pull(self) -> None:
        state, why = self.environment.state()
        if state == "ready":
            self.reporter.info(f"ready    {self.name}: {why} (already pulled)")
            return
        if state == "broken":
            self.reporter.warn(f"{why}; creating it again")
        self.reporter.info(
            f"pull     {self.name}: pip install {' '.join(self.environment.packages)} (about 100 MB) into {self.environment.path}"
        )
        with self.reporter.working("pull", self.name):
            facts = self.environment.create(self.reporter, self.spec.timeout_s)
        self.reporter.info(
            f"ready    {self.name}: TensorRT-RTX {facts['release']} ({facts['cuda']}), targets {', '.join(facts['targets'])}"
        )

    def check_usable(self) -> None:
        from pipeline.runtimes.toolchains import read_lock

        state, why = self.environment.state()
        if state != "ready":
            raise EnvironmentMissing(
                f"{why}.",
                hint=f"run `pipeline toolchains pull {self.name}` (it installs the release's wheels into {self.environment.path})",
            )
        locked = (read_lock(self.workspace_root).get(self.name) or {}).get("pin")
        here = pin_of(self.environment.facts())
        if locked and locked != here:
            self.reporter.warn(
                f"toolchain {self.name}: the environment holds {here}, but toolchains.lock.json pins {locked}; "
                "results may differ from the locked toolchain (`pipeline toolchains lock` records this one)"
            )

    # --- build -----------------------------------------------------------------------------------

    def _build_argv(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, result_path: Path, shape_ranges=None) -> list[str]:
        argv = [
            str(self.environment.python),
            "-I",
            str(DRIVER),
            "build",
            str(result_path),
            "--onnx",
            str(onnx_path),
            "--engine",
            str(engine_path),
        ]
        for arch in self.targets():
            argv += ["--arch", arch.upper()]
        if variant.sparsity == "2:4":
            argv.append("--sparse")
        if self.spec.builder_optimization_level is not None:
            argv += ["--optimization-level", str(self.spec.builder_optimization_level)]
        for name, dims in (shape_ranges or {}).items():  # the optimization profile, per dynamic input
            argv += ["--shape-range", f"{name}={'/'.join('x'.join(map(str, d)) for d in dims)}"]
        return argv

    def _settings(self, variant: VariantSpec) -> dict[str, Any]:
        return {
            "release": self.spec.release,
            "cuda": self.environment.cuda,
            "targets": list(self.targets()),
            "strongly_typed": True,
            "sparse_weights": variant.sparsity == "2:4",
            "builder_optimization_level": self.spec.builder_optimization_level,
            "profiling_verbosity": "detailed",
            "timing_cache": None,  # a no-op since TensorRT-RTX 1.2 (see the driver)
        }

    def build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source: ModelSource) -> BuildResult:
        from pipeline.trtexec.layers import layer_info_from_dump

        log_path = self.sidecar(engine_path, ".build.log")
        result_path = self.sidecar(engine_path, ".build-result.json.partial")
        argv = self._build_argv(onnx_path, engine_path, variant, result_path, source.input_ranges())
        try:
            finished, result = self._run_driver(argv, result_path, log_path, "build")
        except ToolCrashed as exc:
            settings, compiler = self._settings(variant), {"release": self.spec.release, "crashed": {"signal": exc.signal}}
            exc.result = BuildResult(
                engine_path=None, settings=settings, command=argv, sidecars={"build_log": log_path}, evidence={"compiler": compiler}
            )
            raise
        if finished.exit_code == 2 and result.get("unknown_targets"):
            raise UsageError(
                f"TensorRT-RTX {self.spec.release} cannot target {', '.join(t.lower() for t in result['unknown_targets'])}.",
                hint=f"this release targets {', '.join(t.lower() for t in result['known_targets'])}",
            )
        compiler = {
            "release": result.get("release"),
            "targets": [t.lower() for t in result.get("targets", [])],  # []: the compiler's default
            "build_s": result.get("build_s"),
            "parsed": result.get("parsed"),
            "parser_errors": result.get("parser_errors", []),
            "errors": result.get("errors", []),
            "warnings": result.get("warnings", []),
        }
        settings = self._settings(variant)
        layers_path = self.sidecar(engine_path, ".layers.json")
        if not result.get("built"):
            layers_path.unlink(missing_ok=True)  # an earlier build's, which no longer describes anything
            failure = parser_failure_of(result)
            evidence = {"compiler": compiler, "parser_failure": failure.model_dump() if failure else None}
            raise RefusedByTool(
                self._refusal(onnx_path, result, failure),
                hint=f"full log: {log_path}",
                result=BuildResult(engine_path=None, settings=settings, command=argv, sidecars={"build_log": log_path}, evidence=evidence),
            )
        if not engine_path.exists() or engine_path.stat().st_size == 0:
            raise PipelineError(f"TensorRT-RTX reported a build but wrote no engine to {engine_path}.", hint=f"full log: {log_path}")
        sidecars = {"build_log": log_path}
        audit = None
        layers = layer_info_from_dump(finished.output)
        if layers is None:
            layers_path.unlink(missing_ok=True)
        else:
            atomic_write_text(layers_path, layers.model_dump_json(indent=1) + "\n")
            sidecars["layer_info"] = layers_path
            audit = layers.audit(variant.precision)
            compiler["layers"] = len(layers.layers)
            if audit.warning:
                self.reporter.warn(f"{self.sidecar(engine_path, self.engine_suffix).name}: {audit.warning}")
        compiler["engine_bytes"] = result.get("engine_bytes")
        return BuildResult(
            engine_path=engine_path,
            settings=settings,
            command=argv,
            notes=[audit.warning] if audit and audit.warning else [],
            sidecars=sidecars,
            evidence={"compiler": compiler, "precision_audit": audit.model_dump() if audit else None},
        )

    def _refusal(self, onnx_path: Path, result: dict, failure: ParserFailure | None = None) -> str:
        """The compiler's reason, node first, without its source-file locations."""
        release = f"TensorRT-RTX {result.get('release') or self.spec.release}"
        with contextlib.suppress(ValueError):
            onnx_path = onnx_path.relative_to(self.workspace_root)
        if not result.get("parsed"):
            return f"{release} could not parse {onnx_path} at {failure.words() if failure else 'a node it does not name'}"
        reason = next((tidy(e) for e in result.get("errors", []) if "Error Code" in e or "Exception" in e), None)
        targets = "+".join(t.lower() for t in result.get("targets", [])) or "its default targets"
        return f"{release} refused to build {onnx_path} for {targets}: {reason or 'no reason given (see the log)'}"

    def _run_driver(self, argv: list[str], result_path: Path, log_path: Path, what: str):
        """Run the driver in the release's environment; its exit and the facts it wrote."""
        from pipeline.runtimes import process

        try:
            finished = process.run_logged(
                argv,
                log_path=log_path,
                timeout_s=self.spec.timeout_s,
                reporter=self.reporter,
                what=f"TensorRT-RTX {self.spec.release} {what}",
            )
            return finished, self._read_result(result_path, finished, log_path, what)
        finally:
            result_path.unlink(missing_ok=True)

    def _read_result(self, path: Path, finished, log_path: Path, what: str) -> dict:
        if finished.killed:
            raise ToolStopped(
                f"TensorRT-RTX {what} was killed (out of memory, or stopped).",
                hint=f"log so far: {log_path}",
                why="was killed (out of memory, or stopped)",
            )
        if finished.signal and not path.is_file():
            # Ended by a signal inside the compiler, before the driver could write what it saw.
            raise ToolCrashed(
                f"TensorRT-RTX {self.spec.release} {what} crashed ({finished.signal}, exit status {finished.exit_code}) "
                "without an error of its own",
                hint=f"full log: {log_path}",
                signal=finished.signal,
            )
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            last = next((line for line in reversed(finished.output.splitlines()) if line.strip()), "no output")
            raise PipelineError(
                f"TensorRT-RTX {self.spec.release} {what} ended with exit status {finished.exit_code} without a result: {last}",
                hint=f"full log: {log_path}; a broken environment is repaired by `pipeline toolchains pull {self.name}`",
            ) from None

    def describe_build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source: ModelSource) -> list[str]:
        state, _ = self.environment.state()
        ranges = source.input_ranges()
        argv = self._build_argv(onnx_path, engine_path, variant, self.sidecar(engine_path, ".build-result.json"), ranges)
        sparse = ", 2:4 sparse weights" if variant.sparsity == "2:4" else ""
        if ranges:
            sparse += ", optimization profile " + "; ".join(
                f"{name} min {'×'.join(map(str, lo))} opt {'×'.join(map(str, opt))} max {'×'.join(map(str, hi))}"
                for name, (lo, opt, hi) in ranges.items()
            )
        return [
            f"build: TensorRT-RTX {self.spec.release} ({self.environment.cuda}, {'pulled' if state == 'ready' else 'not pulled yet'}): "
            f"strongly typed, for {self._describe_targets()}{sparse} → {engine_path}",
            f"build: {' '.join(argv)}",
        ]

    # --- profile ---------------------------------------------------------------------------------

    def _cannot_run_here(self, targets) -> str | None:
        gpus = nvidia_gpus()
        supported = ", ".join(RUNS_ON)
        if not gpus:
            return f"no NVIDIA GPU here; TensorRT-RTX engines run on compute capability {supported}"
        gpu = gpus[0]
        if gpu.compute_capability not in RUNS_ON:
            return f"{gpu.name} (compute capability {gpu.compute_capability}) cannot run TensorRT-RTX engines; they run on compute capability {supported}"
        if targets and gpu.compute_capability not in {ARCHS[t] for t in targets}:
            return f"the engine was built for {'+'.join(targets)}, and this GPU, {gpu.name}, is compute capability {gpu.compute_capability}"
        return None

    def cannot_profile_reason(self, build_settings: dict[str, Any]) -> str | None:
        return self._cannot_run_here(tuple(build_settings.get("targets") or ()))

    def runtime_cache_path(self, engine_dir: Path) -> Path:
        # Kernels are compiled for the GPU at hand: one cache per toolchain and GPU model.
        gpus = nvidia_gpus()
        slug = re.sub(r"[^a-z0-9]+", "-", gpus[0].name.lower()).strip("-") if gpus else "any-gpu"
        return engine_dir / f"runtime-cache-{slug}.bin"

    def _profile_argv(
        self, engine_path: Path, settings: ProfileSettings, result_path: Path, workload=None, layer_profile_runs: int = LAYER_PROFILE_RUNS
    ) -> list[str]:
        at = []
        if workload is not None:  # a shape point of an engine built for a range: its shapes, and its values where known
            for name, dims in workload.shapes.items():
                at += ["--shape", f"{name}={'x'.join(map(str, dims))}"]
            for tensor in getattr(workload, "inputs", ()):
                at += ["--load", f"{tensor.name}={tensor.path}"]
        return [
            str(self.environment.python), "-I", str(DRIVER), "profile", str(result_path),
            "--engine", str(engine_path),
            "--warmup-ms", f"{settings.warmup_ms:g}",
            "--iterations", str(settings.iterations),
            "--duration-s", f"{settings.duration_s:g}",
            "--layer-profile-runs", str(layer_profile_runs),
            "--runtime-cache", str(self.runtime_cache_path(engine_path.parent)),
        ] + at  # fmt: skip

    def profile(self, engine_path: Path, settings: ProfileSettings, workload: ReferenceBatch | None = None) -> ProfileResult:
        return self._profile(engine_path, settings, workload, LAYER_PROFILE_RUNS)

    def short_run(
        self, engine_path: Path, settings: ProfileSettings, workload: ReferenceBatch | None = None, layers: bool = False
    ) -> ProfileResult:
        return self._profile(engine_path, settings, workload, LAYER_PROFILE_RUNS if layers else 0)

    def _profile(
        self, engine_path: Path, settings: ProfileSettings, workload: ReferenceBatch | None, layer_profile_runs: int
    ) -> ProfileResult:
        point = f"@{workload.shape}" if workload is not None and workload.shape else ""
        log_path = self.sidecar(engine_path, f"{point}.profile.log")
        result_path = self.sidecar(engine_path, f"{point}.profile-result.json.partial")
        argv = self._profile_argv(engine_path, settings, result_path, workload, layer_profile_runs)
        _, result = self._run_driver(argv, result_path, log_path, "profile")
        device = result.get("device") or {}
        if not result.get("ran"):
            error = tidy(result.get("error", "the engine did not run"))
            if result.get("out_of_memory"):  # this point's result, like PyTorch's: the other points go on
                raise OutOfMemory(
                    f"{engine_path.name}{' at ' + workload.shape if point else ''}: {error}.",
                    hint="a smaller batch_size or shape point for this model in pipeline.toml, or a GPU with more memory",
                    facts={"memory": "GPU", "during": "allocating the engine's inputs and outputs", "gpu": device.get("name")},
                )
            if result.get("outside_profile"):
                raise PipelineError(
                    f"{engine_path.name}: {error}.",
                    hint="the engine's optimization profile does not cover this shape point; rebuild it (`--force`)",
                )
            raise EnvironmentMissing(
                f"TensorRT-RTX {self.spec.release} cannot run {engine_path.name} on {device.get('name', 'this machine')}: {error}",
                hint=f"full log: {log_path}",
            )
        sidecars = {"profile_log": log_path}
        layer_profile = result.get("layer_profile")
        if layer_profile:
            profile_path = self.sidecar(engine_path, f"{point}.profile.json")
            atomic_write_text(profile_path, json.dumps(layer_profile, indent=1) + "\n")
            sidecars["layer_profile"] = profile_path
        warnings = [] if result.get("cuda_graph") else [f"timed without a CUDA graph: {result.get('cuda_graph_error')}"]
        return ProfileResult(
            per_iteration_ms=result["per_iteration_ms"],
            total_walltime_s=result["walltime_s"],
            device=f"TensorRT-RTX {self.spec.release} on {device.get('name')} (CC {device.get('compute_capability')})",
            command=argv,
            sidecars=sidecars,
            metric="GPU compute time (CUDA events" + (", graph replay)" if result.get("cuda_graph") else ")"),
            warnings=warnings + result.get("warnings", []),
            evidence={
                "gpu": device.get("name"),
                # A take without the layer profile leaves the one an earlier take made (ToolTakes).
                **({"layer_times": layer_times(layer_profile)} if layer_profile_runs else {}),
                "compiler": {
                    "release": result.get("release"),
                    "device": device,
                    "cuda_graph": result.get("cuda_graph"),
                    "tensors": result.get("tensors"),
                    "runtime_cache_loaded": result.get("runtime_cache_loaded", False),
                    # A take without the layer profile leaves the one an earlier take made (ToolTakes).
                    **({"layer_profile": layer_profile} if layer_profile_runs else {}),
                },
            },
        )

    def describe_profile(self, engine_path: Path, settings: ProfileSettings, workload=None) -> list[str]:
        where = self._cannot_run_here(self.targets())
        lines = [
            f"profile: TensorRT-RTX {self.spec.release}: CUDA-graph replay timed with CUDA events, warm-up {settings.warmup_ms:g} ms, "
            f"then ≥{settings.iterations} runs and ≥{settings.duration_s:g} s; per-layer times in a separate run"
        ]
        if where:
            lines.append(f"profile: would be skipped here: {where}")
        else:
            lines.append(
                f"profile: {' '.join(self._profile_argv(engine_path, settings, self.sidecar(engine_path, '.profile-result.json'), workload))}"
            )
        return lines
