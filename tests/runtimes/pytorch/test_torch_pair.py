"""`pipeline doctor` on a torch/torchvision pair (pipeline/runtimes/pytorch/pair.py), with fake
pairs: the one `make setup`'s fallback gave (torch 2.13.0+cpu from a local wheel, torchvision 0.28.0
from PyPI, built for CUDA torch), and pairs that match."""

from __future__ import annotations

import sys

import pytest

from pipeline.runtimes.doctor import check_torch_pair

NMS_MISSING = "RuntimeError: operator torchvision::nms does not exist"


def test_a_cpu_torch_beside_pypis_torchvision_is_named_with_its_cost_and_fix():
    check = check_torch_pair(("2.13.0+cpu", "0.28.0"), lambda: NMS_MISSING)
    assert check.name == "torch/torchvision pair" and not check.ok
    assert check.detail.startswith(f"torch 2.13.0+cpu with torchvision 0.28.0: `import torchvision` fails ({NMS_MISSING}); ")
    assert "timm models still export, torchvision's own ops (nms, roi_align) do not." in check.detail
    # The fix reinstalls over the installed pair (--force-reinstall), the matching release, from torch's own index.
    assert check.detail.endswith(
        f"Fix: {sys.executable} -m pip install --force-reinstall --no-deps torch==2.13.0 torchvision==0.28.0 "
        "--index-url https://download.pytorch.org/whl/cpu"
    )


@pytest.mark.parametrize(
    "torch, torchvision, fix",
    [
        ("2.13.0+cu128", "0.27.0+cu128", "torch==2.13.0 torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cu128"),
        ("2.8.1", "0.22.0", "torch==2.8.1 torchvision==0.23.1"),  # PyPI's own builds: pip's own indexes
    ],
)
def test_releases_that_do_not_go_together_are_named_even_where_the_import_works(torch, torchvision, fix):
    check = check_torch_pair((torch, torchvision), lambda: None)
    assert not check.ok and check.detail.endswith(f"--force-reinstall --no-deps {fix}")


@pytest.mark.parametrize("torch, torchvision", [("2.13.0+cpu", "0.28.0+cpu"), ("2.13.0+cu128", "0.28.0+cu128"), ("2.4.1", "0.19.1")])
def test_a_pair_that_matches_and_imports_is_a_yes(torch, torchvision):
    check = check_torch_pair((torch, torchvision), lambda: None)
    assert check.ok and check.detail == f"torch {torch} with torchvision {torchvision}"


def test_without_torchvision_there_is_no_pair_to_check():
    assert check_torch_pair(("2.13.0+cpu", None), lambda: None) is None
