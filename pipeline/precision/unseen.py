"""What a plan's samples cannot see: a failure on so small a share of the inputs that n samples
likely hold none of it.

A bound from n samples speaks for errors frequent enough to appear in them. Where a few inputs in a
hundred carry errors tens of times the others', most draws of 32 hold none of them, and a bound of
the cosine over the set then claims more than the model keeps on every input (docs/bounds.md
measures how often). What no count of n samples can rule out is said exactly: none failing in n
rules out, at 95 %, only failures on more than 1 − 0.05^(1/n) of the inputs — about 3 in n (the
exact binomial bound of 0 in n: 8.9 % at 32, 1.0 % at 299); and a failure on a share r of the
inputs is in at least one of n samples with a 95 % chance only from n ≥ ln 0.05 / ln(1 − r) (299 at
1 %, 2995 at 0.1 %). A floor each input must keep (``--floor sample-cos=…@…``) is held to exactly
that bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.precision.floor_bound import ALPHA, CONFIDENCE

# The shares of inputs a plan says the samples for, beside its per-sample floor's.
RATES = (0.01, 0.001)


@dataclass(frozen=True)
class Unseen:
    """What ``samples`` cannot see: the rarest failure none of them failing rules out, and how
    many samples would see a failure on each of a few shares of the inputs."""

    samples: int
    rarest_ruled_out: float  # 1 − ALPHA^(1/n): a share of failing inputs above it, none in n is unlikely
    samples_to_see: tuple[tuple[float, int], ...]  # (share of inputs, samples that hold one with CONFIDENCE)

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "confidence": CONFIDENCE,
            "rarest_ruled_out": self.rarest_ruled_out,
            "samples_to_see": [{"rate": rate, "samples": needed} for rate, needed in self.samples_to_see],
        }

    def said(self) -> str:
        """ "32 samples can miss a failure on up to 8.9% of inputs (about 3 in 32): none failing in
        them rules out, at 95%, only failures on more; 299 samples would see one on 1% of inputs,
        2995 one on 0.1%, each with a 95% chance"."""
        about = self.rarest_ruled_out * self.samples
        (rate, needed), *others = self.samples_to_see
        seen = f"{needed} samples would see one on {_share(rate)} of inputs" + "".join(
            f", {more} one on {_share(share)}" for share, more in others
        )
        return (
            f"{self.samples} samples can miss a failure on up to {_share(self.rarest_ruled_out)} of inputs (about {about:.0f} in "
            f"{self.samples}): none failing in them rules out, at {CONFIDENCE:.0%}, only failures on more; {seen}, each with a "
            f"{CONFIDENCE:.0%} chance"
        )


def _share(rate: float) -> str:
    return f"{100 * rate:.2g}%"


def rarest_ruled_out(samples: int) -> float:
    """The share of failing inputs above which none failing in ``samples`` happens less than one
    time in twenty: the exact (Clopper–Pearson) upper bound of 0 in n."""
    return 1.0 - ALPHA ** (1.0 / samples)


def samples_to_see(rate: float) -> int:
    """The fewest samples that hold at least one input of a share ``rate`` with a CONFIDENCE chance."""
    return math.ceil(math.log(ALPHA) / math.log1p(-rate) - 1e-9)


def unseen(samples: int, floor) -> Unseen:
    """What ``samples`` cannot see, with the samples to see the share ``floor``'s per-sample floor
    allows (its share of inputs that need not keep it) beside ``RATES``."""
    allowed = [1.0 - share for _, _, share in floor.per_sample if share < 1.0]
    rates = sorted({round(rate, 12) for rate in (*allowed, *RATES)}, reverse=True)
    return Unseen(samples, rarest_ruled_out(samples), tuple((rate, samples_to_see(rate)) for rate in rates))
