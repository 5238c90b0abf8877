"""ONNX Runtime: the embedded default runtime that needs no GPU and no Docker.

"Building" an engine means letting ONNX Runtime optimise the graph once and saving the result, so
profiling loads exactly the artefact that was fingerprinted. The graph is saved at the EXTENDED
optimisation level because ALL adds layout changes specific to this CPU that ONNX Runtime itself
warns are not portable; the profile session re-applies ALL when it loads the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pipeline.catalog import ProfileSettings, ToolchainSpec, VariantSpec
from pipeline.graph.onnxruntime_cpu import NO_CPU_KERNELS
from pipeline.machine.environment import pinned_cores
from pipeline.measuring.accuracy import ReferenceBatch
from pipeline.measuring.rounds import HOST_LATENCY
from pipeline.measuring.serving import THREADS, ServedRun, StartAt, serve_threads
from pipeline.measuring.takes import host_take
from pipeline.models import ModelSource
from pipeline.running.errors import PipelineError, RefusedByTool, require_module, tool_message
from pipeline.runtimes.base import BuildResult, InProcessRuntime, ReferenceRun, ToolchainStatus, rounds_words

# Precisions whose ONNX form (plain FP32/FP16 graphs, INT8 QuantizeLinear/DequantizeLinear) this
# runtime executes; verified on the CPU execution provider. FP8, MXFP8 and NVFP4 graphs use
# TensorRT-specific operators or types, and the CPU provider has no BF16 Conv or MatMul kernels.
SUPPORTED_PRECISIONS = ("fp32", "fp16", "int8")

_ORT_TO_NUMPY = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
    "tensor(bool)": "bool",
}


def _shapes_text(shapes: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name} {'×'.join(map(str, dims))}" for name, dims in shapes.items())


def _ort():
    return require_module("onnxruntime", purpose="The onnxruntime toolchain", extra=None)


class OnnxRuntimeSpec(ToolchainSpec):
    """The embedded runtime: nothing to configure beyond the shared fields."""

    kind: Literal["onnxruntime"]


class OnnxRuntimeRuntime(InProcessRuntime):
    kind = "onnxruntime"
    product = "ONNX Runtime"
    Spec = OnnxRuntimeSpec
    engine_suffix = ".onnx"
    placement = "anywhere"  # the CPU provider: any node

    @property
    def distribution(self) -> tuple[str, str]:
        """Which ONNX Runtime build is installed, read from metadata so fingerprints need no import."""
        from importlib import metadata

        for dist in ("onnxruntime-gpu", "onnxruntime"):
            try:
                return dist, metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return "onnxruntime", _ort().__version__

    @property
    def version(self) -> str:
        return self.distribution[1]

    def providers(self) -> list[str]:
        available = _ort().get_available_providers()
        # CUDA when the GPU build is installed, otherwise the CPU provider everyone has.
        preferred = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        return preferred or ["CPUExecutionProvider"]

    def identity(self) -> dict[str, Any]:
        # The distribution fixes the execution providers (onnxruntime-gpu adds CUDA), so this
        # identifies the runtime without importing it on a warm rerun.
        dist, version = self.distribution
        return {"runtime": dist, "version": version}

    def describe(self) -> str:
        return "ONNX Runtime, embedded (CPU; CUDA with onnxruntime-gpu)"

    def status(self) -> ToolchainStatus:
        from importlib.util import find_spec

        if find_spec("onnxruntime") is None:
            return ToolchainStatus(present=False, usable=False, detail="onnxruntime is not installed (`make setup`)")
        dist, version = self.distribution
        return ToolchainStatus(present=True, usable=True, detail=f"embedded: {dist} {version}")

    def check_usable(self) -> None:
        from importlib.util import find_spec

        if find_spec("onnxruntime") is None:  # not imported: warm reruns stay fast
            _ort()

    def unsupported_reason(self, variant: VariantSpec) -> str | None:
        if variant.precision in NO_CPU_KERNELS:
            return NO_CPU_KERNELS[variant.precision]
        if variant.precision not in SUPPORTED_PRECISIONS:
            return f"{variant.precision} needs TensorRT; the onnxruntime toolchain runs {', '.join(SUPPORTED_PRECISIONS)} engines"
        return None

    def serve(self, engine: OrtEngine, streams: int, seconds: float, start_at: StartAt = None) -> ServedRun:
        # One session, N threads calling its run at once, each with its own copy of the inputs:
        # InferenceSession::Run is thread-safe, several threads may call it concurrently (stated by
        # ONNX Runtime's maintainers, microsoft/onnxruntime#19301), and its Python binding lets go of
        # the GIL around it ("release GIL to allow multiple python threads to invoke Run() in
        # parallel", onnxruntime/python/onnxruntime_pybind_state.cc), so the threads run side by side. Each run still uses the
        # session's intra-op thread pool: N streams share the CPUs of one pool (docs/streams.md).
        feeds = [{name: value.copy() for name, value in engine.feeds.items()} for _ in range(streams)]
        requests = [lambda mine=mine: engine.session.run(None, mine) for mine in feeds]
        span_s, latencies = serve_threads(requests, seconds, start_at)
        provider = engine.session.get_providers()[0]
        how = f"{streams} thread{'s' if streams > 1 else ''} on one InferenceSession ({provider}), each with its own inputs"
        return ServedRun(streams=streams, mode=THREADS, span_s=span_s, completed=len(latencies), latencies_ms=latencies, how=how)

    def _session(self, path: Path, level, optimized_out: Path | None = None):
        ort = _ort()
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        options.log_severity_level = 3  # errors only: constant-folding notices are noise here
        cores = pinned_cores()
        if cores is not None:
            # Left to itself ONNX Runtime starts a thread per physical core of the machine and
            # pins them across all of it ("Thread management", onnxruntime.ai/docs/performance/
            # tune-performance/threading.html): out of a process pinned to some CPUs. A count
            # given turns that pinning off; its threads stay where the process may run.
            options.intra_op_num_threads = cores
        if optimized_out is not None:
            options.optimized_model_filepath = str(optimized_out)
            _weights_beside(options, path, optimized_out)
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=self.providers())
        except Exception as exc:  # ORT raises its own exception types for invalid or unsupported graphs
            raise PipelineError(
                f"ONNX Runtime could not load {path.name}: {tool_message(exc)}",
                hint="run with -v for details; `pipeline doctor` shows the installed runtime",
            ) from exc

    def build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source: ModelSource) -> BuildResult:
        ort = _ort()
        settings = {"graph_optimization_level": "ORT_ENABLE_EXTENDED", "providers": self.providers()}
        try:
            self._session(onnx_path, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, optimized_out=engine_path)
        except PipelineError as exc:
            # ONNX Runtime read the graph and said no (an op it has no kernel for): a fact about the
            # graph and this release, recorded like a compiler's refusal.
            raise RefusedByTool(exc.message, exc.hint, result=BuildResult(engine_path=None, settings=settings)) from exc.__cause__
        if not engine_path.exists() or engine_path.stat().st_size == 0:
            raise PipelineError(f"ONNX Runtime wrote no optimised model for {onnx_path.name}.")
        return BuildResult(engine_path=engine_path, settings=settings)

    def describe_build(self, onnx_path: Path, engine_path: Path, variant: VariantSpec, source: ModelSource) -> list[str]:
        return [f"build: onnxruntime {self.version} {self.providers()[0]}: optimise {onnx_path.name} (ORT_ENABLE_EXTENDED) → {engine_path}"]

    def describe_profile(self, engine_path: Path, settings: ProfileSettings, workload=None) -> list[str]:
        at = f" at {_shapes_text(workload.shapes)}" if workload is not None else ""
        return [f"profile: onnxruntime {self.version} {self.providers()[0]}: {engine_path.name}{at}, {rounds_words(settings)}"]

    def run_reference(self, engine_path: Path, reference: ReferenceBatch) -> ReferenceRun:
        ort = _ort()
        session = self._session(engine_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        outputs = session.run(None, self._feeds(session, engine_path, reference))
        names = [output.name for output in session.get_outputs()]
        return ReferenceRun(
            outputs=dict(zip(names, outputs)),
            checked_by=f"onnxruntime {self.version} {session.get_providers()[0]}, in this process",
        )

    def _feeds(self, session, engine_path: Path, batch: ReferenceBatch) -> dict[str, Any]:
        """The batch's tensors by the engine's input names, each in the type the engine takes."""
        given = {tensor.name: tensor for tensor in batch.inputs}
        wanted = [spec.name for spec in session.get_inputs()]
        if sorted(given) != sorted(wanted):
            raise PipelineError(
                f"{engine_path.name} takes input(s) {', '.join(map(repr, wanted))}; the reference batch has {', '.join(map(repr, given))}.",
                hint="the engine and the reference come from different exports; re-export and rebuild (`--force`)",
            )
        feeds = {}
        for spec in session.get_inputs():
            tensor = given[spec.name]
            values = tensor.values() if tensor.is_integer else tensor.as_float32()
            feeds[spec.name] = values.astype(_ORT_TO_NUMPY.get(spec.type, str(values.dtype)))
        return feeds

    def prepare(self, engine_path: Path, workload: ReferenceBatch | None = None) -> OrtEngine:
        import numpy as np

        ort = _ort()
        session = self._session(engine_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        if workload is not None:
            feeds = self._feeds(session, engine_path, workload)
        else:
            rng = np.random.default_rng(0)
            feeds = {}
            for spec in session.get_inputs():
                if any(not isinstance(dim, int) for dim in spec.shape):
                    raise PipelineError(
                        f"input {spec.name!r} of {engine_path.name} has a dynamic shape {spec.shape}, and no shape point was given.",
                        hint="list the model's shape points in pipeline.toml (`shapes`), or export with a static batch",
                    )
                dtype = _ORT_TO_NUMPY.get(spec.type, "float32")
                feeds[spec.name] = rng.standard_normal(spec.shape).astype(dtype)
        session.run(None, feeds)  # the first run allocates: not in any take
        return OrtEngine(session, feeds)


def _weights_beside(options, path: Path, optimized_out: Path) -> None:
    """Where ``path`` keeps its weights in external data (pipeline/graph/external.py), the
    optimized model's weights: inline up to 2 GB, else in ``<engine>.data`` beside it. Left to
    itself ONNX Runtime writes the input's external references as they were, relative to the
    input's folder, which the engine's is not ("External data path does not exist" when loaded).
    The session options are ONNX Runtime's (onnxruntime_session_options_config_keys.h:
    session.optimized_model_external_initializers_file_name, …_min_size_in_bytes)."""
    import onnx

    from pipeline.graph.external import PROTOBUF_LIMIT_BYTES, has_external_data, named_files
    from pipeline.running.files import final_path

    graph = onnx.load(str(path), load_external_data=False)
    if not has_external_data(graph):
        return
    size = sum(file.stat().st_size for file in named_files(path, graph) if file.is_file())
    smallest = 1024 if size >= PROTOBUF_LIMIT_BYTES else PROTOBUF_LIMIT_BYTES
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{final_path(optimized_out).name}.data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", str(smallest))


class OrtEngine:
    """An ONNX Runtime session and its inputs, ready for takes (pipeline/measuring/takes.py): each run
    is one ``session.run``, timed by the host's clock."""

    timing = HOST_LATENCY

    def __init__(self, session, feeds: dict[str, Any]):
        self.session, self.feeds = session, feeds
        # On the GPU with the CUDA provider (onnxruntime-gpu): its takes are then judged by the GPU's clock.
        self.on_gpu = session.get_providers()[0] != "CPUExecutionProvider"

    def take(self, runs: int, min_ms: float) -> list[float]:
        return host_take(lambda: self.session.run(None, self.feeds), runs, min_ms)

    def evidence(self) -> dict[str, Any]:
        return {"device": f"onnxruntime {self.session.get_providers()[0]}", "metric": self.timing}
