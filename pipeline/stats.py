"""Latency statistics, computed in one place for every runtime.

ONNX Runtime timings and trtexec's ``--exportTimes`` per-iteration records both go through
:meth:`LatencyStats.from_values`, so numbers from different runtimes are comparable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
    def from_values(cls, values_ms: Sequence[float]) -> LatencyStats:
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


def _resampled_medians(values_ms: Sequence[float], rng, resamples: int):
    import numpy as np

    values = np.asarray(values_ms, dtype=np.float64)
    return np.median(rng.choice(values, size=(resamples, values.size), replace=True), axis=1)


def _interval(samples, confidence: float) -> tuple[float, float]:
    import numpy as np

    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_median_ci(values_ms: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Confidence interval of the median by resampling the per-iteration times."""
    import numpy as np

    return _interval(_resampled_medians(values_ms, np.random.default_rng(seed), resamples), confidence)


def median_difference_ci(
    new_ms: Sequence[float], old_ms: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Confidence interval of median(new) - median(old); excluding 0 means the change is real."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return _interval(_resampled_medians(new_ms, rng, resamples) - _resampled_medians(old_ms, rng, resamples), confidence)
