"""Where a serving thread's first request's time goes: ModernBERT bf16 at 2x512, eager and
compiled, each case three times with a fresh stream and inputs. Prints and writes JSON."""
import json, statistics, sys, threading, time
import torch
sys.path.insert(0, "scripts")
from serve_by_hand import model_and_inputs, request_mask

config, model = model_and_inputs(torch, "cuda", torch.bfloat16, False)
modules = {"eager": model, "compiled": torch.compile(model)}

def make(module, stream):
    ids = torch.randint(0, config.vocab_size, (2, 512), device="cuda")
    mask = request_mask(torch, 2, 512, True).cuda()
    def run():
        with torch.cuda.stream(stream), torch.no_grad():
            module(input_ids=ids, attention_mask=mask)
        stream.synchronize()
    return run

def timed(run):
    t = time.perf_counter(); run(); return round((time.perf_counter() - t) * 1e3, 3)

def in_thread(fn):
    out = []; t = threading.Thread(target=lambda: out.append(fn())); t.start(); t.join(); return out[0]

results = {}
for name, module in modules.items():
    for _ in range(3):
        make(module, torch.cuda.Stream())()  # compiled: compile here, not in a case
    cases = {}
    for rep in range(3):
        s = torch.cuda.Stream(); run = make(module, s); run(); run()
        cases.setdefault("main thread, warmed stream", []).append([timed(run) for _ in range(3)])
        cases.setdefault("new thread, stream warmed in main (as served before)", []).append(in_thread(lambda: [timed(run) for _ in range(3)]))
        cases.setdefault("another new thread, same stream", []).append(in_thread(lambda: [timed(run) for _ in range(3)]))
        s2 = torch.cuda.Stream(); run2 = make(module, s2)
        cases.setdefault("main thread, new stream", []).append([timed(run2) for _ in range(3)])
        s3 = torch.cuda.Stream(); run3 = make(module, s3)
        cases.setdefault("new thread, new stream, warmed in the thread (as served now)", []).append(in_thread(lambda: (run3(), [timed(run3) for _ in range(3)])[1]))
        s4 = torch.cuda.Stream(); run4 = make(module, s4)
        cases.setdefault("new thread, new stream, nothing warmed", []).append(in_thread(lambda: [timed(run4) for _ in range(3)]))
    results[name] = cases
    for case, reps in cases.items():
        print(f"{name:9s} {case:62s} first {[r[0] for r in reps]} then median {statistics.median(x for r in reps for x in r[1:]):.2f} ms")
json.dump(results, open(sys.argv[1], "w"), indent=1)
