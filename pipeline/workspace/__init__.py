"""The workspace: where each output lives (paths.py), the lock one run holds on it (lock.py),
files written whole and hashed once (artifacts.py), and the caches kept beside it (cache.py).

Its face, Workspace and output_folder, is read on first use: the manifest writes its files
through artifacts.py, and the workspace's paths name the manifest's Artifact, so importing
the paths here at once would import each package from the other half-made."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.workspace.paths import Workspace, output_folder

__all__ = ["Workspace", "output_folder"]


def __getattr__(name: str):
    if name in __all__:
        from pipeline.workspace import paths

        return getattr(paths, name)
    raise AttributeError(f"module 'pipeline.workspace' has no attribute {name!r}")
