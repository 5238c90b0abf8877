"""The scripts under test, imported by their own names (as a script's worker processes find them)."""

from __future__ import annotations

import importlib
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def import_script():
    """A function importing a script of scripts/ by name, with scripts/ on the path while the module's tests run."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
