"""TensorRT through trtexec: what its two toolchain kinds share — trtexec in a pinned container image
(pipeline/runtimes/tensorrt/in_container.py) and trtexec installed on this machine
(pipeline/runtimes/tensorrt/local.py) — everything but how a command is executed and how host
paths appear to it. Every run's
output is saved beside the engine (``<engine>.build.log``, ``<engine>.profile.log``), parsed once
(:mod:`pipeline.trtexec`), checked (PASSED, and the TensorRT version the toolchain claims), and
recorded in the manifest with the exact argv and the image digest.

Files trtexec writes go to temporary names first and are moved into place only after the run
passed every check, so a failed or killed run never leaves an engine that looks valid.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.catalog import ProfileSettings, ToolchainSpec, VariantSpec
from pipeline.machine.environment import nvidia_gpus
from pipeline.measuring.accuracy import ReferenceBatch
from pipeline.measuring.serving import ServedRun, StartAt
from pipeline.models import ModelSource
from pipeline.running.errors import EnvironmentMissing, OutOfMemory, PipelineError, RefusedByTool, ToolCrashed, ToolStopped
from pipeline.runtimes.base import BuildResult, EngineRuntime, ProfileResult, ReferenceRun
from pipeline.runtimes.process import signal_name
from pipeline.runtimes.tensorrt.streams import serve_with_inf_streams
from pipeline.trtexec.command import BuildCommand, ProfileCommand, ReferenceCommand
from pipeline.trtexec.exports import read_profile, read_times
from pipeline.trtexec.layers import read_layer_info
from pipeline.trtexec.log import TrtexecLog, parse_log
from pipeline.trtexec.onnx_parser import parser_failure
from pipeline.trtexec.outputs import parse_accuracy_lines, read_trtexec_outputs
from pipeline.trtexec.preflight import unsupported_reasons


class TrtexecSpec(ToolchainSpec):
    """Settings shared by the trtexec toolchains."""

    # The release they provide, checked against trtexec's banner on every run.
    trt: str = Field(pattern=r"^\d+\.\d+(\.\d+)*$")
    # trtexec inside the image, or on PATH for a local install.
    trtexec: str = "trtexec"
    # "all" asks for every GPU; "none" runs without (CPU-only stand-in images in tests).
    gpus: Literal["all", "none"] = "all"
    # A build or profile run longer than this is killed.
    timeout_s: float = Field(default=3600.0, gt=0)
    builder_optimization_level: int | None = Field(default=None, ge=0, le=5)
    # Profile run options (all on by default: they remove host-side noise from GPU timing).
    use_cuda_graph: bool = True
    no_data_transfers: bool = True
    spin_wait: bool = True

    def tensorrt_release(self) -> str | None:
        return self.trt


@dataclass
class Execution:
    exit_code: int
    log_text: str
    image: str | None = None
    image_digest: str | None = None


class TrtexecEvidence(BaseModel):
    """What a trtexec run leaves beside the core facts: the image it ran in (trtexec-container)
    and what trtexec printed and exported, parsed (pipeline/trtexec: the log, its exported times,
    the per-layer profile)."""

    model_config = ConfigDict(extra="forbid")
    image: str | None = None
    image_digest: str | None = None
    trtexec: dict[str, Any] | None = None


def context_memory_mib(text: str | None) -> float | None:
    """trtexec's "Created execution context with device memory size: 12.5 MiB", in MiB."""
    if not text:
        return None
    number, _, unit = text.partition(" ")
    scale = {"MiB": 1.0, "KiB": 1 / 1024, "GiB": 1024.0, "B": 1 / 2**20}.get(unit.strip())
    try:
        return float(number) * scale if scale is not None else None
    except ValueError:
        return None


class TrtexecRuntime(EngineRuntime):
    product = "TensorRT"
    engine_suffix = ".engine"
    Evidence = TrtexecEvidence
    # A take of serving is a whole trtexec run, which loads the engine (tensorrt/streams.py), and
    # trtexec's own C++ loop issues the inferences, not this interpreter: one take a count.
    serves_in_rounds = False

    @property
    def version(self) -> str:
        return self.spec.trt

    # --- what each way of running trtexec provides ------------------------------------------

    def container_path(self, host: Path) -> str:
        return str(host)

    def execute(self, argv: list[str], log_path: Path, what: str) -> Execution:
        raise NotImplementedError

    def provenance(self) -> dict[str, Any]:
        return {}

    # --- shared -------------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        # Engines are specific to the TensorRT build and to the GPU they were tuned on.
        return {
            "runtime": "tensorrt",
            "trt": self.spec.trt,
            **self.provenance(),
            "gpus": [gpu.name for gpu in nvidia_gpus()],
        }

    def check_usable(self) -> None:
        if self.spec.gpus == "all" and not nvidia_gpus() and not self.force:
            raise EnvironmentMissing(
                f"toolchain {self.name} (TensorRT {self.spec.trt}) needs an NVIDIA GPU, and none is visible here (nvidia-smi).",
                hint="run on a GPU machine (`pipeline doctor` shows what this one has); --force tries anyway; "
                "--dry-run prints the commands",
            )
        self.provenance()

    def unsupported_reason(self, variant: VariantSpec) -> str | None:
        gpus = nvidia_gpus()
        if self.force or not gpus:
            return None
        reasons = unsupported_reasons(variant.precision, variant.sparsity == "2:4", self.spec.trt, gpus[0].compute_capability or "0.0")
        if reasons:
            return "; ".join(reasons) + " (--force tries anyway)"
        return None

    def _partial(self, path: Path) -> Path:
        return path.parent / f".{path.name}.partial"

    @staticmethod
    def _parse(execution: Execution) -> TrtexecLog:
        # A run that died before trtexec printed anything still has an exit status worth reporting.
        try:
            return parse_log(execution.log_text)
        except PipelineError:
            return TrtexecLog()

    def _check(self, execution: Execution, log: TrtexecLog, what: str, argv: list[str], log_path: Path) -> None:
        where = f" in image {execution.image}" if execution.image else ""
        if execution.exit_code != 0 or log.status != "PASSED":
            first = next((e for e in log.errors if e.code is not None), log.errors[0] if log.errors else None)
            detail = f": {first.message}" if first else ""
            killed = " (killed: out of memory or stopped)" if execution.exit_code == 137 else ""
            message = f"trtexec {what} failed with exit status {execution.exit_code}{killed}{where}{detail}"
            hint = f"full log: {log_path}; command: {' '.join(argv)}"
            ran_out = None if killed else out_of_memory_words(execution.log_text)
            if ran_out is not None:
                # Did not fit at this engine's shapes: a result like PyTorch's, recorded for it.
                words, requested = ran_out
                result = None
                if what == "build":
                    evidence = {"image": execution.image, "image_digest": execution.image_digest}
                    result = BuildResult(engine_path=None, command=argv, sidecars={"build_log": log_path}, evidence=evidence)
                raise OutOfMemory(
                    f"out of GPU memory in trtexec's {what}{where}: {words}",
                    hint=hint,
                    result=result,
                    facts={"memory": "GPU", "during": f"trtexec {what}", "requested_bytes": requested},
                )
            crashed = signal_name(execution.exit_code)
            if killed:
                raise ToolStopped(message, hint=hint, why="was killed (out of memory, or stopped)")
            if what == "build" and crashed and not log.errors:
                # Ended by a signal before any error of its own: recorded as failed, with the signal.
                evidence = {"image": execution.image, "image_digest": execution.image_digest}
                evidence["trtexec"] = {"crashed": {"signal": crashed, "exit_status": execution.exit_code}}
                raise ToolCrashed(
                    f"trtexec {what} crashed ({crashed}, exit status {execution.exit_code}){where} without an error of its own",
                    hint,
                    result=BuildResult(engine_path=None, command=argv, sidecars={"build_log": log_path}, evidence=evidence),
                    signal=crashed,
                )
            if what == "build" and log.status == "FAILED" and not killed:
                # TensorRT itself ran and said no (a parser or builder error): recorded in the manifest,
                # the node its ONNX parser refused named first where it refused one.
                failure = parser_failure(execution.log_text)
                if failure is not None:
                    onnx = next((a.partition("=")[2] for a in argv if a.startswith("--onnx=")), "the ONNX")
                    message = (
                        f"trtexec {what} failed with exit status {execution.exit_code}{where}: could not parse {onnx} at {failure.words()}"
                    )
                evidence = {
                    "image": execution.image,
                    "image_digest": execution.image_digest,
                    "trtexec": json.loads(log.model_dump_json(exclude={"trace"})),
                    "parser_failure": failure.model_dump() if failure else None,
                }
                raise RefusedByTool(
                    message, hint, result=BuildResult(engine_path=None, command=argv, sidecars={"build_log": log_path}, evidence=evidence)
                )
            raise PipelineError(message, hint=hint)
        claimed = self.spec.trt
        if log.trt_version and not (log.trt_version == claimed or log.trt_version.startswith(claimed + ".")):
            raise PipelineError(
                f"toolchain {self.name} claims TensorRT {claimed}, but trtexec{where} reports {log.trt_version}.",
                hint=f'fix `trt` (or the image) of [toolchains."{self.name}"] in pipeline.toml',
            )

    def build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source: ModelSource) -> BuildResult:
        log_path = self.sidecar(engine_path, ".build.log")
        layers_path = self.sidecar(engine_path, ".layers.json")
        layers_partial = self._partial(layers_path)
        argv = self._build_argv(onnx_path, engine_path, variant, layers_partial, source.input_ranges(), self.reporter.verbose)
        try:
            execution = self.execute(argv, log_path, "build")
            log = self._parse(execution)
            self._check(execution, log, "build", argv, log_path)
            if not engine_path.exists() or engine_path.stat().st_size == 0:
                raise PipelineError(f"trtexec reported PASSED but wrote no engine to {engine_path}.", hint=f"full log: {log_path}")
            audit = None
            sidecars = {"build_log": log_path}
            if layers_partial.exists():
                os.replace(layers_partial, layers_path)
                sidecars["layer_info"] = layers_path
                info = read_layer_info(layers_path)
                if info.unknown_keys:
                    self.reporter.warn(f"{layers_path.name}: keys this version does not read: {', '.join(info.unknown_keys)}")
                audit = info.audit(variant.precision)
                if audit.warning:
                    self.reporter.warn(f"{engine_path.name}: {audit.warning}")
        finally:
            with contextlib.suppress(FileNotFoundError):
                layers_partial.unlink()
        return BuildResult(
            engine_path=engine_path,
            settings={"trt_version": log.trt_version, "build_tag": log.build_tag, "device": log.device.model_dump()},
            command=argv,
            notes=[audit.warning] if audit and audit.warning else [],
            sidecars=sidecars,
            evidence={
                "image": execution.image,
                "image_digest": execution.image_digest,
                "trtexec": json.loads(log.model_dump_json(exclude={"trace"})),
                "precision_audit": audit.model_dump() if audit else None,
            },
        )

    def profile(self, engine_path: Path, settings: ProfileSettings, workload: ReferenceBatch | None = None) -> ProfileResult:
        return self._profile(engine_path, settings, workload, with_layers=True)

    def short_run(
        self, engine_path: Path, settings: ProfileSettings, workload: ReferenceBatch | None = None, layers: bool = False
    ) -> ProfileResult:
        return self._profile(engine_path, settings, workload, with_layers=layers)

    def _profile(self, engine_path: Path, settings: ProfileSettings, workload: ReferenceBatch | None, with_layers: bool) -> ProfileResult:
        # One set of files per shape point: vit_fp16.profile.log, bert_fp16@2x512.profile.log.
        point = f"@{workload.shape}" if workload is not None and workload.shape else ""
        log_path = self.sidecar(engine_path, f"{point}.profile.log")
        times_path = self.sidecar(engine_path, f"{point}.times.json")
        profile_path = self.sidecar(engine_path, f"{point}.profile.json")
        partials = {times_path: self._partial(times_path), profile_path: self._partial(profile_path)}
        shapes = workload.shapes if workload is not None else None
        layers_to = partials[profile_path] if with_layers else None
        argv = self._profile_argv(engine_path, settings, partials[times_path], layers_to, shapes, self.reporter.verbose)
        try:
            execution = self.execute(argv, log_path, "profile")
            log = self._parse(execution)
            self._check(execution, log, "profile", argv, log_path)
            if not partials[times_path].exists():
                raise PipelineError(f"trtexec wrote no --exportTimes file for {engine_path.name}.", hint=f"full log: {log_path}")
            for final, partial in partials.items():
                if partial.exists():
                    os.replace(partial, final)
        finally:
            for partial in partials.values():
                with contextlib.suppress(FileNotFoundError):
                    partial.unlink()
        times = read_times(times_path)
        layer_profile = read_profile(profile_path) if with_layers and profile_path.exists() else None
        sidecars = {"profile_log": log_path, "times": times_path}
        if layer_profile is not None:
            sidecars["layer_profile"] = profile_path
        device = log.device.name or "GPU"
        memory = context_memory_mib(log.facts.get("device_memory_size"))
        layers = layer_profile.layers if layer_profile is not None else (log.profile.layers if log.profile else [])
        return ProfileResult(
            per_iteration_ms=times.compute_ms,
            total_walltime_s=log.total_host_walltime_s or 0.0,
            device=f"TensorRT {log.trt_version} on {device} (CC {log.device.compute_capability})",
            command=argv,
            sidecars=sidecars,
            metric="GPU compute time",
            throughput_qps=log.throughput_qps,
            warnings=list(log.warnings),
            evidence={
                "gpu": log.device.name,
                "measured_with": self._profile_command(engine_path, settings, times_path, profile_path, shapes).settings_in_force(),
                **({"gpu_memory_mib": memory, "gpu_memory_counts": "TensorRT execution context"} if memory is not None else {}),
                # A take without the layer profile leaves the one an earlier take made (ToolTakes).
                **({"layer_times": [layer.model_dump() for layer in layers]} if with_layers else {}),
                "image": execution.image,
                "image_digest": execution.image_digest,
                "trtexec": {
                    **json.loads(log.model_dump_json(exclude={"trace"})),
                    "exported_times": json.loads(
                        times.model_dump_json(include={"count", "truncated", "gpu_compute", "latency", "enqueue"})
                    ),
                    # A take without the layer profile leaves the one an earlier take made (ToolTakes).
                    **({"exported_profile": json.loads(layer_profile.model_dump_json()) if layer_profile else None} if with_layers else {}),
                },
            },
        )

    def serve(self, engine, streams: int, seconds: float, start_at: StartAt = None) -> ServedRun:
        # ``engine`` is what ``prepare`` gave, ToolTakes: the engine's file and its point.
        return serve_with_inf_streams(self, engine.engine_path, engine.workload, streams, seconds)

    def run_reference(self, engine_path: Path, reference: ReferenceBatch) -> ReferenceRun:
        point = f"@{reference.shape}" if reference.shape else ""
        log_path = self.sidecar(engine_path, f"{point}.reference.log")
        outputs_path = self.sidecar(engine_path, f"{point}.outputs.json")
        partial = self._partial(outputs_path)
        argv = ReferenceCommand(
            engine=self.container_path(engine_path),
            inputs={tensor.name: self.container_path(tensor.path) for tensor in reference.inputs},
            outputs_json=self.container_path(partial),
            reference_outputs={reference.output.name: self.container_path(reference.output.path)},
            max_cosine_loss=1.0 - reference.cosine_floor,
            shapes=dict(reference.shapes) if reference.shape else {},
        ).argv(self.spec.trt, self.trtexec_path())
        try:
            execution = self.execute(argv, log_path, "accuracy check")
            tool = parse_accuracy_lines(execution.log_text)
            # trtexec's own accuracy verdict is a result to record, not a failure of the run.
            if not any(entry["failed"] for entry in tool.values()):
                self._check(execution, self._parse(execution), "accuracy check", argv, log_path)
            if not partial.exists():
                raise PipelineError(f"trtexec wrote no --exportOutput file for {engine_path.name}.", hint=f"full log: {log_path}")
            os.replace(partial, outputs_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        own_check = " and trtexec's own --loadRefOutputs check (cos)" if tool else ""
        return ReferenceRun(
            outputs=read_trtexec_outputs(outputs_path),
            checked_by=f"trtexec {self.spec.trt} --loadInputs/--exportOutput{own_check}",
            tool=tool,
            sidecars={"reference_log": log_path, "reference_outputs": outputs_path},
        )

    def timing_cache_path(self, engine_dir: Path) -> Path:
        # One cache per toolchain and GPU model: tactic timings do not transfer across GPUs.
        gpus = nvidia_gpus()
        slug = re.sub(r"[^a-z0-9]+", "-", gpus[0].name.lower()).strip("-") if gpus else "any-gpu"
        return engine_dir / f"timing-{slug}.cache"

    def trtexec_path(self) -> str:
        return self.spec.trtexec

    def _build_argv(
        self, onnx_path: Path, engine_path: Path, variant: VariantSpec, layer_info: Path, shape_ranges=None, verbose: bool = False
    ) -> list[str]:
        return BuildCommand(
            onnx=self.container_path(onnx_path),
            engine=self.container_path(engine_path),
            precision=variant.precision,
            sparse=variant.sparsity == "2:4",
            timing_cache=self.container_path(self.timing_cache_path(engine_path.parent)),
            layer_info=self.container_path(layer_info),
            optimization_level=self.spec.builder_optimization_level,
            shape_ranges=dict(shape_ranges or {}),
            verbose=verbose,
        ).argv(self.spec.trt, self.trtexec_path())

    def _profile_argv(
        self, engine_path: Path, settings: ProfileSettings, times: Path, profile: Path | None, shapes=None, verbose: bool = False
    ) -> list[str]:
        return self._profile_command(engine_path, settings, times, profile, shapes, verbose).argv(self.spec.trt, self.trtexec_path())

    def _profile_command(
        self, engine_path: Path, settings: ProfileSettings, times: Path, profile: Path | None, shapes=None, verbose: bool = False
    ) -> ProfileCommand:
        return ProfileCommand(
            engine=self.container_path(engine_path),
            warmup_ms=settings.warmup_ms,
            iterations=settings.iterations,
            duration_s=settings.duration_s,
            times_json=self.container_path(times),
            profile_json=self.container_path(profile) if profile is not None else None,
            use_cuda_graph=self.spec.use_cuda_graph,
            no_data_transfers=self.spec.no_data_transfers,
            spin_wait=self.spec.spin_wait,
            shapes=dict(shapes or {}),
            verbose=verbose,
        )

    def describe_build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source: ModelSource) -> list[str]:
        argv = self._build_argv(onnx_path, engine_path, variant, self.sidecar(engine_path, ".layers.json"), source.input_ranges())
        return [f"build: {self.where()}: {' '.join(argv)}"]

    def describe_profile(self, engine_path: Path, settings: ProfileSettings, workload=None) -> list[str]:
        point = f"@{workload.shape}" if workload is not None else ""
        shapes = workload.shapes if workload is not None else None
        times, profile = self.sidecar(engine_path, f"{point}.times.json"), self.sidecar(engine_path, f"{point}.profile.json")
        argv = self._profile_argv(engine_path, settings, times, profile, shapes)
        return [f"profile: {self.where()}: {' '.join(argv)}"]

    def where(self) -> str:
        return "local"


# TensorRT's words when an allocation fails, as its logger prints them: "Error Code 2: OutOfMemory
# (…)" from its allocators and "Error Code 1: Cuda Runtime (out of memory)" from CUDA, with the size
# in "Requested amount of GPU memory (N bytes) could not be allocated" or "Requested size was N
# bytes" (seen in public reports of TensorRT 8.4–10: NVIDIA/TensorRT#840, NVIDIA/trt-samples-for-hackathon-cn#47).
_TRT_OUT_OF_MEMORY = re.compile(r"Error Code \d+: (?:OutOfMemory\b[^\n]*|Cuda Runtime \(out of memory\))")
_TRT_REQUESTED = re.compile(r"Requested (?:amount of GPU memory \((\d+) bytes\)|size was (\d+) bytes)")


def out_of_memory_words(log_text: str) -> tuple[str, int | None] | None:
    """(TensorRT's words, the bytes it asked for where it says) when a run of trtexec failed for want
    of GPU memory, else None."""
    found = _TRT_OUT_OF_MEMORY.search(log_text)
    if found is None:
        return None
    requested = _TRT_REQUESTED.search(log_text)
    return found.group(0).strip(), int(next(g for g in requested.groups() if g)) if requested else None
