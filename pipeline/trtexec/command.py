"""trtexec command lines, per TensorRT release.

Each flag emitted here is checked by the tests against the recorded ``trtexec --help`` of TensorRT
8.6.1, 10.0.1, 10.6.0, 10.14.1 and 10.16.1. The dialect rules:

* ``--stronglyTyped`` exists from TensorRT 10.0 (not in 8.6.1's help). Strongly typed builds take
  each tensor's precision from the ONNX (an FP16 ONNX gives an FP16 engine), so they are used
  wherever available: the result does not depend on TensorRT's per-layer type choices.
* ``--fp16/--bf16/--int8/--fp8/--int4/--best`` are deprecated from 10.12 ("superseded by strong
  typing", 10.14.1 help) and removed in TensorRT 11, which builds strongly typed networks only.
  So they are emitted only for releases without ``--stronglyTyped``.
* TensorRT 11 is strongly typed only; its ``--stronglyTyped`` is a deprecated no-op that prints a
  warning, so it is left out there.
* TensorRT 11 flipped the measurement defaults: CUDA graphs on, data transfers off, spin wait on,
  a separate profile run always. ``--useCudaGraph``, ``--noDataTransfers``, ``--useSpinWait`` and
  ``--separateProfileRun`` became deprecated no-ops there (each prints a warning); the opposites
  ``--noCudaGraph``, ``--includeDataTransfers`` and ``--noSpinWait`` are new. A measurement setting
  therefore means the same on every release: 10.x gets the explicit flag when it is on, 11.x the
  opposite when it is off. (11.0/11.1 ``--help`` rebuilt from NVIDIA's trtexec source,
  ``samples/common/sampleOptions.cpp`` at the 11.0 and 11.1 OSS releases; tested against them.)
* TensorRT 11.1 can check accuracy itself: ``--loadRefOutputs`` with ``--accuracyAlgorithm`` and
  ``--accuracyThreshold``; ``--loadInputs`` and ``--exportOutput`` exist in every release tested.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.running.errors import UsageError

# Weakly typed precision flags, per the deprecation note in the 10.14.1 --help.
WEAK_TYPING_FLAGS = ("--fp16", "--bf16", "--int8", "--fp8", "--int4", "--best")


def parse_version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        raise UsageError(f"{text!r} is not a TensorRT version.", hint="use the form 10.14 or 10.14.1") from None


@dataclass(frozen=True)
class Dialect:
    """What one TensorRT release's trtexec accepts."""

    version: tuple[int, ...]

    @property
    def has_strongly_typed_flag(self) -> bool:
        return (10, 0) <= self.version[:2] < (11, 0)

    @property
    def strongly_typed_only(self) -> bool:
        return self.version[0] >= 11

    @property
    def weak_typing_deprecated(self) -> bool:
        return self.version[:2] >= (10, 12)

    @property
    def measures_with_graphs_by_default(self) -> bool:
        """11.0+: CUDA graphs, no data transfers, spin wait and a separate profile run by default."""
        return self.version[0] >= 11

    @property
    def has_inf_streams(self) -> bool:
        """8.6+: --infStreams=N, N execution contexts (8.6: engines) running inference concurrently,
        each on its own CUDA stream (the --help of 8.6.1 to 11.1; 8.5 named it --streams, and no
        8.5 --help is recorded here to check it by)."""
        return self.version[:2] >= (8, 6)

    @property
    def checks_accuracy(self) -> bool:
        """11.1+: --loadRefOutputs/--accuracyAlgorithm/--accuracyThreshold."""
        return self.version[:2] >= (11, 1)

    def measurement_flags(self, cuda_graph: bool, data_transfers: bool, spin_wait: bool) -> list[str]:
        """The flags that give these measurement settings on this release (see the module notes)."""
        if self.measures_with_graphs_by_default:
            wanted = (("--noCudaGraph", not cuda_graph), ("--includeDataTransfers", data_transfers), ("--noSpinWait", not spin_wait))
        else:
            wanted = (("--useCudaGraph", cuda_graph), ("--noDataTransfers", not data_transfers), ("--useSpinWait", spin_wait))
        return [flag for flag, needed in wanted if needed]

    def typing_flags(self, precision: str) -> list[str]:
        """Flags that make the engine run in ``precision``, given an ONNX exported for it."""
        if self.strongly_typed_only:
            return []
        if self.has_strongly_typed_flag:
            return ["--stronglyTyped"] if precision != "fp32" else []
        # Releases without strong typing: name the precisions TensorRT may choose.
        weak = {
            "fp32": [],
            "fp16": ["--fp16"],
            "int8": ["--fp16", "--int8"],  # Q/DQ layers in INT8, the rest may use FP16
            "fp8": ["--fp16", "--fp8"],
        }
        if precision not in weak:
            raise UsageError(
                f"{precision} needs a strongly typed build, which TensorRT {'.'.join(map(str, self.version))} cannot do.",
                hint="use a TensorRT 10 toolchain",
            )
        return weak[precision]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# An input's dimensions, e.g. (2, 512); () for a scalar.
Dims = tuple[int, ...]


def shapes_spec(shapes: dict[str, Dims]) -> str:
    """The value of --shapes/--minShapes/--optShapes/--maxShapes: ``name:2x512`` per input,
    comma-separated. As every release's --help says: a name holding ':' or ',' goes in single quotes
    (the pipeline passes argv without a shell, so the quotes reach trtexec as they are), and a 0-D
    shape is ``scalar``."""
    parts = []
    for name, dims in shapes.items():
        quoted = f"'{name}'" if (":" in name or "," in name) else name
        parts.append(f"{quoted}:{'x'.join(map(str, dims)) if dims else 'scalar'}")
    return ",".join(parts)


@dataclass(frozen=True)
class BuildCommand:
    onnx: str
    engine: str
    precision: str
    sparse: bool = False
    timing_cache: str | None = None
    layer_info: str | None = None
    optimization_level: int | None = None
    verbose: bool = False
    # The dynamic range of each dynamic input (min, opt, max): one optimization profile.
    shape_ranges: dict[str, tuple[Dims, Dims, Dims]] = field(default_factory=dict)

    def argv(self, trt_version: str, executable: str = "trtexec") -> list[str]:
        dialect = Dialect(parse_version(trt_version))
        argv = [executable, f"--onnx={self.onnx}", f"--saveEngine={self.engine}"]
        argv += dialect.typing_flags(self.precision)
        if self.shape_ranges:
            # trtexec needs all three for every dynamic input; each flag lists every input.
            for flag, index in (("--minShapes", 0), ("--optShapes", 1), ("--maxShapes", 2)):
                argv.append(f"{flag}={shapes_spec({name: dims[index] for name, dims in self.shape_ranges.items()})}")
        if self.sparse:
            argv.append("--sparsity=enable")
        if self.optimization_level is not None:
            argv.append(f"--builderOptimizationLevel={self.optimization_level}")
        if self.timing_cache:
            argv.append(f"--timingCacheFile={self.timing_cache}")
        if self.layer_info:
            argv += ["--profilingVerbosity=detailed", f"--exportLayerInfo={self.layer_info}"]
        # Timing happens in a separate `profile` run, so the build does not benchmark.
        argv.append("--skipInference")
        if self.verbose:
            argv.append("--verbose")
        return argv


@dataclass(frozen=True)
class ProfileCommand:
    engine: str
    warmup_ms: float
    iterations: int
    duration_s: float
    times_json: str | None = None
    profile_json: str | None = None
    use_cuda_graph: bool = True
    no_data_transfers: bool = True
    spin_wait: bool = True
    verbose: bool = False
    # The shape point to run at, per dynamic input (--shapes); empty for a static engine.
    shapes: dict[str, Dims] = field(default_factory=dict)
    # Concurrent inference streams (--infStreams, Dialect.has_inf_streams); 1: trtexec's default, not written.
    inf_streams: int = 1

    def settings_in_force(self) -> dict[str, bool]:
        """What the timing included, the same on every release (recorded in the profile manifest)."""
        return {
            "cuda_graph": self.use_cuda_graph,
            "data_transfers": not self.no_data_transfers,
            "spin_wait": self.spin_wait,
            # trtexec always enqueues inferences back to back, timing each on the GPU; recorded so a
            # runtime timed otherwise (a host that waits for every run) is flagged beside it.
            "host_sync_per_run": False,
        }

    def argv(self, trt_version: str, executable: str = "trtexec") -> list[str]:
        dialect = Dialect(parse_version(trt_version))
        argv = [
            executable,
            f"--loadEngine={self.engine}",
            f"--warmUp={_number(self.warmup_ms)}",  # milliseconds
            f"--iterations={self.iterations}",  # a minimum: runs continue until --duration too
            f"--duration={_number(self.duration_s)}",
        ]
        argv += dialect.measurement_flags(self.use_cuda_graph, not self.no_data_transfers, self.spin_wait)
        if self.shapes:
            argv.append(f"--shapes={shapes_spec(self.shapes)}")
        if self.inf_streams > 1:
            if not dialect.has_inf_streams:
                raise UsageError(
                    f"trtexec of TensorRT {trt_version} has no --infStreams (from 8.6).",
                    hint="serve streams with a TensorRT 8.6+ toolchain",
                )
            # Each stream enqueues its inferences one ahead, as one stream does (NVIDIA's trtexec
            # documentation, "Cross-Inference Multi-Streaming"): throughput is all streams' inferences
            # over the host's wall time.
            argv.append(f"--infStreams={self.inf_streams}")
        if self.times_json:
            argv.append(f"--exportTimes={self.times_json}")
        if self.profile_json:
            # The per-layer profiler perturbs timing; a separate run keeps the summary clean (always so on 11.x).
            argv += ([] if dialect.measures_with_graphs_by_default else ["--separateProfileRun"]) + [
                "--dumpProfile",
                f"--exportProfile={self.profile_json}",
            ]
        if self.verbose:
            argv.append("--verbose")
        return argv


@dataclass(frozen=True)
class ReferenceCommand:
    """One inference on given inputs, its outputs written out: the engine's accuracy check.

    Every release tested has ``--loadInputs`` and ``--exportOutput``; from 11.1 trtexec also
    compares the outputs with reference files itself (cosine loss, ``--accuracyThreshold``).
    """

    engine: str
    inputs: dict[str, str]  # tensor name → raw binary file
    outputs_json: str
    reference_outputs: dict[str, str] | None = None  # tensor name → raw binary file (11.1+)
    # Largest accepted cosine loss (1 - cosine similarity) for trtexec's own check.
    max_cosine_loss: float | None = None
    # The inputs' shapes, for an engine built with dynamic shapes (--shapes); empty for a static one.
    shapes: dict[str, Dims] = field(default_factory=dict)

    def argv(self, trt_version: str, executable: str = "trtexec") -> list[str]:
        dialect = Dialect(parse_version(trt_version))
        argv = [
            executable,
            f"--loadEngine={self.engine}",
            "--loadInputs=" + ",".join(f"{name}:{path}" for name, path in self.inputs.items()),
            *([f"--shapes={shapes_spec(self.shapes)}"] if self.shapes else []),
            # One inference is enough to read the outputs: no warm-up, no minimum duration.
            "--warmUp=0",
            "--iterations=1",
            "--duration=0",
            f"--exportOutput={self.outputs_json}",
        ]
        if dialect.checks_accuracy and self.reference_outputs and self.max_cosine_loss is not None:
            argv += [
                "--loadRefOutputs=" + ",".join(f"{name}:{path}" for name, path in self.reference_outputs.items()),
                "--accuracyAlgorithm=cos",
                f"--accuracyThreshold={self.max_cosine_loss:g}",
            ]
        return argv
