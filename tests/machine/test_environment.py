"""What a manifest records of where it was made: the pipeline's own commit, whatever the workspace."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT


def test_the_commit_recorded_is_the_pipelines_not_the_workspaces(tmp_path, monkeypatch):
    from pipeline.machine.environment import capture_environment

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    if not shutil.which("git") or head.returncode != 0:
        pytest.skip("the pipeline is not in a git checkout here: it records no commit")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=workspace, check=True)  # a repository of the user's own
    monkeypatch.chdir(workspace)
    assert capture_environment().git_commit == head.stdout.strip()
