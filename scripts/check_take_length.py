"""Does a take of `take_ms` read the median a long take reads? (GPU only)

The rounds time each engine by takes of at least `take_ms` (100 ms), back to back (trtexec's way);
where every open pair is GPU-bound they no longer lengthen the takes to fill a round of a second
(docs/measurement.md, item 2). That is only sound if a 100 ms take reads what a long one reads for
every kind of engine: a take of one run does not (a CUDA graph of ModernBERT at 4×4096 read 3.5 %
faster in one-run takes than in 100 ms ones on the lent H200: GPU clocks boost in short bursts).

For each kind of engine the seed matrix times — eager PyTorch (SDPA), a CUDA graph of it,
torch.compile's default graph, and that graph captured in one CUDA graph (what the product's
torch-reduce-overhead is) — ModernBERT-base (the catalog's config, random weights) at each shape
point is timed by the product's own take (pipeline/measuring/takes.py, ``cuda_take``) in
interleaved rounds: each round, every engine in a random order takes one take of each length in a
random order. Per engine and point, each length's median of its takes' medians, and the median of
its per-round ratio to the longest take with that median's 95 % sign-test interval
(pipeline/measuring/stats.py), are printed and written to OUT/take-length.json.

    python scripts/check_take_length.py --shapes 2x2048 4x4096 --lengths 0 20 100 1000 --rounds 6 --out DIR

A length of 0 is a take of one run. The figures depend on the machine: report them with the GPU named.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

KINDS = ("eager", "cuda graph", "compiled", "compiled, captured")


def engines(torch, dtype, batch: int, sequence: int, kinds: list[str]) -> dict:
    """Each kind's run: one inference of ModernBERT-base on fixed token ids, in place."""
    from transformers import ModernBertConfig, ModernBertModel

    from pipeline.runtimes.pytorch.prepared import capture

    torch.manual_seed(0)
    model = ModernBertModel(ModernBertConfig(attn_implementation="sdpa")).eval().to("cuda", dtype)
    inputs = (torch.randint(0, 50000, (batch, sequence), device="cuda"), torch.ones((batch, sequence), dtype=torch.long, device="cuda"))
    runs = {}
    with torch.no_grad():
        if "eager" in kinds:
            runs["eager"] = lambda: model(*inputs)
        if "cuda graph" in kinds:
            runs["cuda graph"] = capture(torch, model, inputs)
        if "compiled" in kinds or "compiled, captured" in kinds:
            compiled = torch.compile(model)
            began = time.perf_counter()
            compiled(*inputs)
            print(f"  compiled at {batch}x{sequence} in {time.perf_counter() - began:.1f} s", flush=True)
            if "compiled" in kinds:
                runs["compiled"] = lambda: compiled(*inputs)
            if "compiled, captured" in kinds:
                runs["compiled, captured"] = capture(torch, compiled, inputs)
    return {kind: _no_grad(torch, run) for kind, run in runs.items()}


def _no_grad(torch, run):
    def inference():
        with torch.no_grad():
            return run()

    return inference


def measure(torch, runs: dict, lengths: list[float], rounds: int, seed: int) -> dict:
    """{kind: {length: [each round's take median]}}: every engine and length once a round, in a
    random order, as the product's rounds interleave their engines."""
    from pipeline.measuring.stats import median
    from pipeline.measuring.takes import cuda_take

    rng = random.Random(seed)
    medians: dict = {kind: {length: [] for length in lengths} for kind in runs}
    jobs = [(kind, length) for kind in runs for length in lengths]
    for _ in range(rounds):
        rng.shuffle(jobs)
        for kind, length in jobs:
            times = cuda_take(torch, runs[kind], 1, length, [], [])
            medians[kind][length].append(median(times))
    return medians


def summary(medians: dict, lengths: list[float]) -> dict:
    """Per kind and length: the median take median, and the median per-round ratio to the longest
    length's take with its 95 % sign-test interval."""
    from pipeline.measuring.stats import median, median_interval

    longest = max(lengths)
    out = {}
    for kind, by_length in medians.items():
        out[kind] = {}
        for length, values in by_length.items():
            ratios = [a / b for a, b in zip(values, by_length[longest])]
            low, high = median_interval(ratios)
            out[kind][str(length)] = {
                "median_ms": round(median(values), 4),
                "ratio_to_longest": round(median(ratios), 4),
                "interval": [round(low, 4), round(high, 4)],
            }
    return out


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--shapes", nargs="+", default=["2x2048", "4x4096"])
    parser.add_argument("--lengths", nargs="+", type=float, default=[0.0, 20.0, 100.0, 1000.0], help="take lengths in ms (0: one run)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("check_take_length: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": args.dtype, "rounds": args.rounds, "points": {}}
    for shape in args.shapes:
        batch, sequence = (int(size) for size in shape.split("x"))
        print(f"{shape}:", flush=True)
        runs = engines(torch, dtype, batch, sequence, args.kinds)
        for run in runs.values():  # warm: lazy initialisation and autotuning before any take
            run()
        torch.cuda.synchronize()
        said = summary(measure(torch, runs, args.lengths, args.rounds, args.seed), args.lengths)
        results["points"][shape] = said
        for kind, by_length in said.items():
            cells = "  ".join(
                f"{'one run' if float(length) == 0 else f'{float(length):g} ms'}: {figure['median_ms']:.3f} ({figure['ratio_to_longest']:.3f} "
                f"[{figure['interval'][0]:.3f}–{figure['interval'][1]:.3f}])"
                for length, figure in by_length.items()
            )
            print(f"  {kind:<18} {cells}", flush=True)
        del runs
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "take-length.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
