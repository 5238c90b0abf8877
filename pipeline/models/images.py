"""Calibration (and accuracy-proxy) inputs: synthetic noise by default, or a folder of images;
and the images of an evaluation folder (`--eval-dir`), through the same timm preprocessing.

Synthetic inputs need no dataset, which is why they are the default, but activation ranges
calibrated on noise are not those of real images; the manifest says which source was used.

A folder's images are a seeded sample drawn across its classes (an ImageFolder's first level of
folders), never its first files: sorted, the first 32 files of a folder of four classes are all
of the first class, and a top-1 or a calibration on them says nothing of the other three.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.running.errors import PipelineError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".ppm"}


def image_files(directory: Path, purpose: str = "calibration", option: str = "--calib-dir") -> list[Path]:
    """The folder's images, sorted. A run asks several times (the export's fingerprint, the draws,
    the labels' classes); a folder of 50,000 images is walked once while it and its class folders
    are unchanged (their modification times: adding or removing an image changes its folder's)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise PipelineError(f"{purpose} folder {directory} does not exist.", hint=f"pass an existing folder of images to {option}")
    key = _listing_key(directory)
    if key not in _LISTED:
        _LISTED.clear()  # one folder at a time is what a run reads; the cache holds no more
        _LISTED[key] = _walk(directory)
    files = list(_LISTED[key])
    if not files:
        raise PipelineError(
            f"{purpose} folder {directory} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}).",
            hint=f"point {option} at a folder of images, or leave it out to use synthetic inputs",
        )
    return files


_LISTED: dict[tuple, tuple[Path, ...]] = {}


def _listing_key(directory: Path) -> tuple:
    """The folder and the modification times of it and its class folders."""
    folders = [directory, *(entry for entry in directory.iterdir() if entry.is_dir())]
    return (str(directory.resolve()), tuple(sorted((str(folder), folder.stat().st_mtime_ns) for folder in folders)))


def _walk(directory: Path) -> tuple[Path, ...]:
    return tuple(sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES))


def image_class(path: Path, directory: Path) -> str:
    """The class of an image of an ImageFolder: its first folder under ``directory`` ("" for an
    image directly in it)."""
    parts = Path(path).relative_to(directory).parts
    return parts[0] if len(parts) > 1 else ""


def sample_across_classes(files: list[Path], directory: Path, count: int, seed: int) -> list[Path]:
    """``count`` of ``files`` (all of them, if fewer), drawn one class at a time in turn — a seeded
    order of the classes, a seeded order within each — so every class gives as many as it has up
    to an equal share, and the same seed draws the same images."""
    import random

    by_class: dict[str, list[Path]] = {}
    for path in files:
        by_class.setdefault(image_class(path, directory), []).append(path)
    rng = random.Random(seed)
    queues = []
    for name in sorted(by_class):
        members = sorted(by_class[name])
        rng.shuffle(members)
        queues.append(members)
    rng.shuffle(queues)
    chosen: list[Path] = []
    while len(chosen) < count and any(queues):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen


def split_across_classes(files: list[Path], directory: Path, sizes: tuple[int, int], seed: int) -> tuple[list[Path], list[Path]]:
    """Two disjoint draws of ``sizes`` images, each across the classes: a search and its
    confirmation. A class's share is dealt alternately to one and the other (every other class
    starting with the second), so both see every class alike."""
    first, second = sizes
    drawn = sample_across_classes(files, directory, first + second, seed)
    by_class: dict[str, list[Path]] = {}
    for path in drawn:
        by_class.setdefault(image_class(path, directory), []).append(path)
    parts: tuple[list[Path], list[Path]] = ([], [])
    for number, name in enumerate(sorted(by_class)):
        for index, path in enumerate(by_class[name]):
            parts[(index + number) % 2].append(path)
    # Dealt alike, the two differ by at most a class's odd image each: even them to the sizes asked.
    while len(parts[0]) > first:
        parts[1].append(parts[0].pop())
    while len(parts[1]) > second:
        parts[0].append(parts[1].pop())
    return parts


def class_counts(files: list[Path], directory: Path) -> dict[str, int]:
    """How many of ``files`` each class gave, by class name."""
    counts: dict[str, int] = {}
    for path in files:
        name = image_class(path, directory)
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def load_images(model, files: list[Path], image_shape: tuple[int, int, int], purpose: str = "calibration"):
    """Images through timm's evaluation transform for ``model``: a float32 CPU batch."""
    import torch
    from PIL import Image, UnidentifiedImageError
    from timm.data import create_transform, resolve_data_config

    config = resolve_data_config({"input_size": image_shape}, model=model)
    transform = create_transform(**config)
    tensors = []
    for path in files:
        try:
            with Image.open(path) as image:
                tensors.append(transform(image.convert("RGB")))
        except (OSError, UnidentifiedImageError) as exc:
            raise PipelineError(f"cannot read {purpose} image {path}: {exc}.", hint="remove or replace that file") from exc
        except Image.DecompressionBombError as exc:
            # Pillow refuses images of more than twice Image.MAX_IMAGE_PIXELS before decoding them.
            raise PipelineError(
                f"{purpose} image {path} is too large to decode safely: {exc}",
                hint="remove it, or replace it with a downscaled copy (the model sees it resized anyway)",
            ) from exc
    return torch.stack(tensors)


def describe_source(
    directory: Path | None,
    samples: int,
    batch_size: int,
    purpose: str = "calibration",
    option: str = "--calib-dir",
    seed: int = 0,
) -> dict[str, Any]:
    """What goes into the export fingerprint: the sampled files (names, sizes, mtimes), the seed
    that drew them and how many each class gave."""
    if directory is None:
        return {"source": "synthetic (standard normal)", "samples": samples, "batch_size": batch_size}
    files = sample_across_classes(image_files(directory, purpose, option), directory, samples, seed)
    listing = [(str(p.relative_to(directory)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return {
        "source": f"images in {directory}",
        "samples": len(files),
        "batch_size": batch_size,
        "files": listing,
        "drawn": f"seeded (seed {seed}) across the folder's classes",
        "classes": class_counts(files, directory),
    }


def calibration_batches(model, directory: Path | None, samples: int, batch_size: int, image_shape: tuple[int, int, int], seed: int):
    """Batches of model inputs (float32, CPU): ``samples`` images in batches of ``batch_size``,
    drawn across the folder's classes by ``seed`` (seeded standard normal batches without one)."""
    import torch

    if directory is None:
        generator = torch.Generator().manual_seed(seed)
        sizes = [min(batch_size, samples - start) for start in range(0, samples, batch_size)]
        return [torch.randn(size, *image_shape, generator=generator) for size in sizes]

    images = load_images(model, sample_across_classes(image_files(directory), directory, samples, seed), image_shape)
    return [images[start : start + batch_size] for start in range(0, len(images), batch_size)]
