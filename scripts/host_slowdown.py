"""What slows one CPU of this host while others work: the probe of pipeline/measuring/host_speed.py on one CPU,
alone and beside loads on other CPUs — busy loops (clocks, shared physical cores), memory streams
(bandwidth) — with the CPU topology, for docs/cluster.md.

    python scripts/host_slowdown.py            # prints a table; --seconds per case (default 3)

Each case: the probe's median over the case (ms) and its slowdown against the CPU alone; the
loads run in processes of their own, pinned to the CPUs the case names."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.measuring.host_speed import probe_ms  # noqa: E402


def siblings(cpu: int) -> list[int]:
    """The hardware threads sharing ``cpu``'s physical core (itself included)."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        text = path.read_text().strip()
    except OSError:
        return [cpu]
    cpus: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def _spin(cpu: int, kind: str, stop) -> None:
    os.sched_setaffinity(0, {cpu})
    if kind == "memory":
        block = bytearray(256 * 2**20)  # far beyond any cache: every pass streams from memory
        while not stop.is_set():
            block[:] = bytes(len(block)) if block[0] else b"\x01" * len(block)
    else:
        value = 0
        while not stop.is_set():
            for i in range(100_000):
                value = (value * 31 + i) & 0xFFFF


def measure(cpu: int, load_cpus: list[int], kind: str, seconds: float) -> float:
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    loads = [context.Process(target=_spin, args=(other, kind, stop), daemon=True) for other in load_cpus]
    for load in loads:
        load.start()
    time.sleep(0.5 if loads else 0.0)  # the loads under way
    os.sched_setaffinity(0, {cpu})
    probes, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds:
        probes.append(probe_ms())
    stop.set()
    for load in loads:
        load.join(5)
    return statistics.median(probes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[0]
    sibling = [c for c in siblings(cpu) if c != cpu]
    others = [c for c in cpus if c not in siblings(cpu)]
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?"
    )
    print(f"{len(cpus)} CPUs ({model}); probe on CPU {cpu}, its core's other threads: {sibling or 'none'}")
    cases = [("alone", [], "busy")]
    if sibling:
        cases.append(("its core's other thread busy", sibling, "busy"))
    for count in dict.fromkeys((1, 4, len(others) // 2, len(others))):
        if 0 < count <= len(others):
            cases.append((f"{count} other core(s) busy", others[:count], "busy"))
    if others:
        cases.append((f"{min(4, len(others))} other core(s) streaming memory", others[:4], "memory"))
    cases.append(("alone, again", [], "busy"))
    alone = None
    for name, load_cpus, kind in cases:
        median = measure(cpu, load_cpus, kind, args.seconds)
        alone = alone or median
        print(f"  {name:<40} {median:7.3f} ms  {median / alone:5.2f}x")


if __name__ == "__main__":
    main()
