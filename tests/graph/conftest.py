"""Every test here runs in an empty current directory, and leaves it empty: ONNX tooling that
saves into the current directory (ONNX Runtime's symbolic shape inference does, when it cannot
infer a shape) would litter a user's checkout."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def current_directory_left_empty(tmp_path_factory, monkeypatch):
    here = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(here)
    yield
    assert sorted(p.name for p in here.iterdir()) == [], "files written into the current directory"
