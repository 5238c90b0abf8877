#!/usr/bin/env python3
"""Benchmark: how long `pipeline export` takes per variant, each in a fresh process and workspace.

    python scripts/benchmark_export.py --model vit --variants fp16 int8 fp8 mxfp8 nvfp4 --out export.json

Each variant runs as its own `pipeline export` process, as a user would, so import and one-time
costs count. With --modelopt-kernels it also times the nvcc builds of ModelOpt's CUDA fake-quant
kernels in an empty extension cache: the cost that made INT8/FP8/MXFP8 exports take 80-90 s on a
fresh machine, and that the pipeline now avoids for INT8/FP8.
Results are printed and written as JSON, with the GPU, torch and ModelOpt versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict:
    info = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        from importlib import metadata

        info["nvidia-modelopt"] = metadata.version("nvidia-modelopt")
    except Exception:
        pass
    return info


def time_export(model: str, variant: str, calib_samples: int) -> dict:
    """One variant in its own process: import and one-time costs included."""
    return time_exports(model, [variant], calib_samples)[0]


def time_exports(model: str, variants: list[str], calib_samples: int) -> list[dict]:
    """One `pipeline export` process for ``variants``; one row per variant."""
    workspace = Path(tempfile.mkdtemp(prefix="bench-"))
    shutil.copy(REPO / "pipeline.toml", workspace / "pipeline.toml")
    engines = [f"{model}_{variant}" for variant in variants]
    command = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "--catalog",
        str(workspace / "pipeline.toml"),
        "export",
        "--calib-samples",
        str(calib_samples),
    ]
    for engine in engines:
        command += ["--engine", engine]
    # faulthandler: a crash in a native library still shows where Python was.
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    rows = [_row(workspace, engine, result, wall, len(engines)) for engine in engines]
    shutil.rmtree(workspace, ignore_errors=True)
    return rows


def _row(workspace: Path, engine: str, result, wall: float, processes_share: int) -> dict:
    row = {"engine": engine, "exit_code": result.returncode, "process_s": round(wall, 2), "engines_in_process": processes_share}
    manifest = workspace / "manifests" / "export" / f"{engine}.json"
    if manifest.exists():
        record = json.loads(manifest.read_text())["export"]
        row["stage_s"] = record["duration_s"]
        row["onnx_ops"] = {k: v for k, v in record["details"]["onnx_ops"].items() if "::" in k or "quantize" in k.lower()}
        row["initializer_dtypes"] = record["details"]["onnx_audit"]["initializer_dtypes"]
        row["accuracy_cosine"] = (record["details"].get("accuracy") or {}).get("cosine_similarity")
        row["phases_s"] = record["details"].get("timings_s")
        # The process's one-time imports land in whichever variant needed them first.
        row["stage_without_imports_s"] = round(row["stage_s"] - (row["phases_s"] or {}).get("import", 0.0), 2)
    else:
        # The traceback (and faulthandler's dump) rather than the exporter's warnings.
        text = result.stderr or result.stdout
        marker = max(text.rfind("Fatal Python error"), text.rfind("Traceback (most recent call last)"))
        row["error"] = text[marker:][:3000] if marker >= 0 else text[-2000:]
    return row


KERNELS = ("get_cuda_ext", "get_cuda_ext_fp8", "get_cuda_ext_mx")


def time_modelopt_kernels(names=KERNELS) -> list[dict]:
    """nvcc builds of ModelOpt's fake-quant CUDA kernels, each in a fresh process and empty cache."""
    rows = []
    for name in names:
        cache = tempfile.mkdtemp(prefix="torch-ext-")
        code = f"import time; t=time.perf_counter(); from modelopt.torch.quantization import extensions as e; ext=e.{name}(); print(round(time.perf_counter()-t,2), ext is not None)"
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, TORCH_EXTENSIONS_DIR=cache)
        )
        last = (result.stdout.strip().splitlines() or ["? False"])[-1].split()
        rows.append({"extension": name, "seconds": float(last[0]) if last[0] != "?" else None, "built": last[-1] == "True"})
        shutil.rmtree(cache, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit")
    parser.add_argument("--variants", nargs="*", default=["fp16", "int8", "fp8", "mxfp8", "nvfp4", "nvfp4_sparse", "mxfp8_sparse"])
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=1, help="Export each variant this many times (later runs show warm caches).")
    parser.add_argument("--one-process", action="store_true", help="Export all variants in one process, as `make engines` does.")
    parser.add_argument(
        "--modelopt-kernels",
        nargs="*",
        choices=KERNELS,
        metavar="NAME",
        help=f"Also time the builds of ModelOpt's CUDA kernels (all, or some of: {', '.join(KERNELS)}).",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    report = {"machine": machine(), "exports": [], "modelopt_kernel_builds": None}
    if args.modelopt_kernels is not None:
        report["modelopt_kernel_builds"] = time_modelopt_kernels(args.modelopt_kernels or KERNELS)
        for row in report["modelopt_kernel_builds"]:
            print(f"ModelOpt kernel {row['extension']:<18} build {row['seconds']} s (built: {row['built']})", flush=True)
    if args.one_process and args.variants:
        rows = time_exports(args.model, args.variants, args.calib_samples)
    else:
        rows = [time_export(args.model, variant, args.calib_samples) for variant in args.variants for _ in range(args.repeat)]
    for row in rows:
        report["exports"].append(row)
        print(
            f"{row['engine']:<22} process {row['process_s']:>7.2f} s ({row['engines_in_process']} engine(s)), stage {row.get('stage_s', '–')} s ({row.get('stage_without_imports_s', '–')} s without imports), exit {row['exit_code']}",
            flush=True,
        )
        if row.get("phases_s"):
            print("    " + ", ".join(f"{k} {v:.1f}" for k, v in row["phases_s"].items()), flush=True)
        if row["exit_code"] != 0:
            print(row["error"], flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0 if all(r["exit_code"] == 0 for r in report["exports"]) else 1


if __name__ == "__main__":
    sys.exit(main())
