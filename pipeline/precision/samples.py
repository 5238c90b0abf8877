"""Where a plan's samples come from: the search's batches and, drawn apart, the confirmation's.

One class a source, each drawing both sets and describing them for the output:

- ``Seeded``: inputs at the model's evaluated shape point, drawn with seeds that calibration
  (seed + 2 + n) and the export's reference batch (seed + 1) never use — ``SEARCH_SEED`` for what
  sensitivity and the plan's search see, ``CONFIRM_SEED`` for the confirmation;
- ``Images``: an evaluation folder's images (``--eval-dir``), each set drawn across its classes,
  with labels where the model's checkpoint gives the class folders a meaning;
- ``Tokens``: a token-id file's rows (``--eval-tokens``), drawn seeded;
- ``Hook``: a data hook's batches (``--eval-data``), dealt whole.

Each has ``batches`` (the model's inputs, by "search" and "confirm"), ``given`` (each batch as a
metric hook sees it), ``labels`` (each set's, in its batches' order, or None) and ``describe``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pipeline.precision.hooks import drawn_batches, load_hook
from pipeline.running.errors import UsageError

# Seeds of the evaluation batches, above the model's seed (calibration uses seed + 2 + n, n < 1000).
SEARCH_SEED = 1000
CONFIRM_SEED = 2000
SETS = ("search", "confirm")


class Samples:
    """The two sets of one source."""

    batches: dict[str, list[tuple]]
    labels: dict[str, list[int]] | None = None

    @property
    def given(self) -> dict[str, list]:
        """Each batch as a metric hook sees it: {"inputs", "labels"} where there are labels, else the inputs."""
        if not self.labels:
            return {which: list(batches) for which, batches in self.batches.items()}
        import torch

        given: dict[str, list] = {}
        for which, batches in self.batches.items():
            given[which], start = [], 0
            for batch in batches:
                count = batch[0].shape[0]
                given[which].append({"inputs": batch, "labels": torch.tensor(self.labels[which][start : start + count])})
                start += count
        return given

    def samples(self, which: str) -> int:
        return sum(batch[0].shape[0] for batch in self.batches[which])

    def describe(self, which: str) -> dict[str, Any]:
        raise NotImplementedError


def draw(lab, model) -> Samples:
    """The samples ``lab`` (a VariantLab being prepared) evaluates on: the catalog's evaluation
    source, one of them, else seeded inputs."""
    evaluation, source = lab.catalog.evaluation, lab.source
    named = [
        f"{what} ({value})"
        for what, value in (
            ("an evaluation folder", evaluation.directory),
            ("a data hook", evaluation.data),
            ("token ids", evaluation.tokens),
        )
        if value is not None
    ]
    if len(named) > 1:
        raise UsageError(
            f"{' and '.join(named)} are given: the samples come from one.", hint="pass one of --eval-dir, --eval-data and --eval-tokens"
        )
    if evaluation.data is not None:
        return Hook(lab, evaluation.data)
    if evaluation.tokens is not None:
        return Tokens(lab, model, source.in_workspace(evaluation.tokens))
    if evaluation.directory is not None:
        return Images(lab, model, source.in_workspace(evaluation.directory))
    return Seeded(lab, model)


class Seeded(Samples):
    def __init__(self, lab, model):
        self.seeds: dict[str, list[int]] = {}
        self.batches = {}
        for which, offset in zip(SETS, (SEARCH_SEED, CONFIRM_SEED)):
            # ``samples`` inputs at the evaluated point: one batch of them where the batch axis is
            # free (one forward per measurement: on a GPU, 16 batches of 2 took 8× as long as one
            # of 32), else batches of the model's own batch size.
            if lab.point is not None:
                seeds = [lab.spec.seed + offset]
                self.batches[which] = [lab.source.sample_inputs(model, lab.source.at_batch(lab.point, lab.samples), seeds[0])]
            else:
                seeds = [lab.spec.seed + offset + n for n in range(max(1, -(-lab.samples // lab.spec.batch_size)))]
                self.batches[which] = [lab.source.sample_inputs(model, None, seed) for seed in seeds]
            self.seeds[which] = seeds

    def describe(self, which: str) -> dict[str, Any]:
        return {"source": "seeded", "seeds": self.seeds[which], "samples": self.samples(which)}


class Hook(Samples):
    """The user's data hook, dealt whole (seeded by the model's seed + SEARCH_SEED)."""

    def __init__(self, lab, spec: str):
        self.spec, self.seed = spec, lab.spec.seed + SEARCH_SEED
        dealt = dict(zip(SETS, drawn_batches(load_hook(spec, "--eval-data", lab.catalog.root), spec, lab.samples, self.seed)))
        self.batches = {which: [batch.inputs for batch in batches] for which, batches in dealt.items()}
        self._given = {which: [batch.given for batch in batches] for which, batches in dealt.items()}

    @property
    def given(self) -> dict[str, list]:
        return self._given  # as the hook yielded them

    def describe(self, which: str) -> dict[str, Any]:
        return {
            "source": "hook",
            "seeds": None,
            "hook": self.spec,
            "seed": self.seed,
            "samples": self.samples(which),
            "batches": len(self.batches[which]),
        }


class Tokens(Samples):
    """``samples`` rows each, disjoint, drawn seeded (the model's seed + SEARCH_SEED), one batch each."""

    def __init__(self, lab, model, path: Path):
        rows = lab.source.token_rows(model, path)
        if rows < 2 * lab.samples:
            raise UsageError(
                f"token file {path} holds {rows} sequences; {lab.ref.name}'s search and its confirmation need {2 * lab.samples}: "
                f"{lab.samples} each (--samples), drawn apart so that the confirmation sees sequences the search never did.",
                hint=f"pass --samples {max(1, rows // 2)} or fewer, or a file with at least {2 * lab.samples} rows",
            )
        self.path, self.rows, self.seed = path, rows, lab.spec.seed + SEARCH_SEED
        order = random.Random(self.seed).sample(range(rows), 2 * lab.samples)
        drawn = {"search": sorted(order[: lab.samples]), "confirm": sorted(order[lab.samples :])}
        self.batches = {which: [lab.source.token_batches(model, path, drawn[which])] for which in SETS}

    def describe(self, which: str) -> dict[str, Any]:
        return {
            "source": "tokens",
            "seeds": None,
            "file": str(self.path),
            "seed": self.seed,
            "rows": self.rows,
            "samples": self.samples(which),
        }


class Images(Samples):
    """``samples`` images each, disjoint, each drawn across the folder's classes (seeded by the
    model's seed + SEARCH_SEED)."""

    def __init__(self, lab, model, directory: Path):
        from pipeline.models.images import class_counts, image_files, split_across_classes
        from pipeline.stages.export_references import image_labels

        lab.source.describe_evaluation(directory)  # a family that takes no images says so first
        files = image_files(directory, "evaluation", "--eval-dir")
        needed = 2 * lab.samples
        if len(files) < needed:
            raise UsageError(
                f"evaluation folder {directory} holds {len(files)} images; {lab.ref.name}'s search and its confirmation need "
                f"{needed}: {lab.samples} each (--samples), drawn apart so that the confirmation sees images the search never did.",
                hint=f"pass --samples {max(1, len(files) // 2)} or fewer, or a folder with at least {needed} images",
            )
        self.directory, self.seed = directory, lab.spec.seed + SEARCH_SEED
        drawn = dict(zip(SETS, split_across_classes(files, directory, (lab.samples, lab.samples), self.seed)))
        labels, self.labels_skipped = image_labels(model, directory, drawn["search"], lab.spec.checkpoint)
        if labels is not None:
            self.labels = {"search": labels, "confirm": image_labels(model, directory, drawn["confirm"], lab.spec.checkpoint)[0]}
        self.label_source = None if labels is None else _label_source(model)
        self.classes = {which: class_counts(drawn[which], directory) for which in SETS}
        self.batches = {which: lab.source.evaluation_batches(model, directory, drawn[which], lab.spec.batch_size) for which in SETS}

    def describe(self, which: str) -> dict[str, Any]:
        return {
            "source": "images",
            "seeds": None,
            "folder": str(self.directory),
            "seed": self.seed,
            "samples": self.samples(which),
            "classes": self.classes[which],
            "labels": self.label_source,
            "labels_skipped": self.labels_skipped,
        }


def _label_source(model) -> str:
    """How the class folders' names became labels (pipeline/stages/export_references.py)."""
    if getattr(model, "num_classes", None) == 1000:
        return "class folders as ImageNet-1k synsets"
    return "class folders in sorted order as the model's classes"
