"""Whose rounds may run beside whose on one host: the rule that keeps several GPUs of a host from
disturbing each other's measurements (`--gpus`, cluster nodes sharing a host, two runs side by side).

An engine whose time is the host's — a CPU engine, or a GPU engine whose host needs half or more
of a run's GPU time to issue it (pipeline/report/flags.py, NEAR_LAUNCH_BOUND_SHARE) — is slowed by
whatever else the host does, even with every CPU of its share its own, while a GPU-bound one is not
(measured: docs/results/cluster.md, 'Why a worker per GPU and a CPU share per point'). So a point's
rounds hold the host:

* **shared** while the point prepares its engines (loading, compiling, capturing CUDA graphs: CPU
  work that slows another point's launch-bound rounds as much as its rounds would), and while
  every engine of the point is GPU-bound — as measured in its first round — so GPU-bound points on
  several GPUs are timed at once, beside each other's preparation;
* **whole** as soon as one of them is not: the point waits for every other hold to end, starts
  its rounds again if the first one ran beside another hold, and no other point prepares or
  starts its rounds until its own end. A point that finds the host free takes it whole for its
  first round and lets go to shared after it if all its engines are GPU-bound.

Exports and builds are not held back (in a run they mostly come before the points); a
measurement they slow anyway is seen by the host's probe (pipeline/measuring/host_speed.py) and flagged
``host slowed``.

The hold is an advisory lock (``flock``) on a file under the pipeline's cache: the kernel lets go
of it when the process ends however it ends, and the processes of a host that share the cache
(PIPELINE_CACHE_DIR, else the user's cache) share it: a Ray node of its own cache keeps its own.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "host-rounds.lock"


class HostRounds:
    """The hold a point's rounds have on the host.

    >>> with HostRounds() as held:
    ...     held.share()  # prepare the engines
    ...     held.try_whole() or held.share()  # then measure, take_whole() once an engine follows the host
    """

    def __init__(self, path: Path | None = None, on_wait=None):
        from pipeline.running.cache import cache_dir

        self.path = path or cache_dir() / LOCK_FILE
        self.on_wait = on_wait  # said once when the hold must wait for another point's rounds
        self.mode: str | None = None  # None, "shared" or "whole"
        self.waited_s = 0.0
        self._fd: int | None = None

    def __enter__(self) -> HostRounds:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:  # a cache that cannot be written: the rounds run unheld, as before
            self._fd = None
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Let go of the host (a point's repeat in a process of its own holds it for itself)."""
        if self._fd is not None:
            os.close(self._fd)  # lets go of the lock
            self._fd, self.mode = None, None

    def share(self) -> None:
        """Held beside other points' GPU-bound rounds and preparation (from whole: let go to them)."""
        self._hold(fcntl.LOCK_SH, "shared")

    def take_whole(self) -> None:
        """Held alone: waits for every other hold on the host to end."""
        self._hold(fcntl.LOCK_EX, "whole")

    def try_whole(self) -> bool:
        """Held alone if nothing else holds the host now; else held as before. Whether it is."""
        if self._fd is None or self.mode == "whole":
            return self.mode == "whole"
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # flock(2): a conversion may let go of the lock held before it fails; hold it again.
            before, self.mode = self.mode, None
            if before == "shared":
                self.share()
            return False
        self.mode = "whole"
        return True

    def _hold(self, operation: int, mode: str) -> None:
        if self._fd is None or self.mode == mode:
            return
        try:
            fcntl.flock(self._fd, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            if self.on_wait is not None:
                self.on_wait("waiting for another shape point's rounds on this host to end")
            started = time.perf_counter()
            fcntl.flock(self._fd, operation)
            self.waited_s += time.perf_counter() - started
        self.mode = mode
