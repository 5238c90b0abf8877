"""Whether reading NVML around a take slows the compiled engine: ModernBERT bf16 at 2x512 compiled
(torch.compile's default) in one process, ten rounds, each timing in a shuffled turn a 300 ms take
(pipeline.measuring.takes.cuda_take) plain, inside the energy counter's reading (NvmlEnergy.during:
NVML every 5 ms), inside the SM clock's sampler (SmClock.during, every 20 ms), inside both as the
rounds nest them, and 300 ms of requests (issue, wait) as a stream serves them.
    python read_probe.py OUT.json [rounds]"""
import json, random, statistics, sys, time
import torch
sys.path.insert(0, "scripts"); sys.path.insert(0, ".")
from serve_by_hand import model_and_inputs, request_mask
from pipeline.measuring.takes import cuda_take
from pipeline.measuring.energy import NvmlEnergy
from pipeline.measuring.sm_clock import SmClock

TAKE_MS = 300
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
config, model = model_and_inputs(torch, "cuda", torch.bfloat16, False)
ids = torch.randint(0, config.vocab_size, (2, 512), device="cuda")
mask = request_mask(torch, 2, 512, True).cuda()
module = torch.compile(model)
energy, clock = NvmlEnergy.opened(None), SmClock()
print("energy:", getattr(energy, "why_not", None) or "read", "clock:", clock.available, flush=True)


def run():
    with torch.no_grad():
        module(input_ids=ids, attention_mask=mask)


def take():
    return statistics.median(cuda_take(torch, run, 1, TAKE_MS))


def serve():
    times = []
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < TAKE_MS:
        t = time.perf_counter_ns(); run(); torch.cuda.synchronize(); times.append((time.perf_counter_ns() - t) / 1e6)
    return statistics.median(times)


cases = {
    "plain": take,
    "energy": lambda: energy.during(take)[0],
    "clock": lambda: clock.during(take)[0],
    "both": lambda: energy.during(lambda: clock.during(take)[0])[0],
    "requests": serve,
}
for case in cases.values():
    case(); case()
rows = {case: [] for case in cases}
for r in range(ROUNDS):
    order = list(cases); random.shuffle(order)
    for case in order:
        rows[case].append(cases[case]())
for case, values in rows.items():
    ratios = sorted(v / p for v, p in zip(values, rows["plain"]))
    print(f"{case:9s} median {statistics.median(values):6.2f} ms ({min(values):.2f}-{max(values):.2f}); over plain by round: median {statistics.median(ratios):.3f} ({ratios[0]:.2f}-{ratios[-1]:.2f})", flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
