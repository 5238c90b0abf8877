"""How long `pipeline compare` takes over a large results folder, and how its time grows.

    python scripts/benchmark_compare.py                         # 3000 manifests, table and JSON
    python scripts/benchmark_compare.py --layout one-point      # 3000 engines of one model at one point
    python scripts/benchmark_compare.py --layout spread --rounds  # 100 models × 30 engines, timed in rounds
    python scripts/benchmark_compare.py --growth                # JSON compare of 3 and 3000, each layout
    python scripts/benchmark_compare.py --layout one-point --rounds --set 10 --copies  # 3000 copies of one, in sets of ten

The manifests are copies of a real one (tests/data/manifests: vit_tiny on ONNX Runtime, written by
the pipeline), each with its own seeded per-iteration times, written as this version writes a
manifest (its schema lifted to today's), laid out three ways:

- ``models`` (default): six engines a model (fp32/fp16/int8 × onnxruntime/torch-eager) under other
  model names, so every comparison a row makes (speedup over the baseline variant, change against
  the first toolchain, against the baseline toolchain) is made for every row;
- ``one-point``: one model at one point with an engine in each of N toolchain folders (a sweep
  over many builds or releases): the verdict there chooses among all N;
- ``spread``: 30 engines (fp32 in 30 toolchain folders) for each of N/30 models.

With ``--rounds`` each manifest also holds the rounds record it would have from a run that timed
its point's engines together (pipeline/measuring/rounds.py), in sets of at most 30 engines (a model's
30 in ``spread``; in ``one-point`` the toolchains 30 at a time, as separate runs would; ``--set 10``
in tens): the verdict compares engines of one set paired, round by round, and the others by their
intervals. With ``--copies`` every manifest of a variant holds the same times, as copies of one
profile's manifest do: no engine is faster than another, so every candidate ties with the answer
(the verdict's worst case: the answer's group is all of them).

The command runs in a fresh Python process, as a user's would (imports included, from the bytecode
a first run leaves: the product's modules are compiled before timing, which an environment with
PYTHONDONTWRITEBYTECODE=1 would otherwise have every run do again; ``--source`` times that), in three states
of the compare cache (manifests/.compare-cache.json): cold (none, the first compare of a folder),
warm (nothing changed since the last compare) and after one profile rewrote one manifest; over N
manifests, then over 3 of the same layout, and each state's time is said as a multiple of the
3-manifest one. Its peak memory is the child's maximum resident set. ``--growth`` prints the cold
JSON compare of 3 and of N manifests in each layout, with and without rounds, and their ratio. The
figures depend on the machine: report them with the machine named.
"""

from __future__ import annotations

import argparse
import compileall
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
LAYOUTS = ("models", "one-point", "spread")
# Engines a model in the spread layout, and the most engines a set of rounds holds.
SPREAD, ROUNDS_SET = 30, 30
ROUNDS = 6
# The folder a compare's fixed cost is measured on.
FEW = 3
# The layouts of one point measure a transformer there.
POINT = "2x16"
MODEL_AT_POINT = f'transformers = "BertModel"\nshapes = ["{POINT}"]\n'


def engines_of(layout: str, count: int) -> list[tuple[str, str, str]]:
    """(model, variant, toolchain) of each manifest of a layout."""
    if layout == "models":
        models = max(1, count // (len(VARIANTS) * len(TOOLCHAINS)))
        return [(f"bench{m:05d}", v, tc) for m in range(models) for v in VARIANTS for tc in TOOLCHAINS]
    if layout == "one-point":
        return [("bench00000", "fp32", f"build{i:05d}") for i in range(count)]
    return [(f"bench{m:05d}", "fp32", f"build{i:05d}") for m in range(max(1, count // SPREAD)) for i in range(min(count, SPREAD))]


def write_workspace(
    root: Path,
    count: int,
    iterations: int,
    layout: str = "models",
    rounds: bool = False,
    set_size: int = ROUNDS_SET,
    copies: bool = False,
) -> int:
    """The manifests of ``layout`` and a catalog naming their models; returns how many were written.
    With ``copies``, the manifests of a variant all hold the same times."""
    import numpy as np

    from pipeline.manifest.reading import parse_manifest

    template = json.loads(RECORDED.read_text())
    rng = np.random.default_rng(0)
    catalog = (REPO / "pipeline.toml").read_text()
    engines = engines_of(layout, count)
    # The sets of rounds: per model, its engines in runs of at most set_size.
    sets: dict[tuple[str, str, str], tuple[str, list[str]]] = {}
    if rounds:
        by_model: dict[str, list[tuple[str, str, str]]] = {}
        for engine in engines:
            by_model.setdefault(engine[0], []).append(engine)
        for model, members in by_model.items():
            for start in range(0, len(members), set_size):
                chunk = members[start : start + set_size]
                group = f"{model}-{start // set_size:04d}"
                entrants = [f"{variant}/{toolchain}" for _, variant, toolchain in chunk]
                sets.update({engine: (group, entrants) for engine in chunk})
    for index, (model, variant, toolchain) in enumerate(engines):
        manifest = copy.deepcopy(template)
        manifest.update(engine=f"{model}_{variant}", model=model, variant=variant, precision=variant, toolchain=toolchain)
        details = manifest["profile"]["details"]
        typical = 50 + 10 * VARIANTS.index(variant) + (0 if copies else (index % SPREAD) * 0.5)
        if copies:  # each variant's times drawn alike, as one manifest copied
            rng = np.random.default_rng(VARIANTS.index(variant))
        times = rng.lognormal(mean=np.log(typical), sigma=0.1, size=iterations)
        details["per_iteration_ms"] = [round(float(t), 6) for t in times]
        details["iterations"] = iterations
        stats = details["latency_ms"]
        stats.update(count=iterations, median=float(np.median(times)), mean=float(times.mean()), p99=float(np.percentile(times, 99)))
        if rounds:
            group, entrants = sets[(model, variant, toolchain)]
            takes = [
                {"round": r, "order": 0, "runs": iterations // ROUNDS, "median_ms": float(np.median(times[r::ROUNDS]))}
                for r in range(ROUNDS)
            ]
            details["rounds"] = [
                {
                    "group": group, "entrant": f"{variant}/{toolchain}", "entrants": entrants, "takes": takes, "rounds": ROUNDS,
                    "stop": "decided", "elapsed_s": 3.0, "take_ms": 250.0, "take_runs": 1, "min_rounds": ROUNDS, "budget_s": 30.0,
                    "tie": 0.03, "seed": 0,
                }
            ]  # fmt: skip
        name = f"{model}_{variant}"
        if layout != "models":  # measured at a shape point, so the sweep and its crossovers are made too
            manifest["shape"] = POINT
            name += f"@{POINT}"
        folder = root / "manifests" / toolchain
        folder.mkdir(parents=True, exist_ok=True)
        # As this version writes it: the recorded manifest's schema lifted to today's.
        parse_manifest(json.dumps(manifest), f"{folder / name}.json").write(folder / f"{name}.json")
    table = MODEL_AT_POINT if layout != "models" else 'timm = "vit_tiny_patch16_224"\nbatch_size = 4\n'
    models = dict.fromkeys(model for model, _, _ in engines)
    (root / "pipeline.toml").write_text(catalog + "".join(f"\n[models.{m}]\n{table}" for m in models))
    return len(engines)


def time_compare(catalog: Path, fmt: str) -> tuple[float, float]:
    """(seconds, peak resident MiB) of one `pipeline compare` in a fresh process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "--catalog", str(catalog), "compare", "--format", fmt],
            cwd=REPO,
            stdout=out,
            stderr=err,
            env={**os.environ, "COLUMNS": "120"},
        )
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            raise SystemExit(f"pipeline compare --format {fmt} exited {child.returncode}: {err.read().decode()}")
    return elapsed, usage.ru_maxrss / 1024  # kilobytes on Linux


def touch_one(root: Path) -> None:
    """What a profile of one engine does to the folder: one manifest rewritten."""
    path = next(next(folder for folder in sorted((root / "manifests").iterdir()) if folder.is_dir()).glob("*.json"))
    manifest = json.loads(path.read_text())
    manifest["profile"]["details"]["per_iteration_ms"][0] *= 1.01
    path.write_text(json.dumps(manifest))


def cache_states(workspace: Path, repeat: int) -> dict[tuple[str, str], float]:
    """Table and JSON, each with a cold cache, a warm one and one manifest changed: printed, and
    the median seconds of each returned by (format, state)."""
    catalog, cache = workspace / "pipeline.toml", workspace / "manifests" / ".compare-cache.json"
    medians = {}
    for fmt in ("table", "json"):
        runs: dict[str, list[tuple[float, float]]] = {"cold cache": [], "warm cache": [], "one manifest changed": []}
        for _ in range(repeat):
            cache.unlink(missing_ok=True)
            runs["cold cache"].append(time_compare(catalog, fmt))
            runs["warm cache"].append(time_compare(catalog, fmt))
            touch_one(workspace)
            runs["one manifest changed"].append(time_compare(catalog, fmt))
        for state, measured in runs.items():
            times = [seconds for seconds, _ in measured]
            peak = max(mib for _, mib in measured)
            listed = ", ".join(f"{seconds:.2f}" for seconds in times)
            medians[(fmt, state)] = statistics.median(times)
            print(f"compare --format {fmt:5} {state:21}: median {medians[(fmt, state)]:.2f} s, peak {peak:.0f} MiB (runs: {listed})")
    return medians


def growth(count: int, iterations: int, repeat: int, set_size: int, copies: bool) -> None:
    """The cold JSON compare of 3 manifests and of ``count``, in each layout, with and without rounds."""
    print(f"{'layout':10} {'rounds':6} {'3 manifests':>12} {f'{count} manifests':>16} {'ratio':>6} {'peak MiB':>9}")
    for layout in LAYOUTS:
        for rounds in (False, True):
            figures = []
            for size in (FEW, count):
                workspace = Path(tempfile.mkdtemp(prefix="bench-compare-"))
                try:
                    written = write_workspace(workspace, size, iterations, layout, rounds, set_size, copies)
                    measured = []
                    for _ in range(repeat):
                        (workspace / "manifests" / ".compare-cache.json").unlink(missing_ok=True)
                        measured.append(time_compare(workspace / "pipeline.toml", "json"))
                    figures.append((written, statistics.median(s for s, _ in measured), max(m for _, m in measured)))
                finally:
                    shutil.rmtree(workspace)
            (few, small, _), (many, large, peak) = figures
            print(
                f"{layout:10} {'yes' if rounds else 'no':6} {small:8.2f} s ({few}) {large:10.2f} s ({many}) {large / small:5.1f}× {peak:9.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifests", type=int, default=3000)
    parser.add_argument("--iterations", type=int, default=15, help="per-iteration times in each manifest (the demo records about 15)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layout", choices=LAYOUTS, default="models")
    parser.add_argument("--rounds", action="store_true", help="give each manifest the rounds record of its point's set of rounds")
    parser.add_argument("--set", type=int, default=ROUNDS_SET, help=f"engines timed together in one set of rounds (default {ROUNDS_SET})")
    parser.add_argument("--copies", action="store_true", help="every manifest of a variant with the same times, as copies of one")
    parser.add_argument("--growth", action="store_true", help="compare 3 and --manifests in every layout, with and without rounds")
    parser.add_argument("--source", action="store_true", help="do not compile the product's modules first (a run without bytecode)")
    args = parser.parse_args()
    if not args.source:
        compileall.compile_dir(REPO / "pipeline", quiet=1)
    bytecode = "imports from source" if args.source else "the product's modules compiled first"
    print(
        f"{platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
        f"{args.iterations} iterations a manifest; {bytecode}"
    )
    if args.growth:
        growth(args.manifests, args.iterations, args.repeat, args.set, args.copies)
        return
    # The same layout with 3 manifests: what a compare costs whatever the folder holds (Python's
    # start-up, the imports), against which the cost of each engine shows.
    figures = {}
    for count in dict.fromkeys((args.manifests, FEW)):
        workspace = Path(tempfile.mkdtemp(prefix="bench-compare-"))
        try:
            written = write_workspace(workspace, count, args.iterations, args.layout, args.rounds, args.set, args.copies)
            sets = f", timed in rounds in sets of {args.set}" if args.rounds else ""
            print(f"{written} manifests, layout {args.layout}{sets}{', copies of one' if args.copies else ''}")
            figures[count] = cache_states(workspace, args.repeat)
        finally:
            shutil.rmtree(workspace)
    for (fmt, state), seconds in figures[args.manifests].items():
        print(f"compare --format {fmt:5} {state:21}: {seconds / figures[FEW][(fmt, state)]:.1f}× the compare of {FEW} manifests")


if __name__ == "__main__":
    main()
