"""The workspace: where each output lives (paths.py), the lock one run holds on it (lock.py), and
files hashed once (artifacts.py). Files are written whole through pipeline/running/files.py, which
the manifest uses too; the machine-wide cache outside any workspace is pipeline/running/cache.py."""

from __future__ import annotations

from pipeline.workspace.paths import Workspace, output_folder

__all__ = ["Workspace", "output_folder"]
