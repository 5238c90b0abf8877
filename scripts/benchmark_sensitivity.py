"""How long `pipeline sensitivity` takes, and where the time goes: the figures of docs/results/precision.md.

    python scripts/benchmark_sensitivity.py [--engine vit_tiny_int8] [--samples 32] [--out result.json]

Runs the analysis in this process, as `pipeline sensitivity --format json` does, on the catalog
found from here (pipeline.toml), and prints the machine, the whole command's seconds and the
analysis' own split (creating and calibrating the model, measuring the layers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs"


def main() -> int:
    from pipeline.cli import main as pipeline

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", action="append", default=[])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for engine in args.engine or ["vit_tiny_int8"]:
            out = Path(scratch) / f"{engine}.json"
            started = time.perf_counter()
            code = pipeline(["sensitivity", "--engine", engine, "--samples", str(args.samples), "--format", "json", "--out", str(out)])
            seconds = time.perf_counter() - started
            if code != 0:
                return code
            document = json.loads(out.read_text())
            result = {
                "engine": engine,
                "machine": machine(),
                "layers": len(document["layers"]),
                "samples": document["evaluation"]["search"]["samples"],
                "command_s": round(seconds, 1),
                **document["evaluation"]["timings_s"],
            }
            results.append(result)
            print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
