"""Which state of a process slows a launch-bound engine: each suspect applied in a process of its
own, all timed take for take in turn, so that the host's speed spells land on every side alike.

A launch-bound engine's time is the host's speed while it ran, and the product's process timed
eager ModernBERT at 2x512 1.5-1.9x slower than a fresh by-hand process on the same machine start
(docs/results/streams.md). The product's process differs from a fresh one in what it did before its
rounds; each worker here starts fresh, builds the same model and inputs, then does one of those
things, and every worker then times the same run the same way (pipeline/measuring/takes.py,
cuda_take) when asked, in a shuffled order each round:

* ``fresh``, ``fresh-again``: nothing (the second says how far two identical processes differ);
* ``profiled``: the product's reading of a compiled engine's SDPA kernels run once around one
  inference (pipeline/runtimes/pytorch/sdpa.py, sdpa_kernels: the legacy profiler's CPU mode);
* ``kineto-profiled``: Kineto's profiler (torch.profiler, CPU activities) run once around one
  inference, as that reading was made before;
* ``profiled-teardown``: the same with TEARDOWN_CUPTI=1, which makes Kineto finalize CUPTI after
  profiling (pytorch/pytorch#144455: left attached, CUPTI slows later launches);
* ``sampled``: every take inside the SM clock's sampling thread (pipeline/measuring/sm_clock.py);
* ``watched``: the machine watch's sampling thread running throughout, as around a point's rounds
  (pipeline/measuring/machine_watch.py: /proc, PSI and NVML every half second);
* ``compiled``: a torch.compile'd reduce-overhead copy compiled and run in the process first;
* ``product``: the catalog's model prepared by the product's own eager preparation
  (pipeline/runtimes/pytorch/preparing.py), timed by its own take;
* ``product-profiled``: the same, then the product's compiled-engine reading (``profiled``) run
  once around one inference;
* ``tf32-off``: ``fresh`` with cuDNN's TF32 turned off, as the product's preparation turns it for
  a toolchain without ``tf32``;
* ``compile-hand``: torch.compile's default mode over the model, by hand, as
  scripts/serve_by_hand.py compiles it;
* ``compile-product``: the catalog's model prepared by the product's torch-compile preparation,
  in a fresh process (its SDPA kernels read under the legacy profiler, as it does);
* ``compile-unprofiled``: the same without that reading;
* ``compile-shared-cpus``: the same after the compiling processes' CPU sharing
  (pipeline/runtimes/pytorch/compile_process.py, share_cpus) for one of twelve processes;
* ``compile-forked``: the same in a process forked, as the compiling processes are, from one that
  imported what their server imports (pipeline/runtimes/pytorch/preload.py) and nothing more;
* ``compile-sampled``, ``compile-watched``: ``compile-product`` with every take inside the SM
  clock's sampling thread, or the machine watch's thread running throughout, as in a run's rounds;
* ``compile-thread``: ``compile-product`` beside a thread of its own that only wakes every 20 ms,
  as the SM clock's sampler does, and does nothing (a thread's wake-ups, not NVML's reads);
* ``compile-nvml-process``: ``compile-product`` while another process reads the SM clock through
  NVML every 20 ms (NVML's reads, not a thread of this process);
* ``compile-watched-cpu``: the machine watch without its GPU reads (``watch_gpus=False``);
* ``compile-gpu-queries``: a thread that asks NVML only the watch's two questions of processes
  (running processes, their utilisation) every half second;
* ``compile-energy``: ``compile-product`` with every take inside the energy counter's reading
  (pipeline/measuring/energy.py, NvmlEnergy: NVML read around the take and every 5 ms in it);
* ``compile-read-as-rounds``: every take inside both that reading and the SM clock's sampler, as a
  point's rounds read a take on a GPU (pipeline/measuring/rounds.py, _take);
* ``pinned-N`` (``--cpus N ...``): a fresh process held to CPU N from its start, every thread of
  it: whether where a process runs sets its speed, a CPU's speed kept from round to round.

    python scripts/check_process_state.py --shape 2x512 --rounds 8 --out DIR
    python scripts/check_process_state.py --states fresh fresh-again --cpus 0 1 8 9 --out DIR
    python scripts/check_process_state.py --states compile-product compile-product#2 compile-watched \
        compile-watched#2 --out DIR    # STATE#N: another process in that state

Writes DIR/process-state.json (every take: worker, round, median ms, the CPU it ran on) and prints
each worker's median ratio to ``fresh`` with the range of its rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATES = (
    "fresh",
    "fresh-again",
    "profiled",
    "kineto-profiled",
    "profiled-teardown",
    "sampled",
    "watched",
    "compiled",
    "product",
    "product-profiled",
    "tf32-off",
    "compile-hand",
    "compile-product",
    "compile-unprofiled",
    "compile-shared-cpus",
    "compile-forked",
    "compile-sampled",
    "compile-watched",
    "compile-thread",
    "compile-nvml-process",
    "compile-watched-cpu",
    "compile-gpu-queries",
    "compile-energy",
    "compile-read-as-rounds",
)
# How often the idle thread (compile-thread) and the other process's NVML reads (compile-nvml-process) wake.
WAKE_S = 0.02
# The states whose engine is compiled by the product's preparation: every compile-* but by hand's.
PRODUCT_COMPILED = tuple(state for state in STATES if state.startswith("compile-") and state != "compile-hand")


def _model(torch, shape: str, device: str, tiny: bool, compiled: bool = False):
    """ModernBERT as the catalog has it, on ``device``, one inference per call (``compiled``: by
    torch.compile's default mode, compiled at its first call)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import serve_by_hand

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config, model = serve_by_hand.model_and_inputs(torch, device, dtype, tiny)
    batch, sequence = (int(part) for part in shape.split("x"))
    ids = torch.randint(0, config.vocab_size, (batch, sequence), device=device)
    mask = torch.ones((batch, sequence), dtype=torch.long, device=device)
    if compiled:
        model = torch.compile(model)

    def run():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask)

    return run


def _product(torch, shape: str, device: str, backend: str = "eager"):
    """The catalog's modernbert prepared by the product's preparation for ``backend`` (eager, or
    compile: torch.compile's default mode)."""
    sys.path.insert(0, str(ROOT))
    from pipeline.models import model_source
    from pipeline.models.base import ShapePoint
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import load_catalog, spec_class
    from pipeline.runtimes.pytorch.preparing import TorchPreparation

    catalog = load_catalog(ROOT / "pipeline.toml")
    source = model_source("modernbert", catalog.models["modernbert"], ROOT)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = source.cast(source.runnable(source.create_for_weights()), dtype)
    point = ShapePoint.parse(shape, source.dynamic_axes(), "modernbert")
    # A mask of ones, as the other workers': the catalog pads (`padding = true`), which changes
    # the attention's work (measured apart: docs/results/streams.md).
    examples = tuple(
        torch.ones_like(t) if n == "attention_mask" else t for n, t in zip(source.spec.inputs, source.sample_inputs(model, point, 0))
    )
    spec = spec_class("torch").model_validate({"kind": "torch", "backend": backend})
    return TorchPreparation(spec, Reporter()).prepare(model, examples, dtype, device, (0, 0, 0), shape)


def worker(state: str, shape: str, device: str, tiny: bool, take_ms: float, channel) -> None:
    state = state.split("#")[0]  # "compile-watched#2": a second process in that state
    if state.startswith("pinned-"):  # before torch starts a thread: all of them there
        os.sched_setaffinity(0, {int(state.removeprefix("pinned-"))})
    if state == "profiled-teardown":
        os.environ["TEARDOWN_CUPTI"] = "1"
    sys.path.insert(0, str(ROOT))
    if state == "compile-forked" and _forked_from_a_server():
        return  # the server, once its fork has ended
    import torch

    from pipeline.measuring.takes import cuda_take, host_take

    if state == "tf32-off":
        torch.backends.cudnn.allow_tf32 = False
    if state == "compile-shared-cpus":
        from pipeline.runtimes.pytorch.compile_process import share_cpus
        from pipeline.runtimes.pytorch.compile_sizing import compile_threads, usable_cpus

        share_cpus(compile_threads(usable_cpus(), 12), gpu=device == "cuda")
    if state == "compile-unprofiled":
        import pipeline.runtimes.pytorch.preparing as preparing

        preparing.sdpa_kernels = lambda torch, run: []
    prepared = None
    if state.startswith("product"):
        prepared = _product(torch, shape, device)
    elif state in PRODUCT_COMPILED:
        prepared = _product(torch, shape, device, "compile")
    run = prepared.run if prepared is not None else _model(torch, shape, device, tiny, compiled=state == "compile-hand")
    for _ in range(5):
        run()
    if state in ("profiled", "product-profiled"):
        from pipeline.runtimes.pytorch.sdpa import sdpa_kernels

        sdpa_kernels(torch, run)
    if state in ("kineto-profiled", "profiled-teardown"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            run()
    if state == "compiled":
        compiled = torch.compile(_model(torch, shape, device, tiny), mode="reduce-overhead")
        for _ in range(3):
            compiled()
    clock = energy = None
    if state in ("sampled", "compile-sampled", "compile-read-as-rounds"):
        from pipeline.measuring.sm_clock import SmClock

        clock = SmClock()
        clock = clock if clock.available else None
    if state in ("compile-energy", "compile-read-as-rounds"):
        from pipeline.measuring.energy import NvmlEnergy

        energy = NvmlEnergy.opened(None)
        energy = None if getattr(energy, "why_not", None) else energy  # no NVML here: plain takes

    def take() -> list[float]:
        if prepared is not None:
            return prepared.take(1, take_ms)
        if device == "cuda":
            return cuda_take(torch, run, 1, take_ms)
        return host_take(run, 1, take_ms)

    reading = None
    if state == "compile-thread":
        threading.Thread(target=_idle_wakeups, name="idle", daemon=True).start()
    if state == "compile-nvml-process":
        reader = f"import time, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)\nwhile True: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM); time.sleep({WAKE_S})"
        reading = subprocess.Popen([sys.executable, "-c", reader])
    if state in ("watched", "compile-watched", "compile-watched-cpu"):
        from pipeline.measuring.machine_watch import MachineWatch

        MachineWatch(watch_gpus=state != "compile-watched-cpu").__enter__()  # for the process's life
    if state == "compile-gpu-queries":
        threading.Thread(target=_gpu_queries, name="gpu-queries", daemon=True).start()
    channel.send("ready")

    def read_take() -> list[float]:  # the energy reading outermost, as the rounds nest them
        sampled = (lambda: clock.during(take)[0]) if clock is not None else take
        return energy.during(sampled)[0] if energy is not None else sampled()

    while channel.recv():
        times = read_take()
        channel.send((statistics.median(times), _cpu()))
    if reading is not None:
        reading.kill()
    if state == "compile-forked":
        os._exit(0)  # the fork: its server waits for it and ends


def _cpu() -> int | None:
    """The CPU this thread last ran on (/proc/thread-self/stat, field 39)."""
    try:
        return int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def _gpu_queries() -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    since_us = int(time.time() * 1e6)
    while True:
        time.sleep(0.5)
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        try:
            pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except pynvml.NVMLError:
            pass
        since_us = int(time.time() * 1e6)


def _idle_wakeups() -> None:
    while True:
        time.sleep(WAKE_S)


def _forked_from_a_server() -> bool:
    """Import what the compiling processes' server imports (no CUDA), fork, and in the server wait
    for the fork (True); in the fork, False: it goes on as a worker."""
    import pipeline.runtimes.pytorch.preload  # noqa: F401

    pid = os.fork()
    if pid == 0:
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # the server's alone (preload.py)
        return False
    os.waitpid(pid, 0)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2x512")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--take-ms", type=float, default=500.0)
    parser.add_argument("--states", nargs="+", default=list(STATES), help="a state, or STATE#N for another process in it")
    parser.add_argument("--cpus", nargs="*", type=int, default=[], help="a fresh process held to each of these CPUs (pinned-N)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a small ModernBERT (the script's own test on a CPU)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    unknown = [state for state in args.states if state.split("#")[0] not in STATES]
    if unknown:
        parser.error(f"unknown states {unknown}; known: {', '.join(STATES)}")
    context = multiprocessing.get_context("spawn")
    workers = {}
    for state in [*args.states, *(f"pinned-{cpu}" for cpu in args.cpus)]:
        ours, theirs = context.Pipe()
        process = context.Process(target=worker, args=(state, args.shape, args.device, args.tiny, args.take_ms, theirs), daemon=True)
        process.start()
        workers[state] = (process, ours)
    for state, (_, channel) in workers.items():
        if not channel.poll(600) or channel.recv() != "ready":
            print(f"{state}: the worker did not get ready", file=sys.stderr)
            return 1
    rng = random.Random(0)
    takes = []
    for round_ in range(args.rounds):
        order = list(workers)
        rng.shuffle(order)
        for position, state in enumerate(order):
            started = time.perf_counter()
            workers[state][1].send(True)
            median_ms, cpu = workers[state][1].recv()
            takes.append(
                {
                    "state": state,
                    "round": round_,
                    "order": position,
                    "median_ms": median_ms,
                    "cpu": cpu,
                    "wall_s": time.perf_counter() - started,
                }
            )
        print(f"round {round_ + 1}: " + ", ".join(f"{t['state']} {t['median_ms']:.2f}" for t in takes[-len(order) :]), flush=True)
    for process, channel in workers.values():
        channel.send(False)
        process.join(30)
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"shape": args.shape, "device": args.device, "cpus_of_cores": _cores(), "takes": takes}
    (args.out / "process-state.json").write_text(json.dumps(document, indent=1))
    by = {(t["state"], t["round"]): t["median_ms"] for t in takes}
    print(f"\n{args.shape}, each state's take median over fresh's in the same round (median [range] of {args.rounds} rounds):")
    for state in workers:
        ratios = [by[state, r] / by["fresh", r] for r in range(args.rounds)] if "fresh" in workers else []
        medians = [by[state, r] for r in range(args.rounds)]
        ratio = f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]" if ratios else "-"
        cpus = " ".join(str(t["cpu"]) for t in takes if t["state"] == state)
        print(f"  {state:22s} {statistics.median(medians):8.3f} ms   {ratio}   on CPUs {cpus}")
    return 0


def _cores() -> dict[str, list[int]]:
    """Each core's CPUs (a vCPU's sibling shares its core), from sysfs; empty where it says none."""
    cores: dict[str, list[int]] = {}
    for topology in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology")):
        try:
            key = f"{(topology / 'physical_package_id').read_text().strip()}/{(topology / 'core_id').read_text().strip()}"
        except OSError:
            continue
        cores.setdefault(key, []).append(int(topology.parent.name.removeprefix("cpu")))
    return {key: sorted(cpus) for key, cpus in cores.items()}


if __name__ == "__main__":
    sys.exit(main())
