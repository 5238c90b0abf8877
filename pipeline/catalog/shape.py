"""A shape point's sizes, read from its text in one place.

The catalog, the manifests, the file names and the reports write a shape point as its sizes
joined by 'x' ("2x512": batch 2, sequence 512), or "static" for the one shape of a graph without
dynamic axes. :class:`ShapeSizes` is that text parsed; what sorts, groups or plots points by
their sizes reads its attributes, not the text. It lives in the catalog, below everything that
reads points (manifest, models, report), so that each of them can import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The one shape of a graph without dynamic axes, as its shape point is named: a manifest's
# point, never one the catalog lists.
STATIC_SHAPE = "static"

# Positive sizes without leading zeros: the text is exactly what ShapeSizes.label writes back.
SHAPE_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)*$")


@dataclass(frozen=True)
class ShapeSizes:
    """The sizes of a shape point's dynamic axes, in the model's order (batch first); () for "static"."""

    sizes: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str, static: bool = True) -> ShapeSizes:
        """ "2x512" as (2, 512); "static" as () unless ``static`` is False (the catalog lists
        sizes only). Anything else is a ValueError saying how a shape is written."""
        if static and text == STATIC_SHAPE:
            return cls(())
        if not isinstance(text, str) or not SHAPE_RE.match(text):
            raise ValueError(f"{text!r} is not a shape: write the sizes of the model's dynamic axes joined by 'x', e.g. \"2x512\"")
        return cls(tuple(int(size) for size in text.split("x")))

    @property
    def label(self) -> str:
        """The text form, the one the pipeline writes: "2x512", or "static"."""
        return "x".join(str(size) for size in self.sizes) or STATIC_SHAPE

    def __str__(self) -> str:
        return self.label

    @property
    def shown(self) -> str:
        """The form the reports print: "2×512", or "static"."""
        return self.label.replace("x", "×")

    @property
    def batch(self) -> int | None:
        """The first axis's size (batch, for every family that has one); None for "static"."""
        return self.sizes[0] if self.sizes else None

    @property
    def sequence(self) -> int | None:
        """The last axis's size, the one a sweep grows (sequence, of batch × sequence and of batch ×
        frames × sequence); None where the point has no axis beside its batch."""
        return self.sizes[-1] if len(self.sizes) > 1 else None

    @property
    def held(self) -> tuple[int, ...]:
        """The sizes a sweep holds while its last axis grows: every size but the last (the batch of
        2x512, batch and frames of 2x3x8), the whole point where it has no axis beside its batch."""
        return self.sizes[:-1] if len(self.sizes) > 1 else self.sizes

    @property
    def order(self) -> tuple[int, ...]:
        """What points sort by: their sizes, the later axes first (sequence, then batch), so that
        2x512, 4x512, 2x2048 read as a sweep over the sequence; "static" first."""
        return tuple(reversed(self.sizes))


def shown(text: str | None) -> str:
    """A shape point's text as the reports print it ("2x512" as "2×512"); "" for none."""
    return text.replace("x", "×") if text else ""


def written(text: str) -> str:
    """A shape point typed as the reports print it ("2×512") or as the pipeline writes it, in the
    form the pipeline writes ("2x512"): what a user copies from a table finds its manifest."""
    return text.replace("×", "x")


def tensor_dims(text: str) -> list[int]:
    """A tensor's dimensions as TensorRT's tools write them ("1x3x224x224"; "" for a scalar): the
    same notation as a shape point's, read here too, where a shape point's sizes are."""
    return [int(size) for size in str(text).split("x") if size]
