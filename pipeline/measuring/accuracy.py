"""Is the engine still accurate? Its own outputs against the FP32 PyTorch model's.

The export stage writes one fixed reference batch per variant — the seeded input it checks parity
on, in the dtype the engine takes — and the FP32 PyTorch model's outputs for it, as raw C-order
binary files: the layout trtexec's ``--loadInputs`` and ``--loadRefOutputs`` read. After timing an
engine, the profile stage has its runtime run that batch (`EngineRuntime.run_reference`) and turns
the outputs into figures here: cosine similarity, max |error|, and top-1/top-5 agreement of the
predicted classes. NaN or Inf in an engine's outputs is reported as such, never as accurate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.catalog.floor import accuracy_floor
from pipeline.running.errors import PipelineError


class AccuracyFigures(BaseModel):
    """One engine's outputs against the FP32 reference's, on the reference batch."""

    reference: str
    checked_by: str
    samples: int
    # None when an output is NaN or Inf: such an engine has no accuracy to speak of.
    cosine_similarity: float | None
    min_sample_cosine_similarity: float | None
    max_abs_error: float | None
    # The mean absolute and the mean squared difference over every output value (absent in
    # manifests written before they were recorded).
    mean_abs_error: float | None = None
    mse: float | None = None
    # None where the output is not class scores (a transformer's hidden states).
    top1_agreement: float | None
    top5_agreement: float | None
    # Top-1 accuracy against the images' labels (`--eval-dir` with ImageNet classes), and the FP32
    # model's own on the same images.
    top1_accuracy: float | None = None
    fp32_top1_accuracy: float | None = None
    nonfinite_values: int = 0
    cosine_floor: float
    # The checking tool's own verdict where it gives one (trtexec 11.1: loss = 1 - cosine).
    tool_loss: float | None = None
    tool_failed: bool | None = None
    warning: str | None = None

    @property
    def passed(self) -> bool:
        return self.warning is None


# --- the reference batch ----------------------------------------------------------------------------

# How each dtype is stored; bfloat16 has no numpy dtype, so it travels as its raw 16 bits.
_NUMPY_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "uint16", "int64": "int64", "int32": "int32"}


@dataclass(frozen=True)
class ReferenceTensor:
    name: str
    path: Path
    shape: tuple[int, ...]
    dtype: str  # torch's name: float32, float16, bfloat16

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @property
    def is_integer(self) -> bool:
        return self.dtype.startswith("int")

    def values(self):
        """The values in their own type (integers as integers), floating ones as float32."""
        return self._read(integers_as_float=False)

    def as_float32(self):
        """The values, as float32 (exact for every stored floating dtype)."""
        return self._read(integers_as_float=True)

    def _read(self, integers_as_float: bool):
        import numpy as np

        if self.dtype not in _NUMPY_DTYPES:
            raise PipelineError(
                f"reference file {self.path} has dtype {self.dtype}, which this pipeline does not read.",
                hint="re-export the engine (--force)",
            )
        try:
            raw = np.fromfile(self.path, dtype=_NUMPY_DTYPES[self.dtype])
        except OSError as exc:
            raise PipelineError(f"cannot read reference file {self.path}: {exc.strerror or exc}.", hint="re-export the engine") from exc
        expected = int(np.prod(self.shape))
        if raw.size != expected:
            raise PipelineError(
                f"reference file {self.path} holds {raw.size} {self.dtype} values; {list(self.shape)} needs {expected}.",
                hint="it was changed or cut short; re-export it: `pipeline export --force`",
            )
        if self.dtype == "bfloat16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        if self.is_integer and not integers_as_float:
            return raw.reshape(self.shape)
        return raw.astype(np.float32).reshape(self.shape)


@dataclass(frozen=True)
class ReferenceBatch:
    """The fixed inputs of one variant's engine (at one shape point, for models with several) and
    the FP32 model's outputs for them."""

    inputs: tuple[ReferenceTensor, ...]
    # None at a shape point whose FP32 reference could not be made (it did not fit in memory, or
    # its kernel faulted): the engines there are measured, their accuracy unchecked (``unchecked``).
    output: ReferenceTensor | None
    description: str
    precision: str
    sparse: bool
    # How many leading samples are distinct (images cycled to fill a batch repeat after these).
    samples: int | None = None
    # Class indices of those samples, when they are labelled images (ImageNet-1k folders).
    labels: tuple[int, ...] | None = None

    # The shape point these inputs are at ("2x512"); None for a model of one shape.
    shape: str | None = None
    # Why there is no FP32 output to check engines against at this point, where there is none.
    unchecked: str | None = None

    @property
    def input(self) -> ReferenceTensor:
        """The one input of a single-input model."""
        if len(self.inputs) != 1:
            raise PipelineError(f"the reference batch has {len(self.inputs)} inputs; this runtime feeds engines one.")
        return self.inputs[0]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {tensor.name: tensor.shape for tensor in self.inputs}

    @property
    def cosine_floor(self) -> float:
        return accuracy_floor(self.precision, self.sparse)

    @classmethod
    def from_export(cls, details, root: Path, shape: str | None = None) -> ReferenceBatch | None:
        """From an export record's details, at shape point ``shape`` for models with several;
        None for exports made before reference batches (or before that point was exported)."""
        ref = getattr(details, "reference", None)
        if not ref:
            return None

        def tensor(entry):
            return ReferenceTensor(entry["name"], Path(root) / entry["path"], tuple(entry["shape"]), entry["dtype"])

        if "points" in ref:
            point = ref["points"].get(shape)
            if point is None:
                return None
            output = tensor(point["output"]) if point.get("output") else None
            return cls(
                tuple(tensor(entry) for entry in point["inputs"]), output, ref["description"],
                details.precision, details.sparsity == "2:4", point.get("samples"), None, shape, point.get("unchecked"),
            )  # fmt: skip
        labels = tuple(ref["labels"]) if ref.get("labels") else None
        return cls(
            (tensor(ref["input"]),), tensor(ref["output"]), ref["description"], details.precision, details.sparsity == "2:4",
            ref.get("samples"), labels,
        )  # fmt: skip


def write_tensor(tensor, path: Path) -> None:
    """A torch tensor as raw C-order bytes in its own dtype (what trtexec's --loadInputs reads)."""
    import torch

    data = tensor.detach().cpu().contiguous()
    if data.dtype == torch.bfloat16:
        data = data.view(torch.int16)
    data.numpy().tofile(path)


# --- figures ------------------------------------------------------------------------------------------


def compare_outputs(
    reference, output, *, precision: str, sparse: bool, description: str, checked_by: str, samples: int | None = None, labels=None
) -> AccuracyFigures:
    """An engine's output against the FP32 reference output (arrays of the same shape), over the
    first ``samples`` samples (the distinct ones), and against ``labels`` where there are some."""
    import numpy as np

    ref, out = np.asarray(reference), np.asarray(output)
    if out.size != ref.size:
        raise PipelineError(
            f"the engine's output has {out.size} values ({list(out.shape)}); the reference has {ref.size} ({list(ref.shape)}).",
            hint="the engine and the reference batch come from different exports; rebuild it (`--force`)",
        )
    out = out.reshape(ref.shape)
    if samples is not None and ref.ndim > 1:
        ref, out = ref[:samples], out[:samples]
    samples = ref.shape[0] if ref.ndim > 1 else 1
    ref2, out2 = ref.reshape(samples, -1), out.reshape(samples, -1)
    floor = accuracy_floor(precision, sparse)
    sums = ErrorSums.of(ref2, out2)
    # Top-k agreement where the output is class scores (samples × classes), not hidden states; a
    # NaN score is the lowest, so that it is never the predicted class.
    classes = ref.ndim == 2
    scores = np.nan_to_num(np.asarray(out2, dtype=np.float64), nan=-np.inf) if classes or labels else None
    top1 = top1_agreement(ref2, scores) if classes else None
    top5 = top5_agreement(ref2, scores) if classes else None
    if sums.nonfinite:
        return AccuracyFigures(
            reference=description, checked_by=checked_by, samples=samples, cosine_similarity=None,
            min_sample_cosine_similarity=None, max_abs_error=None, top1_agreement=top1, top5_agreement=top5,
            nonfinite_values=sums.nonfinite, cosine_floor=floor,
            warning=f"{sums.nonfinite} of {out.size} output values are NaN or Inf",
        )  # fmt: skip
    cosine = float(cosines_of_sums([sums.dot.sum()], [sums.ref_sq.sum()], [sums.out_sq.sum()])[0])
    per_sample = cosines_of_sums(sums.dot, sums.ref_sq, sums.out_sq)
    figures = AccuracyFigures(
        reference=description, checked_by=checked_by, samples=samples, cosine_similarity=cosine,
        min_sample_cosine_similarity=float(np.min(per_sample)), max_abs_error=sums.abs_max,
        mean_abs_error=sums.abs_sum / ref2.size, mse=sums.sq_sum / ref2.size,
        top1_agreement=top1, top5_agreement=top5, cosine_floor=floor,
    )  # fmt: skip
    if labels:
        figures.top1_accuracy = labels_accuracy(scores, labels[:samples])
        figures.fp32_top1_accuracy = labels_accuracy(ref2, labels[:samples])
    if cosine < floor:
        figures.warning = f"cosine similarity to FP32 {cosine:.4f} is below {floor} for {precision}" + (
            " with 2:4 sparsity" if sparse else ""
        )
    return figures


@dataclass
class ErrorSums:
    """The sums every figure of compare_outputs is read from, in float64: each sample's Σ ref·out,
    Σ ref² and Σ out² (numpy arrays); over all values Σ |ref − out|, Σ (ref − out)², max |ref − out|;
    and how many output values are NaN or Inf. Summed a block of values at a time: a transformer's
    hidden states at 4×4096 are 12.6 M values, and float64 copies of both arrays and of their
    difference (fresh memory each, page by page) cost 0.9-1.3 s a check on a 2-core VM, where the
    blocks cost a twentieth of that, once a shape point and engine between the points' rounds.

    The products are summed by einsum, not by ``@``: numpy hands ``@`` of two vectors to its BLAS,
    whose threads wait on one another where every CPU is busy — as they are while a run's
    compiling processes work beside the checks of the engines prepared ahead (about 1 s a check at
    4×4096 on the lent H100's 16 vCPUs, docs/results/sweeps.md). On the 2-core VM with four busy
    processes beside it, a 4×4096 check's sums took 0.46-1.49 s by ``@`` and 0.12-0.14 s by einsum
    (0.02-0.03 s both, idle): einsum sums in this thread alone."""

    dot: Any
    ref_sq: Any
    out_sq: Any
    abs_sum: float = 0.0
    sq_sum: float = 0.0
    abs_max: float = 0.0
    nonfinite: int = 0

    BLOCK = 1 << 18  # values: 2 MiB a float64 block, reused from one to the next

    @classmethod
    def of(cls, ref2, out2) -> ErrorSums:
        import numpy as np

        samples, values = ref2.shape
        sums = cls(np.zeros(samples), np.zeros(samples), np.zeros(samples))
        with np.errstate(all="ignore"):  # a NaN output is counted, and its figures are not read
            for sample in range(samples):
                for start in range(0, values, cls.BLOCK):
                    ref = np.asarray(ref2[sample, start : start + cls.BLOCK], dtype=np.float64)
                    out = np.asarray(out2[sample, start : start + cls.BLOCK], dtype=np.float64)
                    sums.nonfinite += int(out.size - np.count_nonzero(np.isfinite(out)))
                    sums.dot[sample] += np.einsum("i,i->", ref, out)
                    sums.ref_sq[sample] += np.einsum("i,i->", ref, ref)
                    sums.out_sq[sample] += np.einsum("i,i->", out, out)
                    error = ref - out
                    sums.sq_sum += float(np.einsum("i,i->", error, error))
                    error = np.abs(error, out=error)
                    sums.abs_sum += float(error.sum())
                    sums.abs_max = max(sums.abs_max, float(error.max()) if error.size else 0.0)
        return sums


# --- the formulas --------------------------------------------------------------------------------------
# One of each, on float64 numpy arrays: the figures above, and the precision tools' on their
# evaluation batches (pipeline/precision/figures.py), which hand their torch tensors over as numpy.


def cosine_of(a, b) -> float:
    """The cosine similarity of two flat arrays; 0 where either is all zeros, NaN where one is not finite."""
    import numpy as np

    denominator = float(np.linalg.norm(a) * np.linalg.norm(b))
    with np.errstate(invalid="ignore"):  # inf / inf: NaN is the answer, not a warning
        return float(np.dot(a, b) / denominator) if denominator else 0.0


def cosines_of_sums(dot, ref_sq, out_sq):
    """Each sample's cosine from its three sums (Σ a·b, Σ a², Σ b²; numpy arrays): 0 where either
    output is all zeros, NaN where one is not finite — cosine_of, sample by sample."""
    import numpy as np

    dot, denominator = np.asarray(dot, dtype=float), np.sqrt(np.asarray(ref_sq, dtype=float) * np.asarray(out_sq, dtype=float))
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = np.where(denominator > 0, dot / np.where(denominator > 0, denominator, 1.0), 0.0)
    cosines[~np.isfinite(dot) | ~np.isfinite(denominator)] = np.nan
    return cosines


def relative_error_of(a, b) -> float:
    """‖a − b‖ / ‖a‖ over every value: infinite where the reference ``a`` is all zeros."""
    import numpy as np

    norm = float(np.linalg.norm(a))
    return float(np.linalg.norm(a - b)) / norm if norm else float("inf")


def top1_agreement(reference, scores) -> float:
    """The share of samples (rows of class scores) whose predicted class is the reference's.
    numpy's argmax takes a NaN for the highest score: callers who want otherwise pass it as −inf."""
    import numpy as np

    return float(np.mean(np.argmax(scores, axis=1) == np.argmax(reference, axis=1)))


def top5_agreement(reference, scores) -> float | None:
    """The share of samples whose reference class is among the five highest ``scores``; None
    where there are fewer than five classes."""
    import numpy as np

    if reference.shape[1] < 5:
        return None
    predicted = np.argsort(-scores, axis=1)[:, :5]
    return float(np.mean([reference[i].argmax() in predicted[i] for i in range(reference.shape[0])]))


def labels_accuracy(scores, labels) -> float:
    """The share of samples whose predicted class is their label."""
    import numpy as np

    return float(np.mean(np.argmax(scores, axis=1) == np.asarray(labels)))
