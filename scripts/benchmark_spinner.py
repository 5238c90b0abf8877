"""What a terminal's progress spinner costs a launch-bound engine's takes, measured.

A launch-bound engine's time is the host's speed: anything else the measuring process runs
beside a take lengthens it. The reporter draws a spinner in a terminal (pipeline/running/reporting.py);
this times 100 ms takes of a launch-bound CPU workload (a 30-layer stack of small Linear layers in
eager PyTorch, one intra-op thread: its time is the interpreter and the dispatcher, as an eager
GPU model's is when the host cannot issue its kernels faster than they run) in three states, in a
shuffled order each round, so that the host's speed spells land on every state alike:

* ``plain``: nothing beside the take;
* ``status``: rich's status spinner redrawing on its own thread, as every running stage had it;
* ``measuring``: the reporter after ``measuring``, drawing its spinner between takes only, as a
  stage that measures now has it (the take's progress said once after it, as the rounds do).

    python scripts/benchmark_spinner.py --rounds 40

Prints each state's median take and the median of its paired ratios to ``plain``, with their
quartiles. The figures depend on the machine: report them with it named.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--take-ms", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    from rich.console import Console

    from pipeline.running.reporting import Reporter

    torch.set_num_threads(1)
    layers = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(30)])
    inputs = torch.randn(2, 16)

    def run() -> None:
        with torch.no_grad():
            layers(inputs)

    started = time.perf_counter()
    calls = 0
    while time.perf_counter() - started < 0.5:
        run()
        calls += 1
    per_take = max(1, round(calls * args.take_ms / 500.0))

    def take() -> float:
        begun = time.perf_counter()
        for _ in range(per_take):
            run()
        return (time.perf_counter() - begun) * 1e3

    # A terminal's console, drawing into memory: what is drawn costs what a terminal's drawing
    # costs the process, less the terminal's own work.
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    reporter = Reporter(console=console)
    states = ("plain", "status", "measuring")
    times: dict[str, list[float]] = {state: [] for state in states}
    order = random.Random(args.seed)
    for round_ in range(args.rounds):
        for state in order.sample(states, len(states)):
            if state == "plain":
                times[state].append(take())
            elif state == "status":
                with console.status(f"profile engine … round {round_}"):
                    time.sleep(0.1)  # the redrawing thread under way, as in a stage
                    times[state].append(take())
            else:
                with reporter.working("profile", "engine"):
                    reporter.measuring("1 engine(s) in rounds")
                    time.sleep(0.1)
                    times[state].append(take())
                    reporter.progress(f"round {round_}")
    print(f"{per_take} calls a take, {args.rounds} rounds")
    for state in states:
        ratios = sorted(b / a for a, b in zip(times["plain"], times[state]))
        quartiles = f"{ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f}"
        print(
            f"{state:<10} median take {statistics.median(times[state]):7.2f} ms; over plain, paired: {statistics.median(ratios):.3f} ({quartiles})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
