"""Whether the way a run is timed sets the compiled engine's speed: ModernBERT bf16 at 2x512,
torch.compile'd (default mode) and eager, timed in one process, in a shuffled turn each round, by:
  take/default   pipeline.measuring.takes.cuda_take on the default stream, the main thread (the rounds)
  take/side      the same on a stream of its own
  serve/default  issue, then wait for it (events around it, stream synchronised), the main thread
  serve/side     the same on a stream of its own (as served)
  take/worker    take/side in a long-lived worker thread
  serve/worker   serve/side in that worker thread
Each: GPU ms a run (events), host ms to issue a run (run() returning), wall ms a run.
    python take_probe.py OUT.json [rounds]"""
import contextlib, json, queue, random, statistics, sys, threading, time
import torch
sys.path.insert(0, "scripts"); sys.path.insert(0, ".")
from serve_by_hand import model_and_inputs, request_mask
from pipeline.measuring.takes import cuda_take

TAKE_MS = 300
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
config, model = model_and_inputs(torch, "cuda", torch.bfloat16, False)
ids = torch.randint(0, config.vocab_size, (2, 512), device="cuda")
mask = request_mask(torch, 2, 512, True).cuda()


def make_run(module, issues):
    def run():
        t = time.perf_counter_ns()
        with torch.no_grad():
            module(input_ids=ids, attention_mask=mask)
        issues.append((time.perf_counter_ns() - t) / 1e6)
    return run


def take(module, stream):
    issues = []
    run = make_run(module, issues)
    with (torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()):
        t0 = time.perf_counter()
        gpu = cuda_take(torch, run, 1, TAKE_MS)
        wall = (time.perf_counter() - t0) * 1e3
    return {"gpu": statistics.median(gpu), "issue": statistics.median(issues[2:] or issues), "wall": wall / len(gpu), "n": len(gpu)}


def serve(module, stream):
    issues, gpu = [], []
    run = make_run(module, issues)
    s = stream if stream is not None else torch.cuda.current_stream()
    with torch.cuda.stream(s):
        run(); s.synchronize(); issues.clear()
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < TAKE_MS:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); run(); b.record(); s.synchronize()
            gpu.append(a.elapsed_time(b))
        wall = (time.perf_counter() - t0) * 1e3
    return {"gpu": statistics.median(gpu), "issue": statistics.median(issues), "wall": wall / len(gpu), "n": len(gpu)}


jobs, answers = queue.Queue(), queue.Queue()
def worker():
    while True:
        fn = jobs.get()
        answers.put(fn())
threading.Thread(target=worker, daemon=True).start()
def in_worker(fn):
    jobs.put(fn); return answers.get()


results = {}
for name, module in (("compiled", torch.compile(model)), ("eager", model)):
    side, worker_side = torch.cuda.Stream(), in_worker(torch.cuda.Stream)
    cases = {
        "take/default": lambda: take(module, None),
        "take/side": lambda: take(module, side),
        "serve/default": lambda: serve(module, None),
        "serve/side": lambda: serve(module, side),
        "take/worker": lambda: in_worker(lambda: take(module, worker_side)),
        "serve/worker": lambda: in_worker(lambda: serve(module, worker_side)),
    }
    for case in cases.values():  # compile, and warm each thread and stream
        case(); case()
    rows = {case: [] for case in cases}
    for r in range(ROUNDS):
        order = list(cases); random.shuffle(order)
        for case in order:
            rows[case].append(cases[case]())
    results[name] = rows
    for case, takes in rows.items():
        g = [t["gpu"] for t in takes]; i = [t["issue"] for t in takes]; w = [t["wall"] for t in takes]
        print(f"{name:8s} {case:14s} gpu {statistics.median(g):6.2f} ms ({min(g):.2f}-{max(g):.2f})  issue {statistics.median(i):6.2f} ({min(i):.2f}-{max(i):.2f})  wall/run {statistics.median(w):6.2f}", flush=True)
json.dump(results, open(sys.argv[1], "w"), indent=1)
