"""Latency statistics, computed in one place for every runtime.

ONNX Runtime timings and trtexec's ``--exportTimes`` per-iteration records both go through
:meth:`LatencyStats.from_values`, so numbers from different runtimes are comparable.
"""

from __future__ import annotations

import math
from typing import Sequence

from pydantic import BaseModel


class LatencyStats(BaseModel):
    """Summary of per-iteration times in milliseconds."""

    count: int
    min: float
    max: float
    mean: float
    median: float
    p90: float
    p95: float
    p99: float
    stdev: float
    # Coefficient of variation (stdev / mean): above a few percent the run was noisy.
    cv: float

    @classmethod
    def from_values(cls, values_ms: Sequence[float]) -> "LatencyStats":
        import numpy as np

        if len(values_ms) == 0:
            raise ValueError("cannot summarise an empty series of timings")
        values = np.asarray(values_ms, dtype=np.float64)
        mean = float(values.mean())
        # Sample standard deviation: these are samples of the engine's latency distribution.
        stdev = float(values.std(ddof=1)) if values.size > 1 else 0.0
        p90, p95, p99, median = (float(v) for v in np.percentile(values, [90, 95, 99, 50]))
        return cls(
            count=int(values.size),
            min=float(values.min()),
            max=float(values.max()),
            mean=mean,
            median=median,
            p90=p90,
            p95=p95,
            p99=p99,
            stdev=stdev,
            cv=stdev / mean if mean > 0 else math.nan,
        )
