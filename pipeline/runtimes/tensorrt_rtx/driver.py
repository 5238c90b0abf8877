"""Drives one TensorRT-RTX release from inside that release's own environment.

The pipeline never imports this file: it runs it as a script with the Python of a pulled release
(``pipeline toolchains pull trt-rtx1.7``), so two releases never share a process and the
pipeline's own environment needs no TensorRT. It imports only the standard library and the
release's ``tensorrt_rtx_bindings``; CUDA is reached through the driver library (libcuda) with
ctypes, because the environment holds nothing else.

    python tensorrt_rtx/driver.py version RESULT
    python tensorrt_rtx/driver.py build RESULT --onnx M --engine E [--arch SM120 ...] [--sparse]
                                        [--optimization-level N] [--shape-range NAME=MIN/OPT/MAX ...]
    python tensorrt_rtx/driver.py profile RESULT --engine E --warmup-ms W --iterations N
                                        --duration-s D [--layer-profile-runs K] [--runtime-cache F]
                                        [--shape NAME=2x512 ...] [--load NAME=FILE ...]
    python tensorrt_rtx/driver.py cuda-check RESULT --warmup-ms W --iterations N --duration-s D

The compiler's log goes to stdout, a line per message, marked like trtexec's ("[E]", "[W]",
"[I]", "[V]"); multi-line messages (the layer dump) keep their other lines unmarked. Facts go to
RESULT as JSON, written last: a RESULT file exists only for a run that finished. A refusal by the
compiler is a finished run (exit status 0, ``built: false``); exit status 2 is a bad request.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import time

SEVERITY_MARK = {0: "E", 1: "E", 2: "W", 3: "I", 4: "V"}


def import_bindings():
    import tensorrt_rtx_bindings as trt

    return trt


def make_logger(trt):
    class Logger(trt.ILogger):
        """Prints every message and keeps errors and warnings for the result."""

        def __init__(self):
            super().__init__()
            self.errors: list[str] = []
            self.warnings: list[str] = []

        def log(self, severity, message):
            level = int(severity)
            mark = SEVERITY_MARK.get(level, "I")
            print(f"[{mark}] {message}", flush=level <= 2)
            if level <= 1:
                self.errors.append(message)
            elif level == 2:
                self.warnings.append(message)

    return Logger()


def write_result(path: str, result: dict) -> None:
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    os.replace(partial, path)


def write_atomically(path: str, data: bytes) -> None:
    partial = f"{path}.partial"
    with open(partial, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)


# --- version -----------------------------------------------------------------------------------


def version(args) -> int:
    trt = import_bindings()
    targets = [name for name in trt.ComputeCapability.__members__ if name.startswith("SM")]
    write_result(args.result, {"release": trt.__version__, "targets": targets, "python": sys.version.split()[0]})
    return 0


# --- build -------------------------------------------------------------------------------------


def build(args) -> int:
    trt = import_bindings()
    logger = make_logger(trt)
    known = {name for name in trt.ComputeCapability.__members__ if name.startswith("SM")}
    unknown = [arch for arch in args.arch if arch not in known]
    result = {"release": trt.__version__, "targets": list(args.arch), "known_targets": sorted(known)}
    if unknown:
        result["unknown_targets"] = unknown
        write_result(args.result, result)
        return 2

    started = time.perf_counter()
    builder = trt.Builder(logger)
    # Strongly typed: each tensor's precision comes from the ONNX (the only mode TensorRT-RTX has).
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    parsed = bool(parser.parse_from_file(args.onnx))
    result["parsed"] = parsed
    result["parser_errors"] = [
        {
            "node": error.node_name(),
            "operator": error.node_operator(),
            "code": str(error.code()).rsplit(".", 1)[-1],
            "message": error.desc(),
        }
        for error in (parser.get_error(i) for i in range(parser.num_errors))
    ]
    result["built"] = False
    if parsed:
        config = builder.create_builder_config()
        config.num_compute_capabilities = len(args.arch)
        for index, arch in enumerate(args.arch):
            config.set_compute_capability(getattr(trt.ComputeCapability, arch), index)
        # The layer dump in the log (precisions per layer) needs detailed verbosity.
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
        if args.sparse:
            config.set_flag(trt.BuilderFlag.SPARSE_WEIGHTS)
        if args.optimization_level is not None:
            config.builder_optimization_level = args.optimization_level
        if args.shape_range:
            # One optimization profile: the (min, opt, max) shape of every dynamic input.
            optimization = builder.create_optimization_profile()
            for name, (low, opt, high) in parse_shape_options(args.shape_range, 3).items():
                optimization.set_shape(name, low, opt, high)
            config.add_optimization_profile(optimization)
            result["shape_ranges"] = args.shape_range
        # No timing cache: its operations are no-ops since TensorRT-RTX 1.2 (the bindings' own
        # deprecation notice). What a GPU compiles is kept in the runtime cache (profile).
        try:
            serialized = builder.build_serialized_network(network, config)
        except Exception as exc:  # the bindings raise for some compiler failures instead of logging them
            logger.errors.append(f"{type(exc).__name__}: {exc}")
            serialized = None
        if serialized is not None:
            write_atomically(args.engine, bytes(serialized))
            result["built"] = True
            result["engine_bytes"] = serialized.nbytes
    result["build_s"] = round(time.perf_counter() - started, 4)
    result["errors"] = logger.errors
    result["warnings"] = logger.warnings
    write_result(args.result, result)
    return 0


# --- CUDA through the driver library (tensorrt_rtx/cuda.py) --------------------------------------


def _sibling(name: str):
    """A module beside this file, loaded by its path: the driver runs as a script in isolated mode
    (-I), so its folder is not on sys.path — and must not be, since it holds modules named like
    packages (cuda.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_cuda = _sibling("cuda")
Cuda, CudaError, timed_runs, CUDA_ERROR_OUT_OF_MEMORY = _cuda.Cuda, _cuda.CudaError, _cuda.timed_runs, _cuda.CUDA_ERROR_OUT_OF_MEMORY


def parse_shape_options(options: list[str], count: int) -> dict[str, list[tuple[int, ...]]]:
    """``NAME=2x512`` (count 1) or ``NAME=1x16/2x512/4x4096`` (count 3) options, by input name."""
    shapes = {}
    for option in options:
        name, _, text = option.rpartition("=")
        parts = text.split("/")
        if not name or len(parts) != count:
            raise SystemExit(f"bad shape option {option!r}")
        shapes[name] = [tuple(int(size) for size in part.split("x")) for part in parts]
    return shapes


def random_bytes_for(dtype_name: str, count: int, rng: random.Random) -> bytes:
    """``count`` values of a TensorRT data type, standard-normal for floats (as trtexec fills inputs)."""
    # A random block repeated: packing tens of millions of values one by one takes seconds.
    block = min(count, 1 << 16)
    if dtype_name in ("FLOAT", "HALF"):
        code = "f" if dtype_name == "FLOAT" else "e"
        values = struct.pack(f"<{block}{code}", *(rng.gauss(0.0, 1.0) for _ in range(block)))
    elif dtype_name in ("INT8", "UINT8", "BOOL"):
        values = bytes(rng.randrange(0, 2) for _ in range(block))
    else:  # integer indices and anything else: zeros are always valid
        values = bytes(block * _ITEMSIZE.get(dtype_name, 4))
    repeats, rest = divmod(count, block)
    return values * repeats + values[: rest * (len(values) // block)]


_ITEMSIZE = {"FLOAT": 4, "HALF": 2, "BF16": 2, "INT8": 1, "UINT8": 1, "BOOL": 1, "INT32": 4, "INT64": 8, "FP8": 1}


# --- profile -------------------------------------------------------------------------------------


def profile(args) -> int:
    trt = import_bindings()
    logger = make_logger(trt)
    result: dict = {"release": trt.__version__, "ran": False}
    try:
        cuda = Cuda()
        result["device"] = {"name": cuda.name(), "compute_capability": cuda.compute_capability()}
    except CudaError as exc:
        result["error"] = str(exc)
        write_result(args.result, result)
        return 0

    with open(args.engine, "rb") as handle:
        engine = trt.Runtime(logger).deserialize_cuda_engine(handle.read())
    if engine is None:
        result["error"] = next(
            (e for e in logger.errors if "cannot run" in e), logger.errors[0] if logger.errors else "the engine did not load"
        )
        result["errors"] = logger.errors
        write_result(args.result, result)
        return 0
    context, cache = execution_context(engine, args.runtime_cache, result)
    for name, (shape,) in parse_shape_options(args.shape, 1).items():
        # An engine built for a range of shapes runs at the one given here.
        if not context.set_input_shape(name, shape):
            result["error"] = f"input {name!r} cannot take shape {'x'.join(map(str, shape))}: " + "; ".join(logger.errors[-2:])
            result["outside_profile"] = True
            write_result(args.result, result)
            return 0
    given = dict(option.rpartition("=")[::2] for option in args.load)

    rng = random.Random(0)
    tensors = []
    try:
        for index in range(engine.num_io_tensors):
            name = engine.get_tensor_name(index)
            shape = list(context.get_tensor_shape(name))
            dtype = engine.get_tensor_dtype(name)
            count = 1
            for dim in shape:
                count *= max(int(dim), 0)
            size = int(count * dtype.itemsize + 0.5)
            pointer = cuda.malloc(size)
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            if is_input and name in given:  # the workload's own values (token ids, masks)
                with open(given[name], "rb") as handle:
                    data = handle.read()
                if len(data) != size:
                    raise SystemExit(f"{given[name]} holds {len(data)} bytes; input {name!r} of shape {shape} takes {size}")
                cuda.upload(pointer, data)
            elif is_input:
                cuda.upload(pointer, random_bytes_for(dtype.name, count, rng))
            context.set_tensor_address(name, pointer)
            tensors.append({"name": name, "shape": shape, "dtype": dtype.name, "input": is_input, "bytes": size})
    except CudaError as exc:
        if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
            raise
        free, total = cuda.free_and_total()
        result["error"] = (
            f"out of GPU memory allocating the engine's inputs and outputs ({free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB)"
        )
        result["out_of_memory"] = True
        write_result(args.result, result)
        return 0
    result["tensors"] = tensors

    stream = cuda.stream()

    def enqueue(s) -> None:
        if not context.execute_async_v3(s.value):
            raise RuntimeError("execute_async_v3 returned false: " + "; ".join(logger.errors[-3:]))

    # The first runs also let TensorRT-RTX finish compiling its kernels for this GPU (JIT).
    enqueue(stream)
    cuda.synchronize(stream)
    launch = enqueue
    try:
        graph = cuda.capture(stream, enqueue)
        launch = lambda s: cuda.launch(graph, s)  # noqa: E731
        result["cuda_graph"] = True
    except (CudaError, RuntimeError) as exc:
        result["cuda_graph"] = False
        result["cuda_graph_error"] = str(exc)
        stream = cuda.stream()  # a failed capture leaves the stream unusable
    times, elapsed = timed_runs(cuda, stream, launch, args.warmup_ms, args.iterations, args.duration_s)
    result.update(ran=True, per_iteration_ms=times, walltime_s=round(elapsed, 4))

    if args.layer_profile_runs:
        # A separate run with the profiler on: per-layer timing perturbs the timing above.
        result["layer_profile"] = layer_profile(trt, context, cuda, stream, enqueue, args.layer_profile_runs)
    if cache is not None:
        write_atomically(args.runtime_cache, bytes(cache.serialize()))
    result["warnings"] = logger.warnings
    result["errors"] = logger.errors
    write_result(args.result, result)
    return 0


def execution_context(engine, cache_path: str | None, result: dict):
    """An execution context, with the runtime cache of kernels compiled for this GPU when asked:
    TensorRT-RTX finishes compiling on the GPU that runs the engine, and the cache keeps that work
    from one run to the next."""
    if not cache_path:
        return engine.create_execution_context(), None
    try:
        config = engine.create_runtime_config()
        cache = config.create_runtime_cache()
        if os.path.exists(cache_path):
            with open(cache_path, "rb") as handle:
                cache.deserialize(handle.read())
            result["runtime_cache_loaded"] = True
        config.set_runtime_cache(cache)
        return engine.create_execution_context(config), cache
    except Exception as exc:  # an API this release lacks, or a cache from another release
        result["runtime_cache_error"] = f"{type(exc).__name__}: {exc}"
        return engine.create_execution_context(), None


def layer_profile(trt, context, cuda, stream, enqueue, runs: int) -> dict:
    totals: dict[str, float] = {}

    class Profiler(trt.IProfiler):
        def __init__(self):
            super().__init__()

        def report_layer_time(self, layer_name, ms):
            totals[layer_name] = totals.get(layer_name, 0.0) + ms

    profiler = Profiler()  # held here: the context does not keep the Python object alive
    context.profiler = profiler
    for _ in range(runs):
        enqueue(stream)
        cuda.synchronize(stream)
    whole = sum(totals.values()) or 1.0
    layers = [
        {"name": name, "time_ms": total, "average_ms": total / runs, "percent": 100.0 * total / whole}
        for name, total in sorted(totals.items(), key=lambda item: -item[1])
    ]
    return {"iterations": runs, "layers": layers}


def cuda_check(args) -> int:
    """The timing above, on a plain CUDA graph (a memset): checks this driver on any NVIDIA GPU,
    including ones TensorRT-RTX engines do not run on."""
    result: dict = {}
    cuda = Cuda()
    result["device"] = {"name": cuda.name(), "compute_capability": cuda.compute_capability()}
    size = 64 << 20
    buffer = cuda.malloc(size)
    stream = cuda.stream()
    graph = cuda.capture(stream, lambda s: cuda.memset_async(buffer, 1, size, s))
    times, elapsed = timed_runs(cuda, stream, lambda s: cuda.launch(graph, s), args.warmup_ms, args.iterations, args.duration_s)
    result.update(per_iteration_ms=times, walltime_s=round(elapsed, 4), bytes=size)
    write_result(args.result, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("version").add_argument("result")
    build_args = commands.add_parser("build")
    build_args.add_argument("result")
    build_args.add_argument("--onnx", required=True)
    build_args.add_argument("--engine", required=True)
    build_args.add_argument("--arch", action="append", default=[])
    build_args.add_argument("--sparse", action="store_true")
    build_args.add_argument("--optimization-level", type=int)
    build_args.add_argument("--shape-range", action="append", default=[], help="NAME=MIN/OPT/MAX, e.g. input_ids=1x16/2x512/4x4096")
    for name in ("profile", "cuda-check"):
        timing = commands.add_parser(name)
        timing.add_argument("result")
        timing.add_argument("--warmup-ms", type=float, default=200.0)
        timing.add_argument("--iterations", type=int, default=10)
        timing.add_argument("--duration-s", type=float, default=3.0)
        if name == "profile":
            timing.add_argument("--engine", required=True)
            timing.add_argument("--layer-profile-runs", type=int, default=0)
            timing.add_argument("--runtime-cache")
            timing.add_argument("--shape", action="append", default=[], help="NAME=2x512: run a dynamic input at this shape")
            timing.add_argument("--load", action="append", default=[], help="NAME=FILE: an input's raw values")
    args = parser.parse_args(argv)
    handler = {"version": version, "build": build, "profile": profile, "cuda-check": cuda_check}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
