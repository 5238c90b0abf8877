"""The wall time of each part of an export, recorded so that a slow export can be explained."""

from __future__ import annotations


class Phases:
    """Wall time of each part of an export, recorded so slow exports can be explained; the part
    under way is shown beside the stage's spinner."""

    def __init__(self, reporter=None):
        self.seconds: dict[str, float] = {}
        self.reporter = reporter

    def __call__(self, name: str):
        import contextlib
        import time

        @contextlib.contextmanager
        def timed():
            if self.reporter is not None:
                self.reporter.step(name.replace("_", " "))
            start = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)

        return timed()
