"""A folder's images are a seeded sample drawn across its classes (pipeline/models/images.py):
sorted, the first files of an ImageFolder are all of its first class."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pipeline.models.images import class_counts, describe_source, image_class, sample_across_classes


def folder(root: Path, sizes: dict[str, int]) -> list[Path]:
    files = []
    for name, count in sizes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            path = root / name / f"{i:03d}.png"
            path.write_bytes(b"")
            files.append(path)
    return sorted(files)


def test_a_batch_is_drawn_evenly_across_the_classes_not_from_the_first_folder(tmp_path):
    files = folder(tmp_path, {"a": 10, "b": 10, "c": 10, "d": 10})
    drawn = sample_across_classes(files, tmp_path, 32, seed=3)
    assert class_counts(drawn, tmp_path) == {"a": 8, "b": 8, "c": 8, "d": 8}
    assert len(set(drawn)) == 32
    assert drawn == sample_across_classes(files, tmp_path, 32, seed=3)  # the same seed, the same images
    assert drawn != sample_across_classes(files, tmp_path, 32, seed=4)
    # A batch that does not divide: every class one or the other of two neighbouring counts.
    assert sorted(class_counts(sample_across_classes(files, tmp_path, 6, seed=0), tmp_path).values()) == [1, 1, 2, 2]


def test_a_small_class_gives_what_it_has_and_the_others_make_up_the_rest(tmp_path):
    files = folder(tmp_path, {"rare": 2, "common": 30})
    assert class_counts(sample_across_classes(files, tmp_path, 8, seed=0), tmp_path) == {"common": 6, "rare": 2}
    assert sorted(sample_across_classes(files, tmp_path, 100, seed=0)) == files  # fewer than asked: all of them


def test_images_directly_in_the_folder_are_a_class_of_their_own(tmp_path):
    files = folder(tmp_path, {"a": 3})
    loose = tmp_path / "x.png"
    loose.write_bytes(b"")
    assert image_class(loose, tmp_path) == "" and image_class(files[0], tmp_path) == "a"
    assert Counter(image_class(p, tmp_path) for p in sample_across_classes([*files, loose], tmp_path, 2, seed=1)) == {"a": 1, "": 1}


def test_the_fingerprint_names_the_drawn_files_their_seed_and_classes(tmp_path):
    folder(tmp_path, {"a": 5, "b": 5})
    described = describe_source(tmp_path, 4, 2, seed=7)
    assert described["classes"] == {"a": 2, "b": 2} and described["samples"] == 4
    assert described["drawn"] == "seeded (seed 7) across the folder's classes"
    assert [name for name, _, _ in described["files"]] == [
        str(p.relative_to(tmp_path)) for p in sample_across_classes(sorted(tmp_path.rglob("*.png")), tmp_path, 4, seed=7)
    ]
    assert describe_source(tmp_path, 4, 2, seed=8)["files"] != described["files"]


def test_a_search_and_its_confirmation_are_disjoint_and_each_drawn_across_every_class(tmp_path):
    from pipeline.models.images import split_across_classes

    files = folder(tmp_path, {"a": 20, "b": 20, "c": 20, "d": 20})
    search, confirm = split_across_classes(files, tmp_path, (32, 32), seed=5)
    assert len(search) == len(confirm) == 32 and not set(search) & set(confirm)
    assert class_counts(search, tmp_path) == class_counts(confirm, tmp_path) == {"a": 8, "b": 8, "c": 8, "d": 8}
    # Three classes, an odd share each: the two still differ by one image a class at most.
    files = folder(tmp_path / "odd", {"a": 9, "b": 9, "c": 9})
    search, confirm = split_across_classes(files, tmp_path / "odd", (9, 9), seed=0)
    assert len(search) == len(confirm) == 9 and not set(search) & set(confirm)
    counts = class_counts(search, tmp_path / "odd"), class_counts(confirm, tmp_path / "odd")
    assert all(abs(counts[0][name] - counts[1][name]) <= 1 for name in "abc")


def test_a_folder_is_walked_once_while_it_is_unchanged_and_again_once_an_image_is_added(tmp_path, monkeypatch):
    from pipeline.models import images

    folder(tmp_path, {"a": 3, "b": 3})
    walks = []
    walk = images._walk
    monkeypatch.setattr(images, "_walk", lambda directory: walks.append(directory) or walk(directory))
    first = images.image_files(tmp_path)
    assert images.image_files(tmp_path) == first and len(first) == 6 and len(walks) == 1
    (tmp_path / "b" / "new.png").write_bytes(b"")
    assert len(images.image_files(tmp_path)) == 7 and len(walks) == 2
    (tmp_path / "a" / "000.png").unlink()
    assert len(images.image_files(tmp_path)) == 6 and len(walks) == 3
