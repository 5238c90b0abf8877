"""Does the product time PyTorch the way an independent back-to-back measurement does? (GPU only)

For each variant and torch toolchain: `pipeline run … --repeat N` in a fresh workspace, then, in
a process of its own, the same timm model in the same dtype and the same backend measured independently:
warm up, then `--runs` inferences enqueued back to back between two CUDA events, the total divided
by the count, taken `--takes` times (median). The product's median must be within `--tolerance`.

    python scripts/check_torch_timing.py --out RESULTS_DIR
    python scripts/check_torch_timing.py --variants fp16 --toolchains torch-eager --out RESULTS_DIR

Writes RESULTS_DIR/torch-timing.json (one entry per variant × toolchain, written as each is done)
and RESULTS_DIR/pipeline.log; exits 1 when any entry is outside the tolerance. The figures depend
on the machine: report them with the GPU named.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def run_pipeline(workspace: Path, log: Path, *args: str, check: bool = True) -> int:
    """`pipeline ARGS` on the workspace's catalog, its output appended to ``log``; its exit code
    (``check``: a failure ends the script)."""
    command = [sys.executable, "-m", "pipeline.cli", "--catalog", str(workspace / "pipeline.toml"), *args]
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        started = time.perf_counter()
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO).returncode
        out.write(f"(exit {code}, {time.perf_counter() - started:.1f} s)\n")
    if check and code != 0:
        raise SystemExit(f"pipeline {' '.join(args)} exited {code}: see {log}")
    return code


def independent_ms(model_name: str, batch: int, dtype_name: str, backend: str, mode: str | None, runs: int, takes: int) -> list[float]:
    """Per-inference milliseconds, one figure per take: `runs` inferences between two events."""
    import timm
    import torch

    dtype = getattr(torch, dtype_name)
    model = timm.create_model(model_name, pretrained=False).eval().to(device="cuda", dtype=dtype)
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=dtype)
    with torch.no_grad():
        if backend == "compile":
            torch._dynamo.reset()
            compiled = torch.compile(model, mode=mode, dynamic=False)

            def infer():
                return compiled(x)
        elif backend == "cudagraphs":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(x)
            infer = graph.replay
        else:

            def infer():
                return model(x)

        warm_until = time.perf_counter() + 1.0
        while time.perf_counter() < warm_until:
            infer()
        torch.cuda.synchronize()
        return takes_ms(torch, infer, runs, takes)


def takes_ms(torch, infer, runs: int, takes: int) -> list[float]:
    """Each take: `runs` inferences enqueued back to back between two CUDA events, the mean per run."""
    figures = []
    for _ in range(takes):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(runs):
            infer()
        end.record()
        end.synchronize()
        figures.append(start.elapsed_time(end) / runs)
    return figures


def main() -> int:
    if sys.argv[1:2] == ["--independent"]:
        print(json.dumps(independent_ms(*json.loads(sys.argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="vit_base")
    parser.add_argument("--variants", nargs="+", default=["fp16", "bf16"])
    parser.add_argument("--toolchains", nargs="+", default=["torch-eager", "torch-inductor", "torch-cudagraphs"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--takes", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=0.03)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from pipeline.manifest import read_manifest
    from pipeline.runtimes import load_catalog

    args.out.mkdir(parents=True, exist_ok=True)
    workspace = args.out / "ws"
    workspace.mkdir(exist_ok=True)
    (workspace / "pipeline.toml").write_text((REPO / "pipeline.toml").read_text())
    catalog = load_catalog(workspace / "pipeline.toml")
    spec = catalog.models[args.model]
    log = args.out / "pipeline.log"
    results_path = args.out / "torch-timing.json"
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    results = {"gpu": gpu, "torch": version("torch"), "entries": []}
    failed = False
    for variant in args.variants:
        for toolchain in args.toolchains:
            run_pipeline(
                workspace, log, "run", "--model", args.model, "--variant", variant, "--toolchain", toolchain, "--repeat", str(args.repeat)
            )
            chain = catalog.toolchains[toolchain]
            manifest = read_manifest(workspace / "manifests" / toolchain / f"{args.model}_{variant}.json")
            details = manifest.profile.details
            # In a process of its own, so no CUDA context of this script sits beside the next measurement.
            job = [
                spec.timm,
                spec.batch_size,
                DTYPES[catalog.variants[variant].precision],
                chain.backend,
                chain.mode,
                args.runs,
                args.takes,
            ]
            measured = subprocess.run([sys.executable, __file__, "--independent", json.dumps(job)], capture_output=True, text=True)
            if measured.returncode != 0:
                raise SystemExit(f"the independent measurement failed:\n{measured.stderr}")
            independent = json.loads(measured.stdout.strip().splitlines()[-1])
            reference = statistics.median(independent)
            ratio = details.latency_ms.median / reference
            within = abs(ratio - 1.0) <= args.tolerance
            failed |= not within
            entry = {
                "variant": variant,
                "toolchain": toolchain,
                "product_median_ms": round(details.latency_ms.median, 4),
                "repeat_medians_ms": details.repeat_medians_ms,
                "repeat_cv": details.repeat_cv,
                "repeats_pooled": details.repeats_pooled,
                "stable": details.stable,
                "runs_pooled": details.iterations,
                "host_latency_ms": (getattr(details, "execution", None) or {}).get("host_latency_ms"),
                "independent_ms": [round(v, 4) for v in independent],
                "independent_median_ms": round(reference, 4),
                "ratio": round(ratio, 4),
                "within_tolerance": within,
                "during": details.machine_load.get("during") if details.machine_load else None,
                "flags": [line for line in log.read_text().splitlines() if line.startswith(f"WARNING {args.model}_{variant}")][-4:],
            }
            results["entries"].append(entry)
            results_path.write_text(json.dumps(results, indent=2))
            print(
                f"{variant:5} {toolchain:17} product {entry['product_median_ms']:8.3f} ms (repeat CV {details.repeat_cv or 0:.2%})  "
                f"independent {reference:8.3f} ms  ratio {ratio:.3f} {'ok' if within else 'OUTSIDE'}",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
