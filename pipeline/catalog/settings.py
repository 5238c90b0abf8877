"""The catalog's settings tables (`[profile]`, `[calibration]`, `[evaluation]`, `[defaults]`,
`[cluster]`): how to measure, what to calibrate and evaluate on, what runs by default. The catalog
itself (pipeline/catalog/schema.py) holds the models, variants and toolchains they apply to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

# The most concurrent streams a profile serves: each is a thread (or a process) of the host.
MAX_STREAMS = 256
# What a verdict may rank engines by ([profile] by, --by): the median, a percentile of the
# per-iteration times, bounded by the takes (docs/tails.md), or energy per inference, paired round
# by round as the median is (docs/energy.md). pipeline/measuring/ranking.py holds how each is
# compared; this list is here because the catalog cannot import that package.
RANKED_BY = ("median", "p90", "p99", "energy")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileSettings(_Strict):
    """How long to measure. Same meaning as trtexec's --warmUp/--iterations/--duration."""

    warmup_ms: float = Field(default=200.0, ge=0)
    iterations: int = Field(default=10, ge=1)  # a minimum, like trtexec
    duration_s: float = Field(default=3.0, ge=0)  # also a minimum: both bounds must be met
    # Whole measurements per profile, each with its own warm-up. The row's figures pool the runs of
    # all of them; each one's median is kept too, and their spread says how repeatable the number is.
    repeats: int = Field(default=1, ge=1, le=100)
    # With repeats > 1: when the measurements' medians disagree by more than this coefficient of
    # variation, they are all taken again, up to `retakes` times; a profile that never settles is
    # recorded as unstable rather than measured.
    max_repeat_cv: float = Field(default=0.02, gt=0)
    retakes: int = Field(default=2, ge=0, le=10)
    # The CPUs the measuring process runs on while it measures (Linux sched_setaffinity), and every
    # process it starts then. A launch-bound GPU measurement is the host's speed, which one pinned
    # core keeps steadier than the OS's scheduling (measured: docs/results/sweeps.md, 'Measured on the
    # lent H100'). None: wherever the OS schedules it.
    host_cpus: tuple[int, ...] | None = Field(default=None, min_length=1)
    # Paired rounds (pipeline/measuring/rounds.py): at a shape point every engine runs one take per round
    # — at least `take_runs` inferences and `take_ms` milliseconds; for trtexec and TensorRT-RTX a
    # short run of the tool — in a seeded random order, until each comparison the verdict needs is
    # decided (its ratio's interval excludes 1, or lies within the tie band) after at least
    # `min_rounds` rounds, or `budget_s` seconds are spent. `warmup_ms`, `iterations` and
    # `duration_s` bound a trtexec or TensorRT-RTX engine measured alone (one whole run of its tool).
    # A take is short because a point's rounds cost take_ms × engines × rounds, and the sign test
    # needs six rounds however long a take is: what decides is how many rounds agree, not how long
    # each take ran (measured: docs/results/sweeps.md, 'Every point compiled side by side').
    # One run at least: an engine slower than take_ms (eager attention at 4x4096, 294 ms) is not
    # run three times in every round.
    take_ms: float = Field(default=100.0, gt=0, le=60_000)
    take_runs: int = Field(default=1, ge=1, le=100_000)
    # A round of several engines lasts at least this long, its takes lengthened to fill it (a point
    # of two engines: 500 ms takes). Rounds much shorter than a host's speed spells (0.5-4 s on the
    # lent GPUs) follow one another inside one spell, and six of them agreeing says only the spell:
    # with 100 ms takes, two equal engines, one launch-bound, were called different at 17 % of
    # points in the simulation of the rule (docs/confidence.md), at 0 % with one-second rounds.
    # 0: takes of take_ms whatever the round.
    round_ms: float = Field(default=1000.0, ge=0, le=600_000)
    min_rounds: int = Field(default=6, ge=2, le=10_000)
    budget_s: float = Field(default=30.0, gt=0, le=86_400)
    tie: float = Field(default=0.03, gt=0, lt=0.5)
    # Racing (pipeline/measuring/stopping.py): an engine the point's leader is faster than beyond the tie
    # band leaves the point's rounds, which go on timing the contenders; false (`--no-racing`):
    # every engine takes part in every round, as before racing.
    racing: bool = True
    # Serving (docs/streams.md): after a point's rounds, each engine serves this many concurrent
    # streams, each stream its own inputs, for `serve_s` seconds at each count; its
    # inferences/s and its requests' latency are kept per count. [1] alone: no serving, the rounds'
    # figures are the one stream's.
    streams: tuple[int, ...] = (1,)
    serve_s: float = Field(default=2.0, gt=0, le=3_600)
    # Each count's `serve_s` is served in this many takes, in rounds: every round serves each engine
    # of the point at each count once, in a seeded random order, and a count's figures pool its
    # takes. A launch-bound engine serves at the host's speed, which changes in spells of seconds on
    # the lent GPU machines: one take a count read a spell, takes spread over the point's serving
    # read every engine across the same spells (docs/streams.md, 'The host's spells'). 1: one take a
    # count, engine after engine.
    serve_rounds: int = Field(default=4, ge=1, le=1_000)

    @field_validator("streams")
    @classmethod
    def _stream_counts(cls, streams: tuple[int, ...]) -> tuple[int, ...]:
        if not streams or any(count < 1 or count > MAX_STREAMS for count in streams):
            raise ValueError(f"{list(streams)}: give stream counts from 1 to {MAX_STREAMS}, e.g. [1, 2, 4]")
        if len(set(streams)) != len(streams):
            raise ValueError(f"{list(streams)}: each stream count once")
        return tuple(sorted(streams))

    @property
    def serves(self) -> bool:
        """Whether a profile serves concurrent streams after its rounds (any count but [1])."""
        return self.streams != (1,)

    # What the rounds stop on and the verdict ranks by (RANKED_BY): "p99" runs the rounds until
    # every engine's p99 interval tells the leader from the rest, or budget_s is spent (a p99 of
    # two engines needs 437 takes: raise budget_s and min_rounds with it, docs/tails.md).
    by: str = "median"

    @field_validator("by")
    @classmethod
    def _a_ranking(cls, by: str) -> str:
        if by not in RANKED_BY:
            raise ValueError(f"by = {by!r} is no ranking; use one of {', '.join(RANKED_BY)}")
        return by

    # Energy per inference (docs/energy.md): read around each take only where asked, since reading
    # it lengthens a GPU's takes until NVML's coarse counter resolves (up to 4 s each) and polls that
    # counter beside every take, which slows a run and may perturb a launch-bound engine's timing.
    # Ranking by energy (by = "energy") reads it whatever this says.
    energy: StrictBool = False

    @property
    def reads_energy(self) -> bool:
        """Whether the rounds read energy around each take: where asked, or ranked by."""
        return self.energy or self.by == "energy"

    @field_validator("host_cpus")
    @classmethod
    def _cpu_numbers(cls, cpus: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if cpus is not None and any(cpu < 0 for cpu in cpus):
            raise ValueError("CPU numbers start at 0")
        return cpus


class CalibrationSettings(_Strict):
    """Inputs for quantization calibration, sparsegpt, and the accuracy proxy."""

    # None: synthetic inputs (standard normal). A folder: its images through timm's transforms.
    directory: Path | None = None
    samples: int = Field(default=32, ge=1)
    batch_size: int = Field(default=8, ge=1)


class EvaluationSettings(_Strict):
    """Real images for the accuracy check (`--eval-dir`): the reference batch comes from them."""

    # None: a seeded random batch. A folder (ImageFolder layout): a batch's worth of its images
    # drawn across its classes, seeded (pipeline/models/images.py); also `sensitivity`'s and `plan`'s.
    directory: Path | None = None
    # `sensitivity` and `plan` only (pipeline/precision/hooks.py): the user's data, a function
    # ("FILE.py:FUNCTION") yielding batches of the model's inputs, in place of images or seeded
    # inputs; and the user's metric, FUNCTION(outputs, batch) -> float, higher better.
    data: str | None = None
    metric: str | None = None
    # `sensitivity` and `plan` only: a transformer's token ids (.npy, one sequence per row, as
    # calibration_tokens) in place of seeded ones.
    tokens: Path | None = None


class Defaults(_Strict):
    """What `pipeline run` does when nothing is selected: the demo on the embedded runtime."""

    models: tuple[str, ...] = ("vit_tiny",)
    variants: tuple[str, ...] = ("fp32", "fp16", "int8")
    toolchain: str = "onnxruntime"

    @classmethod
    def filled_in(cls, catalog: Any) -> Any:
        """A raw catalog with what its [defaults] leaves unwritten: the demo's (vit_tiny as fp32,
        fp16 and int8 on onnxruntime) where the catalog defines them, else what it has — its
        models, its variants, its first toolchain — so that a catalog of one's own needs no
        [defaults] to be valid."""
        if not isinstance(catalog, dict) or not isinstance(catalog.get("defaults", {}), dict):
            return catalog
        tables = {key: catalog.get(key) if isinstance(catalog.get(key), dict) else {} for key in ("models", "variants", "toolchains")}
        written, demo = dict(catalog.get("defaults", {})), cls()
        if "models" not in written:
            written["models"] = [name for name in demo.models if name in tables["models"]] or list(tables["models"])
        if "variants" not in written:
            written["variants"] = [name for name in demo.variants if name in tables["variants"]] or list(tables["variants"])
        if "toolchain" not in written and tables["toolchains"] and demo.toolchain not in tables["toolchains"]:
            written["toolchain"] = next(iter(tables["toolchains"]))
        return {**catalog, "defaults": written}


class ClusterSettings(_Strict):
    """What a cluster run (`--cluster`) needs to know beyond what Ray tells it."""

    # Compute capability of GPU types the built-in table (pipeline/cluster/gpus.py) lacks, by the
    # name nodes advertise them under: {"RTX-PRO-6000" = "12.0"}. Used to pick, per toolchain, the
    # GPU types it can build for and time on.
    gpu_types: dict[str, str] = {}
