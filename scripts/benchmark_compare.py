"""How long `pipeline compare` takes over a large results folder.

    python scripts/benchmark_compare.py                  # 3000 manifests, table and JSON
    python scripts/benchmark_compare.py --manifests 600 --iterations 40 --repeat 5

The manifests are copies of a real one (tests/data/manifests: vit_tiny on ONNX Runtime, written by
the pipeline) under other model names, six per model (fp32/fp16/int8 × onnxruntime/torch-eager),
each with its own seeded per-iteration times, so every comparison the report makes (speedup over
the baseline variant, change against the first toolchain, against the baseline toolchain) is made
for every row. The command runs in a fresh Python process, as a user's would (imports included),
in three states of the compare cache (manifests/.compare-cache.json): cold (none, the first compare
of a folder), warm (nothing changed since the last compare) and after one profile rewrote one
manifest. The figure depends on the machine: report it with the machine named.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "data" / "manifests" / "landed-bdf42fb" / "onnxruntime" / "vit_tiny_fp32.json"
VARIANTS = ("fp32", "fp16", "int8")
TOOLCHAINS = ("onnxruntime", "torch-eager")


def write_workspace(root: Path, count: int, iterations: int) -> None:
    import numpy as np

    template = json.loads(RECORDED.read_text())
    rng = np.random.default_rng(0)
    catalog = (REPO / "pipeline.toml").read_text()
    models = count // (len(VARIANTS) * len(TOOLCHAINS))
    extra = []
    for index in range(models):
        model = f"bench{index:05d}"
        extra.append(f'\n[models.{model}]\ntimm = "vit_tiny_patch16_224"\nbatch_size = 4\n')
        for variant in VARIANTS:
            for toolchain in TOOLCHAINS:
                manifest = copy.deepcopy(template)
                manifest.update(engine=f"{model}_{variant}", model=model, variant=variant, precision=variant, toolchain=toolchain)
                details = manifest["profile"]["details"]
                times = rng.lognormal(mean=np.log(50 + 10 * VARIANTS.index(variant)), sigma=0.1, size=iterations)
                details["per_iteration_ms"] = [round(float(t), 6) for t in times]
                details["iterations"] = iterations
                stats = details["latency_ms"]
                stats.update(
                    count=iterations, median=float(np.median(times)), mean=float(times.mean()), p99=float(np.percentile(times, 99))
                )
                folder = root / "manifests" / toolchain
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{model}_{variant}.json").write_text(json.dumps(manifest))
    (root / "pipeline.toml").write_text(catalog + "".join(extra))


def time_compare(catalog: Path, fmt: str) -> float:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--catalog", str(catalog), "compare", "--format", fmt],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"pipeline compare --format {fmt} exited {result.returncode}: {result.stderr}")
    return elapsed


def touch_one(root: Path) -> None:
    """What a profile of one engine does to the folder: one manifest rewritten."""
    path = next((root / "manifests" / TOOLCHAINS[0]).glob("*.json"))
    manifest = json.loads(path.read_text())
    manifest["profile"]["details"]["per_iteration_ms"][0] *= 1.01
    path.write_text(json.dumps(manifest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifests", type=int, default=3000)
    parser.add_argument("--iterations", type=int, default=15, help="per-iteration times in each manifest (the demo records about 15)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workspace = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    try:
        write_workspace(workspace, args.manifests, args.iterations)
        print(
            f"{args.manifests} manifests, {args.iterations} iterations each; {platform.node()}, {platform.processor() or platform.machine()}"
        )
        catalog, cache = workspace / "pipeline.toml", workspace / "manifests" / ".compare-cache.json"
        for fmt in ("table", "json"):
            cold, warm, changed = [], [], []
            for _ in range(args.repeat):
                cache.unlink(missing_ok=True)
                cold.append(time_compare(catalog, fmt))
                warm.append(time_compare(catalog, fmt))
                touch_one(workspace)
                changed.append(time_compare(catalog, fmt))
            for state, times in (("cold cache", cold), ("warm cache", warm), ("one manifest changed", changed)):
                runs = ", ".join(f"{t:.2f}" for t in times)
                print(f"compare --format {fmt:5} {state:21}: median {statistics.median(times):.2f} s (runs: {runs})")
    finally:
        shutil.rmtree(workspace)


if __name__ == "__main__":
    main()
