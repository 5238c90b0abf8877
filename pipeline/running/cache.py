"""Where the pipeline keeps what outlives a workspace on this machine: pulled releases, a node's
blobs, the host's speed record and the lock a point's rounds hold on the host."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$PIPELINE_CACHE_DIR, else the user's cache directory."""
    if os.environ.get("PIPELINE_CACHE_DIR"):
        return Path(os.environ["PIPELINE_CACHE_DIR"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "trt-pipeline"
