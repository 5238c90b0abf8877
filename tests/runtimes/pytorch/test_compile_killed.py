"""A compiling process that dies outright (pipeline/runtimes/pytorch/compile_ahead.py): killed by the
kernel's OOM killer or a signal while another process goes on compiling and then serves the points
it kept. The wait for the compilations ends as soon as the others have reported what they were
handed; the point the dead process had taken is recorded with how that process ended and is
prepared by the run's process at its profile; the points still to hand out are compiled by the
others, which serve them.

On the CPU, the death is planted as the fault tests plant theirs: a module that stalls, only in a
compiling process, at one point (tests/data/python_models/stalling_compiled.py), and says which
process it is; the test sends that process SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import threading

from pipeline.manifest import read_manifest
from tests.conftest import DATA, catalog_head, write_catalog
from tests.runtimes.pytorch.test_pytorch_runtime import needs_inductor

# The first point stalls in the compiling process that takes it: that process is handed it
# first and never reports it, so the other compiles every other point.
SHAPES = ["4x64", "1x16", "2x16", "4x16"]
# Seconds the run may take, once the stalled process is killed, to compile the other points in the
# process left and measure them; far more than it needs (about 30 s on 2 busy CPUs).
AFTER_THE_KILL_S = 240


def _catalog(root, marker) -> str:
    return (
        catalog_head(["stalling"], ["fp32"])
        + f"""
[models.stalling]
python = "models-in/stalling_compiled.py:make"
config = {{ features = 8, longest = 32, marker = "{marker}" }}
shapes = {SHAPES}

[variants.fp32]
precision = "fp32"

[toolchains.onnxruntime]
kind = "onnxruntime"

[toolchains.torch-eager]
kind = "torch"
backend = "eager"

[toolchains.torch-compile]
kind = "torch"
backend = "compile"
"""
    )


class Killer(threading.Thread):
    """Kills the compiling process that stalled with SIGKILL once it says so; past AFTER_THE_KILL_S,
    kills the compiling processes still there, so that a run waiting on them for ever ends (and
    the test fails, ``hung``) instead of hanging the suite."""

    def __init__(self, marker):
        super().__init__(daemon=True)
        self.marker, self.killed, self.hung, self.done = marker, None, False, threading.Event()

    def run(self) -> None:
        while not self.marker.exists() or not self.marker.read_text():
            if self.done.wait(0.2):
                return
        name, pid = self.marker.read_text().split()
        os.kill(int(pid), signal.SIGKILL)
        self.killed = name
        if not self.done.wait(AFTER_THE_KILL_S):
            self.hung = True
            for child in multiprocessing.active_children():
                if child.name.startswith("pipeline-compile-"):
                    child.kill()


@needs_inductor
def test_a_compiling_process_killed_mid_compile_never_hangs_the_run(tmp_path, run_cli, monkeypatch):
    """Four points in two compiling processes; the one that takes 4x64 stalls there and is killed
    with SIGKILL. The run goes on at once with what the other compiled: 4x64 is recorded as left to
    its profile because that process was killed, and measured all the same (prepared by the run's
    process); the other three are served by the process left."""
    from pipeline.runtimes.pytorch import compile_ahead

    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: 4)  # two processes
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "models-in").mkdir()
    shutil.copy(DATA / "python_models" / "stalling_compiled.py", tmp_path / "models-in")
    marker = tmp_path / "stalled"
    catalog = write_catalog(tmp_path, _catalog(tmp_path, marker))
    killer = Killer(marker)
    killer.start()
    try:
        result = run_cli(catalog, "run", "--model", "stalling", "--toolchain", "torch-compile")
    finally:
        killer.done.set()
        killer.join(10)
    assert killer.killed is not None, f"no compiling process stalled: nothing was killed ({result.err})"
    assert not killer.hung, f"the run still waited on its compiling processes {AFTER_THE_KILL_S} s after one was killed"
    assert result.exit_code == 0, result.err
    manifests = tmp_path / "manifests" / "torch-compile"
    ahead = read_manifest(manifests / "stalling_fp32.json").build.details.compiler["compiled_ahead"]
    assert ahead["processes"] == 2, ahead
    assert ahead["points"]["4x64"] == {"error": f"the compiling process {killer.killed} ended (killed by SIGKILL) before compiling it"}
    assert ahead["served"] == 3, ahead
    killed = read_manifest(manifests / "stalling_fp32@4x64.json").profile
    assert killed.status == "done", killed.reason
    assert "served_by" not in killed.details.execution  # prepared by the run's own process
    survivor = {"pipeline-compile-0": "pipeline-compile-1", "pipeline-compile-1": "pipeline-compile-0"}[killer.killed]
    for shape in SHAPES[1:]:
        assert "compile_s" in ahead["points"][shape], ahead["points"]
        profile = read_manifest(manifests / f"stalling_fp32@{shape}.json").profile
        assert profile.status == "done", (shape, profile.reason)
        assert profile.details.execution["served_by"]["process"] == survivor, (shape, profile.details.execution)
