"""Does a transformers sweep time PyTorch the way an independent measurement does? (GPU only)

For each variant and torch toolchain: `pipeline run --model M --variant V --toolchain T --repeat N`
in a workspace that is kept between calls (each toolchain can be a call of its own), then, in a
process of its own, the same transformers class built from its config (random weights), in the
same dtype, with the toolchain's attention implementation and backend, fed the same token ids and
mask the product measured (its export's reference inputs at each shape point), timed independently:
warm up for a second, then takes of inferences enqueued back to back, a CUDA event recorded
between each two (so each inference's time is the span between its events and the take's total is
their sum), and one synchronisation at the end of the take: the median inference of each take, and
the median of `--takes` such takes, is the figure the product's median must be within `--tolerance`
of. The take's total divided by its count (the mean, which a few host stalls move and the median
does not) is kept beside it. A CUDA graph is timed after one eager forward of the model (a
graph replays faster only until its process runs such work, which the product's rounds always
have: docs/results/sweeps.md), its takes before that kept as a diagnostic. With `--host-cpus`, the product (`[profile] host_cpus`) and the
independent process run on those CPUs alone.

    python scripts/check_sweep_timing.py --workspace reports/gpu-sweep --out RESULTS \\
        --model modernbert --variants bf16 fp16 --toolchains torch-eager torch-eager-attn torch-compile

Appends to WORKSPACE/sweep-timing.json (one entry per variant × toolchain × shape point) and copies
it, the pipeline log, the manifests (manifests.tar.gz) and the comparison (html, md, json) to
RESULTS, after each toolchain. Each point's independent measurement runs in a process of its own;
`--budget-s` starts nothing new after that many seconds, so a call with a time limit still ends
with its results. Exits 1 when
any entry is outside the tolerance. The figures depend on the machine: report them with the GPU named.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

from check_torch_timing import DTYPES, REPO, run_pipeline  # the timm check's, beside this script

# Each take times at least this long (and at least 3 inferences).
TAKE_S = 0.5


def take_medians_ms(torch, infer, runs: int, takes: int) -> tuple[list[float], list[float]]:
    """(the median inference of each take, the mean of each take): `runs` inferences enqueued back
    to back with an event between each two, one synchronisation per take."""
    medians, means = [], []
    for _ in range(takes):
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(runs + 1)]
        marks[0].record()
        for mark in marks[1:]:
            infer()
            mark.record()
        marks[-1].synchronize()
        spans = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        medians.append(statistics.median(spans))
        means.append(marks[0].elapsed_time(marks[-1]) / runs)
    return medians, means


def independent_ms(job: dict) -> dict[str, dict]:
    """Per-inference milliseconds at each shape point, one figure per take (or why it failed), and diagnostics."""
    import os

    import numpy as np
    import torch

    sys.path.insert(0, str(REPO))
    from pipeline.models.transformers import import_transformers

    transformers = import_transformers()
    cls = getattr(transformers, job["class"])
    config = cls.config_class()
    for key, value in job["config"].items():
        setattr(config, key, value)
    config._attn_implementation = job["attn"]
    dtype = getattr(torch, job["dtype"])
    torch.manual_seed(0)
    model = cls(config).eval().to(device="cuda", dtype=dtype)
    results: dict[str, list[float] | str] = {}
    diagnostics: dict[str, dict] = {}
    if job.get("host_cpus"):  # where the product pins: its measuring thread, once the model is loaded
        os.sched_setaffinity(0, job["host_cpus"])
    for shape, inputs in job["points"].items():
        feeds = {name: torch.from_numpy(np.fromfile(path, dtype=np.int64).reshape(dims)).cuda() for name, (path, dims) in inputs.items()}
        try:
            with torch.no_grad():
                if job["backend"] == "compile":
                    torch._dynamo.reset()
                    compiled = torch.compile(model, mode=job["mode"], dynamic=False)

                    def infer(compiled=compiled, feeds=feeds):
                        return compiled(**feeds)
                elif job["backend"] == "cudagraphs":
                    # One eager forward captured in a CUDA graph (warmed on a side stream first,
                    # as CUDA graphs require); each inference replays it.
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        for _ in range(3):
                            model(**feeds)
                    torch.cuda.current_stream().wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        model(**feeds)

                    def infer(graph=graph):
                        graph.replay()
                else:

                    def infer(feeds=feeds):
                        return model(**feeds)

                # The first run compiles (torch.compile: tens of seconds); the warm-up and the
                # estimate of one run's time come after it, or a take would be a handful of runs.
                infer()
                torch.cuda.synchronize()
                warmed, started = 0, time.perf_counter()
                while time.perf_counter() - started < 1.0 or warmed < 3:
                    infer()
                    torch.cuda.synchronize()
                    warmed += 1
                one = (time.perf_counter() - started) / warmed
                runs = max(3, min(500, int(TAKE_S / max(one, 1e-6))))
                # A diagnostic beside it: the product's own timing method (each run bracketed by
                # CUDA events, the median of the runs) on this process's model and inputs, to tell
                # a difference of method from a difference of what is timed.
                from pipeline.measuring.takes import cuda_take

                product_method = cuda_take(torch, infer, 10, 1000.0)
                diagnostics[shape] = {"per_run_events_median_ms": statistics.median(product_method), "runs_per_take": runs}
                if job.get("product_model") and job["backend"] == "eager":
                    # And the model as the product builds it (its family's wrapper), timed the same way.
                    wrapped = product_model(job, dtype)
                    ordered = tuple(feeds[name] for name in job["input_order"])
                    built = cuda_take(torch, lambda wrapped=wrapped, ordered=ordered: wrapped(*ordered), 10, 1000.0)
                    diagnostics[shape]["product_built_model_ms"] = statistics.median(built)
                    del wrapped
                if job.get("gc_diagnostic") and job["backend"] == "eager":
                    # Is a launch-bound point's spread the garbage collector's? Takes with it on and
                    # off, interleaved so that drift of the host hits both alike.
                    import gc

                    figures, means, without_gc = [], [], []
                    for _ in range(job["takes"]):
                        median, mean = take_medians_ms(torch, infer, runs, 1)
                        figures, means = figures + median, means + mean
                        gc.disable()
                        try:
                            without_gc += take_medians_ms(torch, infer, runs, 1)[0]
                        finally:
                            gc.enable()
                    diagnostics[shape]["gc_disabled_ms"] = without_gc
                elif job["backend"] == "cudagraphs":
                    # A graph replays faster (ModernBERT at 2×512 on an H100: 8 %) only while its
                    # process has run none of the model's work eagerly since capturing it
                    # (docs/results/sweeps.md); the product's rounds have run the point's other engines,
                    # as any process that does more than replay one graph has. The figure is taken
                    # after one eager forward; the takes before it are kept beside it.
                    diagnostics[shape]["before_any_eager_work_ms"] = take_medians_ms(torch, infer, runs, job["takes"])[0]
                    model(**feeds)
                    torch.cuda.synchronize()
                    figures, means = take_medians_ms(torch, infer, runs, job["takes"])
                else:
                    figures, means = take_medians_ms(torch, infer, runs, job["takes"])
                diagnostics[shape]["take_means_ms"] = means
            results[shape] = figures
        except torch.cuda.OutOfMemoryError as exc:
            results[shape] = f"out of memory: {str(exc).splitlines()[0]}"
            torch.cuda.empty_cache()
    return {"takes": results, "diagnostics": diagnostics}


def product_model(job: dict, dtype):
    """The model as the pipeline's transformers family builds it (for the diagnostic only)."""
    from pipeline.models import model_source
    from pipeline.runtimes import load_catalog

    catalog = load_catalog(Path(job["catalog"]))
    source = model_source(job["model"], catalog.models[job["model"]], catalog.root)
    model = source.runnable(source.create()).to(dtype)
    if job["attn"]:
        source.use_attention(model, job["attn"])
    return model.eval().cuda()


def main() -> int:
    if sys.argv[1:2] == ["--independent"]:
        print(json.dumps(independent_ms(json.loads(sys.argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, required=True, help="kept between calls: the sweep's manifests and the results so far")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="modernbert")
    parser.add_argument("--variants", nargs="+", default=["bf16", "fp16"])
    parser.add_argument("--toolchains", nargs="+", default=["torch-eager", "torch-eager-attn", "torch-compile"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--takes", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--profile", default="warmup_ms = 500\niterations = 10\nduration_s = 1.0\n", help="the [profile] table")
    parser.add_argument("--budget-s", type=float, help="start no new measurement after this many seconds (the call's time limit)")
    parser.add_argument("--host-cpus", type=int, nargs="+", help="the CPUs both measurements run on ([profile] host_cpus)")
    parser.add_argument(
        "--product-model-diagnostic", action="store_true", help="eager: also time the model as the product builds it, in the same process"
    )
    parser.add_argument("--gc-diagnostic", action="store_true", help="eager: also take each point with the garbage collector off")
    parser.add_argument(
        "--points",
        nargs="+",
        help="only these shape points (the GPU-bound ones, say): SHAPE for every toolchain, TOOLCHAIN@SHAPE for one; default: every point",
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="each toolchain's points measured in one process (one model load), not a process per point",
    )
    parser.add_argument(
        "--only",
        choices=["product", "independent"],
        help="product: the pipeline's sweep alone; independent: export (for the inputs) and the independent measurement "
        "alone, compared with the product's manifests already in the workspace (from an earlier call)",
    )
    args = parser.parse_args()
    started = time.monotonic()

    def out_of_time() -> bool:
        return args.budget_s is not None and time.monotonic() - started > args.budget_s

    sys.path.insert(0, str(REPO))
    from pipeline.manifest import read_manifest
    from pipeline.measuring.accuracy import ReferenceBatch
    from pipeline.runtimes import load_catalog

    workspace = args.workspace.resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    if not (args.only == "independent" and (workspace / "pipeline.toml").exists()):
        # A workspace of its own: the shipped catalog with this script's [profile]. (Measuring a
        # run made already, its catalog is kept as it is.)
        catalog_text = (REPO / "pipeline.toml").read_text()
        start = catalog_text.index("[profile]")
        end = catalog_text.index("\n[", start + 1)
        profile = args.profile + (f"host_cpus = {args.host_cpus}\n" if args.host_cpus else "")
        (workspace / "pipeline.toml").write_text(catalog_text[:start] + "[profile]\n" + profile + catalog_text[end:])
    catalog = load_catalog(workspace / "pipeline.toml")
    spec = catalog.models[args.model]
    log = workspace / "pipeline.log"
    results_path = workspace / "sweep-timing.json"
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    results = json.loads(results_path.read_text()) if results_path.exists() else {"gpu": gpu, "torch": version("torch"), "entries": []}
    failed = False
    for variant in args.variants:
        exported = False
        for toolchain in args.toolchains:
            if out_of_time():
                print(f"{variant} {toolchain}: not run, the time budget ran out", flush=True)
                continue
            if args.only == "independent":
                if not exported:  # the inputs: the export's reference batches (unchanged: nothing done)
                    code = run_pipeline(workspace, log, "export", "--model", args.model, "--variant", variant, check=False)
                    exported = True
            else:
                code = run_pipeline(
                    workspace,
                    log,
                    "run",
                    "--model",
                    args.model,
                    "--variant",
                    variant,
                    "--toolchain",
                    toolchain,
                    "--repeat",
                    str(args.repeat),
                    check=False,  # a point out of memory exits 1; the others are still compared
                )
            print(f"pipeline {'export' if args.only == 'independent' else 'run'} {variant} {toolchain}: exit {code}", flush=True)
            if args.only == "product":
                save(results_path, log, workspace, args.out)
                continue
            chain = catalog.toolchains[toolchain]
            export = read_manifest(workspace / "manifests" / "export" / f"{args.model}_{variant}.json").export
            points, manifests = {}, {}
            for shape in export.details.shape_points:
                if args.points and shape not in args.points and f"{toolchain}@{shape}" not in args.points:
                    continue
                reference = ReferenceBatch.from_export(export.details, workspace, shape)
                points[shape] = {t.name: (str(t.path), list(t.shape)) for t in reference.inputs}
                manifests[shape] = read_manifest(workspace / "manifests" / toolchain / f"{args.model}_{variant}@{shape}.json")
            if not points:
                continue  # none of this toolchain's points asked for
            job = {
                "class": spec.transformers,
                "config": dict(spec.config),
                "attn": chain.attn_implementation or spec.attn_implementation,
                "dtype": DTYPES[catalog.variants[variant].precision],
                "backend": chain.backend,
                "mode": chain.mode,
                "takes": args.takes,
                "points": points,
                "product_model": args.product_model_diagnostic,
                "catalog": str(workspace / "pipeline.toml"),
                "model": args.model,
                "input_order": list(next(iter(points.values()))),
                "gc_diagnostic": args.gc_diagnostic,
                "host_cpus": args.host_cpus,
            }
            independent, diagnostics = {}, {}
            batches = [points] if args.together else [{shape: inputs} for shape, inputs in points.items()]
            for batch in batches:
                shape = ", ".join(batch)
                if out_of_time():
                    independent[shape] = "not measured: the call's time budget ran out"
                    continue
                # Each point (or with --together each toolchain) in a process of its own: no CUDA
                # context of this script beside it, and what was measured survives a call cut off
                # at its time limit.
                job["points"] = batch
                measured = subprocess.run([sys.executable, __file__, "--independent", json.dumps(job)], capture_output=True, text=True)
                if measured.returncode != 0:
                    print(f"the independent measurement at {shape} failed:\n{measured.stderr[-3000:]}", flush=True)
                    independent.update(dict.fromkeys(batch, "failed"))
                    failed = True
                    continue
                answer = json.loads(measured.stdout.strip().splitlines()[-1])
                independent.update(answer["takes"])
                diagnostics.update(answer["diagnostics"])
            for shape, manifest in manifests.items():
                profile = manifest.profile
                entry = {"variant": variant, "toolchain": toolchain, "shape": shape, "status": profile.status if profile else None}
                theirs = independent.get(shape)
                if profile is None or profile.status != "done" or not isinstance(theirs, list):
                    entry.update(reason=profile.reason if profile else None, independent=theirs)
                    results["entries"].append(entry)
                    print(f"{variant:5} {toolchain:17} {shape:7} product: {entry['reason']}  independent: {theirs}", flush=True)
                    continue
                details = profile.details
                reference = statistics.median(theirs)
                ratio = details.latency_ms.median / reference
                within = abs(ratio - 1.0) <= args.tolerance
                failed |= not within
                execution = getattr(details, "execution", None) or {}
                entry.update(
                    product_median_ms=round(details.latency_ms.median, 4),
                    repeat_medians_ms=details.repeat_medians_ms,
                    repeat_cv=details.repeat_cv,
                    stable=details.stable,
                    tokens_per_s=details.tokens_per_s,
                    peak_memory_mib=execution.get("peak_memory_mib"),
                    recompiles=execution.get("recompiles"),
                    recompiles_during_measurement=execution.get("recompiles_during_measurement"),
                    compile_s=execution.get("compile_s"),
                    independent_ms=[round(v, 4) for v in theirs],
                    independent_median_ms=round(reference, 4),
                    independent_mean_ms=round(statistics.median((diagnostics.get(shape) or {}).get("take_means_ms") or [math.nan]), 4),
                    diagnostic=diagnostics.get(shape),
                    ratio=round(ratio, 4),
                    within_tolerance=within,
                )
                results["entries"].append(entry)
                print(
                    f"{variant:5} {toolchain:17} {shape:7} product {entry['product_median_ms']:9.3f} ms (repeat CV {details.repeat_cv or 0:.2%})  "
                    f"independent {reference:9.3f} ms (mean {entry['independent_mean_ms']:.3f})  ratio {ratio:.3f} {'ok' if within else 'OUTSIDE'}  "
                    f"(its per-run events: {(diagnostics.get(shape) or {}).get('per_run_events_median_ms', float('nan')):.3f} ms)"
                    + (
                        f"; before any eager work since capture: {statistics.median(before):.3f} ms"
                        if (before := (diagnostics.get(shape) or {}).get("before_any_eager_work_ms"))
                        else ""
                    ),
                    flush=True,
                )
            results_path.write_text(json.dumps(results, indent=2))
            save(results_path, log, workspace, args.out)  # what is done so far comes back even if the call is cut off
    for fmt, name in (("html", "compare.html"), ("md", "compare.md"), ("json", "compare.json")):
        run_pipeline(workspace, log, "compare", "--model", args.model, "--format", fmt, "--out", str(args.out / name), check=False)
    save(results_path, log, workspace, args.out)
    return 1 if failed else 0


def save(results_path: Path, log: Path, workspace: Path, out: Path) -> None:
    """The results, the log and the manifests (one archive: the device tool returns a few files)."""
    import tarfile

    out.mkdir(parents=True, exist_ok=True)
    if results_path.exists():
        shutil.copy(results_path, out / "sweep-timing.json")
    shutil.copy(log, out / "pipeline.log")
    with tarfile.open(out / "manifests.tar.gz", "w:gz") as archive:
        archive.add(workspace / "manifests", arcname="manifests", filter=lambda info: None if info.name.endswith(".lock") else info)


if __name__ == "__main__":
    sys.exit(main())
