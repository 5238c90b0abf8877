"""A GPU's energy counter and power, sampled by a process of its own: the independent reading the
product's energy per inference is checked against (GPU only).

Every ``--period-ms`` it appends one line to OUT: epoch seconds, NVML's total energy counter in
millijoules (nvmlDeviceGetTotalEnergyConsumption: energy since the driver was loaded, Volta and
later) and NVML's power reading in milliwatts (nvmlDeviceGetPowerUsage), until it is sent SIGTERM
or SIGINT. The energy over any span [t0, t1] is then the counter's difference between the samples
that bracket it, interpolated; ``--span T0 T1 FILE`` prints it (and the mean power × time over the
same span, the reading `nvidia-smi --query-gpu=power.draw` gives).

    python scripts/sample_gpu_power.py --out power.csv --period-ms 50 &    # … run …; kill %1
    python scripts/sample_gpu_power.py --span 1796433839.1 1796433843.1 power.csv

Both figures are the whole GPU's, whatever process draws it.
"""

from __future__ import annotations

import argparse
import bisect
import signal
import sys
import time
from pathlib import Path


def sample(out: Path, period_ms: float, gpu_index: int) -> int:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    with out.open("a") as file:
        while not stop:
            now = time.time()
            energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            power = pynvml.nvmlDeviceGetPowerUsage(handle)
            file.write(f"{now:.6f},{energy},{power}\n")
            file.flush()
            time.sleep(max(0.0, period_ms / 1e3 - (time.time() - now)))
    pynvml.nvmlShutdown()
    return 0


def read(path: Path) -> list[tuple[float, float, float]]:
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split(",")
        if len(parts) == 3:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2])))
    return rows


def energy_over(rows: list[tuple[float, float, float]], start: float, end: float) -> tuple[float, float]:
    """(joules by the counter, joules by mean power × time) over [start, end]; the counter
    interpolated linearly between the samples either side of each end."""
    times = [row[0] for row in rows]
    if not rows or start < times[0] or end > times[-1]:
        raise ValueError(f"the samples span {times[0] if rows else '-'}–{times[-1] if rows else '-'}, not {start}–{end}")

    def counter_at(t: float) -> float:
        i = max(1, bisect.bisect_left(times, t))
        (t0, e0, _), (t1, e1, _) = rows[i - 1], rows[i]
        return e0 + (e1 - e0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)

    inside = [row[2] for row in rows if start <= row[0] <= end]
    mean_power_mw = sum(inside) / len(inside) if inside else float("nan")
    return (counter_at(end) - counter_at(start)) / 1e3, mean_power_mw / 1e3 * (end - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="sample into this file until SIGTERM/SIGINT")
    parser.add_argument("--period-ms", type=float, default=50.0)
    parser.add_argument("--gpu", type=int, default=0, help="NVML's index of the GPU")
    parser.add_argument("--span", nargs=3, metavar=("T0", "T1", "FILE"), help="the energy over [T0, T1] in FILE's samples")
    args = parser.parse_args(argv)
    if args.span:
        counter, power = energy_over(read(Path(args.span[2])), float(args.span[0]), float(args.span[1]))
        print(f"{counter:.3f} J by the counter, {power:.3f} J by mean power × time")
        return 0
    if not args.out:
        parser.error("give --out FILE to sample, or --span T0 T1 FILE to read")
    return sample(args.out, args.period_ms, args.gpu)


if __name__ == "__main__":
    sys.exit(main())
