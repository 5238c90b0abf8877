"""Where a command's main thread spends its time, where py-spy cannot be installed (the lent GPU
machines reach no package index): ``python -m MODULE ARGS`` run in this interpreter with a thread
that reads the main thread's stack every INTERVAL seconds.

    python scripts/sample_stacks.py OUT INTERVAL MODULE [ARGS...]
    python scripts/sample_stacks.py /tmp/stacks-{pid}.txt 0.2 pipeline.cli run --model modernbert

Writes one line a sample to OUT (``{pid}`` in it becomes the process id, so that several commands
can share one pattern): the seconds since the start, a tab, then the stack, outermost frame first,
each frame ``folder/file.py:function:line``, joined by ``;``. Sampling costs the command one stack
walk an interval (well under a millisecond); the processes it starts are not sampled.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time


def frames(frame) -> str:
    names = []
    while frame is not None:
        code = frame.f_code
        names.append(f"{'/'.join(code.co_filename.split('/')[-2:])}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return ";".join(reversed(names))


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, interval, module, *args = sys.argv[1:]
    main_thread, started = threading.get_ident(), time.monotonic()
    sink = open(out.replace("{pid}", str(os.getpid())), "w", buffering=1)  # noqa: SIM115 — open until the process ends

    def sample() -> None:
        while True:
            time.sleep(float(interval))
            frame = sys._current_frames().get(main_thread)
            sink.write(f"{time.monotonic() - started:.2f}\t{frames(frame)}\n")

    threading.Thread(target=sample, name="stack-sampler", daemon=True).start()
    sys.argv = [module, *args]
    sys.path.insert(0, os.getcwd())  # as `python -m` finds its module
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
