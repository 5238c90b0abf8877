"""Each engine of a point runs under its own toolchain's TF32 setting (Prepared.in_force): the
flags are the process's, and each engine prepared sets its own, so the rounds timed every engine
of a point under the last one prepared's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.runtimes.pytorch import prepared as prepared_module  # noqa: E402
from pipeline.runtimes.pytorch.prepared import Prepared  # noqa: E402


@pytest.fixture
def flags_restored():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_each_engines_takes_run_under_its_own_tf32_setting(monkeypatch, flags_restored):
    seen = []

    def cuda_take(torch, run, runs, min_ms, issued, waited, untimed):  # a GPU's take, on the CPU
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        issued.append(0.1), untimed.append(1)
        return [1.0]

    monkeypatch.setattr(prepared_module, "cuda_take", cuda_take)
    examples = (torch.zeros(2, 8),)
    with_tf32 = Prepared((1, 0, 0), lambda: None, examples, "cuda", "2x8", tf32=True)
    without = Prepared((2, 0, 0), lambda: None, examples, "cuda", "2x8", tf32=False)
    for engine in (with_tf32, without, with_tf32, without):
        engine.take(1, 1.0)
    assert seen == [(True, True), (False, False), (True, True), (False, False)]


def test_an_engine_on_the_cpu_or_without_a_setting_leaves_the_flags(flags_restored):
    torch.backends.cuda.matmul.allow_tf32 = True
    Prepared((1, 0, 0), lambda: None, (torch.zeros(1),), "cpu", None, tf32=False).in_force()
    Prepared((1, 0, 0), lambda: None, (torch.zeros(1),), "cuda", None).in_force()
    assert torch.backends.cuda.matmul.allow_tf32 is True
