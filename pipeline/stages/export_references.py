"""The reference an export leaves for every engine of its variant: the batch each engine is checked
on (seeded inputs, or images of the evaluation folder with their labels) and the FP32 PyTorch
model's outputs for it, written beside the ONNX — one batch for a model of one shape, one per shape
point otherwise. The profile stage (pipeline/measuring/accuracy.py) reads them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.models.images import class_counts, image_class, image_files, load_images, sample_across_classes
from pipeline.running.files import atomic_output


def reference_batch(model, sample, directory: Path | None, seed: int, checkpoint) -> tuple[Any, dict[str, Any]]:
    """The batch every engine is checked on, and what it is: ``sample`` (seeded random, by
    ``seed``), or a batch's worth of the evaluation folder's images drawn across its classes by
    ``seed`` (cycled to fill the batch) with their labels where the model's ``checkpoint`` gives its
    classes a meaning."""
    batch = sample.shape[0]
    if directory is None:
        seeded = f"the FP32 PyTorch model on a seeded random batch (seed {seed})"
        return sample, {"description": seeded, "samples": batch}
    drawn = sample_across_classes(image_files(directory, "evaluation", "--eval-dir"), directory, batch, seed)
    unique = len(drawn)
    chosen = [drawn[i % unique] for i in range(batch)]
    images = load_images(model, chosen, tuple(sample.shape[1:]), "evaluation")
    classes = class_counts(drawn, directory)
    facts: dict[str, Any] = {
        "description": f"the FP32 PyTorch model on {unique} images from {directory}, drawn across its {len(classes)} "
        f"class(es) (seed {seed}; timm's evaluation preprocessing"
        + (f"; repeated to fill the batch of {batch})" if unique < batch else ")"),
        "samples": unique,
        "images": [str(path.relative_to(directory)) for path in drawn],
        "classes": classes,
    }
    facts["labels"], facts["labels_skipped"] = image_labels(model, directory, drawn, checkpoint)
    return images, facts


def image_labels(model, directory: Path, files: list[Path], checkpoint) -> tuple[list[int] | None, str | None]:
    """Class indices of ``files`` from their ImageFolder names, or why there are none: ImageNet-1k
    synsets for a model of its 1000 classes, else the folder's class folders in sorted order when
    the model has as many classes as there are folders (torchvision's ImageFolder order)."""
    if checkpoint is None:
        return None, "the model has random weights (no checkpoint in the catalog): its classes mean nothing"
    from timm.data import ImageNetInfo

    classes = getattr(model, "num_classes", None)
    folders = [image_class(path, directory) for path in files]
    synsets = ImageNetInfo().label_names()
    if classes == len(synsets):
        index = {name: i for i, name in enumerate(synsets)}
        unknown = sorted({folder for folder in folders if folder not in index})
        if not unknown:
            return [index[folder] for folder in folders], None
        return None, f"folder names {', '.join(repr(f) for f in unknown[:3])} are not ImageNet-1k synsets (such as 'n01440764')"
    present = sorted({image_class(path, directory) for path in image_files(directory, "evaluation", "--eval-dir")})
    if classes == len(present) and "" not in present:
        index = {name: i for i, name in enumerate(present)}
        return [index[folder] for folder in folders], None
    return None, (
        f"the model has {classes if classes is not None else '?'} classes, neither ImageNet-1k's {len(synsets)} nor "
        f"the {len(present)} class folders of {directory}"
    )


class ReferenceWriter:
    """Writes an engine's reference files into the workspace and describes them for its export's
    details (``reference``)."""

    def __init__(self, workspace, engine, output_name: str):
        self.workspace, self.engine, self.output_name = workspace, engine, output_name

    def one_batch(self, input_name: str, engine_input, fp32_output, facts: dict[str, Any]) -> dict[str, Any]:
        """The reference batch in the engine's input dtype and the FP32 model's outputs for it."""
        from pipeline.measuring.accuracy import write_tensor

        described = dict(facts)
        names = (input_name, self.output_name)
        for key, name, tensor, path in zip(
            ("input", "output"), names, (engine_input, fp32_output), self.workspace.reference_paths(self.engine)
        ):
            with atomic_output(path) as tmp:
                write_tensor(tensor, tmp)
            described[key] = _tensor_entry(name, self.workspace.relative(path), tensor)
        return described

    def each_point(self, references, fp32_outputs, model_inputs, dtype, facts: dict[str, Any], missing=None) -> dict[str, Any]:
        """Each shape point's reference inputs (floating ones in the engine's dtype, integer ones
        as they are) and the FP32 model's outputs for them; a point in ``missing`` (label → why)
        has its inputs only, which its engines are measured on, their accuracy there unchecked."""
        from pipeline.measuring.accuracy import write_tensor

        workspace = self.workspace
        described: dict[str, Any] = {**facts, "points": {}}
        names = [i.name for i in model_inputs]
        for label, feeds in references.items():
            input_paths, output_path = workspace.reference_point_paths(self.engine, label, names)
            entries = []
            for name, tensor in zip(names, feeds):
                tensor = tensor.to(dtype) if tensor.is_floating_point() else tensor
                with atomic_output(input_paths[name]) as tmp:
                    write_tensor(tensor, tmp)
                entries.append(_tensor_entry(name, workspace.relative(input_paths[name]), tensor))
            point = {"inputs": entries, "output": None, "samples": int(feeds[0].shape[0])}
            if label in fp32_outputs:
                with atomic_output(output_path) as tmp:
                    write_tensor(fp32_outputs[label], tmp)
                point["output"] = _tensor_entry(self.output_name, workspace.relative(output_path), fp32_outputs[label])
            else:
                output_path.unlink(missing_ok=True)  # an earlier export's: not this one's reference
                point["unchecked"] = (missing or {}).get(label, "no FP32 reference was made at this point")
            described["points"][label] = point
        return described


def _tensor_entry(name: str, path: str, tensor) -> dict[str, Any]:
    return {"name": name, "path": path, "shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", "")}


def reference_files(reference: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, path) of every file of an export's reference: the one batch's input and output, or
    each shape point's inputs and output."""
    if "points" not in reference:
        return [("reference_input", reference["input"]["path"]), ("reference_output", reference["output"]["path"])]
    files = []
    for label, point in reference["points"].items():
        files += [(f"reference_input@{label}:{entry['name']}", entry["path"]) for entry in point["inputs"]]
        if point.get("output"):
            files.append((f"reference_output@{label}", point["output"]["path"]))
    return files


# The FP32 outputs this process last computed for one model (its seeded weights and catalog
# settings), by device and shape point, with the inputs they are for and how many samples at a
# time they were made (a batch that did not fit whole). The variants of a model share their
# reference batches (seeded by the model, not the variant) and so their FP32 outputs: the seed
# matrix's fp16 export ran the FP32 model at its six points again after the bf16 export (0.97 s on
# the lent H100). Weights a process cannot tell apart (a folder's, a checkpoint's, which may be
# saved again between two runs) are not kept, nor more than KEPT_OUTPUT_BYTES of outputs (a
# language model's logits at a long sequence are gigabytes a point).
_fp32_kept: dict[tuple, tuple[tuple, Any, int | None]] = {}
KEPT_OUTPUT_BYTES = 1 << 30


class KeptFP32Outputs:
    """The FP32 outputs of ``source``'s model on ``device``, made at each point by ``at_points``
    (pipeline/stages/point_outputs.py): those this process made for the same inputs, else made and
    kept (one model's at a time)."""

    def __init__(self, source, device: str, at_points):
        weights = source.weights_key()
        self.model = None if weights is None else (weights, source.spec.model_dump_json())
        self.device, self.at_points = device, at_points

    def output(self, label, feeds: tuple, forward, what: str):
        import torch

        if self.model is None:
            return self.at_points.run(label, feeds, forward, what)
        kept = _fp32_kept.get((self.model, self.device, label))
        if kept is not None:
            inputs, output, part = kept
            if len(inputs) == len(feeds) and all(
                a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(inputs, feeds, strict=True)
            ):
                if part is not None:
                    self.at_points.in_parts[label] = part
                return output
        output = self.at_points.run(label, feeds, forward, what)
        if output is not None:  # None: it did not fit even a sample at a time
            for key in [key for key in _fp32_kept if key[0] != self.model]:
                del _fp32_kept[key]
            held = sum(kept[1].numel() * kept[1].element_size() for kept in _fp32_kept.values())
            if held + output.numel() * output.element_size() <= KEPT_OUTPUT_BYTES:
                _fp32_kept[(self.model, self.device, label)] = (tuple(t.clone() for t in feeds), output, self.at_points.in_parts.get(label))
        return output
