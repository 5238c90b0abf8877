"""How many processes compile a run's points side by side, and with how many kernel-compiling workers
each (pipeline/runtimes/pytorch/compile_sizing.py): one process per graph, so that they compile in one
wave, bounded by the CPUs, the host's and the GPU's free memory; and a pool that is handed that many
graphs starts that many processes, as the works arrive."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from pipeline.runtimes.pytorch.compile_sizing import (
    GIB,
    HOST_BASE_BYTES,
    HOST_MODEL_TIMES,
    MAX_PROCESSES,
    compile_threads,
    processes_for,
)

# The lent GPU machine (16 vCPUs, 128 GiB, one H200) and ModernBERT-base's bf16 engine file.
H200_GPU_FREE, LENT_HOST_FREE, MODERNBERT_BF16 = 139 * GIB, 120 * GIB, 300 * 10**6


def test_the_seed_matrix_compiles_its_twelve_graphs_in_one_wave_on_the_lent_machine():
    """Two dtypes × six points, torch-compile and torch-reduce-overhead sharing each graph: 12
    processes (it was 8: two waves), each compiling its kernels itself."""
    assert processes_for(12, 16, H200_GPU_FREE, LENT_HOST_FREE, MODERNBERT_BF16) == 12
    assert compile_threads(16, 12) == 1
    # One dtype: six processes, the CPUs left shared out as kernel-compiling workers.
    assert processes_for(6, 16, H200_GPU_FREE, LENT_HOST_FREE, MODERNBERT_BF16) == 6
    assert compile_threads(16, 6) == 2


def test_the_cpus_bound_it_with_two_kept_for_the_run_and_the_rest():
    assert processes_for(30, 16, None, None, MODERNBERT_BF16) == 14
    assert processes_for(30, 4, None, None, MODERNBERT_BF16) == 2
    assert processes_for(30, 2, None, None, MODERNBERT_BF16) == 0  # the pool declines: each profile compiles its own
    assert processes_for(30, 1, None, None, MODERNBERT_BF16) == 0


def test_host_memory_bounds_it_where_it_is_short():
    each = HOST_BASE_BYTES + HOST_MODEL_TIMES * MODERNBERT_BF16  # about 2.7 GiB
    assert processes_for(12, 16, H200_GPU_FREE, 5 * each, MODERNBERT_BF16) == 5
    assert processes_for(12, 16, H200_GPU_FREE, 5 * each - 1, MODERNBERT_BF16) == 4
    assert processes_for(12, 16, H200_GPU_FREE, 16 * GIB, 4 * MODERNBERT_BF16) == 2  # fp32 of a model twice the size
    assert processes_for(12, 16, H200_GPU_FREE, 1 * GIB, MODERNBERT_BF16) == 0


def test_the_gpus_free_memory_bounds_it_with_a_context_and_the_model_twice_over_each():
    assert processes_for(12, 16, 24 * GIB, LENT_HOST_FREE, 2 * GIB) == 4  # 24 GiB / (2 × 2 + 1) GiB
    assert processes_for(12, 16, 24 * GIB, LENT_HOST_FREE, 12 * GIB) == 0


def test_no_more_than_max_processes_hold_a_context_on_the_measured_gpu():
    assert processes_for(64, 128, 8 * H200_GPU_FREE, 4 * LENT_HOST_FREE, MODERNBERT_BF16) == MAX_PROCESSES


def test_compile_threads_share_the_cpus_out_and_never_fall_to_none():
    assert [compile_threads(16, processes) for processes in (1, 2, 3, 8, 9, 14, 16)] == [16, 8, 5, 2, 1, 1, 1]
    assert compile_threads(2, 0) == 2


# --- the pool -----------------------------------------------------------------------------------------


def _work(engine: Path, shapes: list[str]):
    from pipeline.runtimes.base import AheadWork
    from pipeline.runtimes.pytorch.compile_ahead import CompileJob, CompilePool

    # No toolchain settings: each process reports the point it is handed as failed at once, which
    # is all this needs of it (how many processes were started, with how many workers).
    jobs = [CompileJob("torch-compile", None, engine.parent, engine, SimpleNamespace(shape=shape)) for shape in shapes]
    return AheadWork(engine, jobs, CompilePool)


def _pool_on(monkeypatch, cpus: int, host_free: int | None):
    from pipeline.runtimes.pytorch import compile_ahead

    monkeypatch.setattr(compile_ahead, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(compile_ahead, "_gpu_free_bytes", lambda: None)
    monkeypatch.setattr(compile_ahead, "_host_free_bytes", lambda: host_free)
    return compile_ahead.CompilePool()


def test_a_pool_handed_six_graphs_as_the_builds_write_them_starts_six_processes(tmp_path, monkeypatch):
    """On a machine of 8 CPUs and room in memory, told the run may hand over 6 points: the first
    engine's 3 start 3 processes, the second's 3 more — one wave (it was 4: two CPUs a process) —
    with one kernel-compiling worker each (8 CPUs among 6 processes)."""
    pool = _pool_on(monkeypatch, 8, 64 * GIB)
    first, second = tmp_path / "m_bf16.pt", tmp_path / "m_fp16.pt"
    for engine in (first, second):
        engine.write_bytes(b"weights")
    try:
        pool.expect(6)
        assert pool.submit(_work(first, ["2x8", "4x8", "4x16"]))
        pool._starting.wait()  # they start on a thread of their own
        assert len(pool._children) == 3
        assert pool.submit(_work(second, ["2x8", "4x8", "4x16"]))
        pool._starting.wait()
        assert len(pool._children) == 6
        evidence, skipped = pool.finish(lambda line: None)
    finally:
        pool.close()
    assert skipped is None
    ahead = evidence[0]["compiler"]["compiled_ahead"]
    assert ahead["processes"] == 6 and ahead["compile_threads"] == 1, ahead
    assert sorted(ahead["points"]) == ["2x8", "4x16", "4x8"] and all("error" in point for point in ahead["points"].values())


def test_a_pool_short_of_host_memory_starts_fewer_processes_and_they_compile_every_point(tmp_path, monkeypatch):
    from pipeline.runtimes.pytorch.compile_sizing import HOST_BASE_BYTES, HOST_MODEL_TIMES

    engine = tmp_path / "m.pt"
    engine.write_bytes(b"weights")
    pool = _pool_on(monkeypatch, 16, 2 * (HOST_BASE_BYTES + HOST_MODEL_TIMES * engine.stat().st_size))
    try:
        pool.expect(3)
        assert pool.submit(_work(engine, ["1x8", "2x8", "4x8"]))
        pool._starting.wait()  # they start on a thread of their own
        assert len(pool._children) == 2
        evidence, _ = pool.finish(lambda line: None)
    finally:
        pool.close()
    ahead = evidence[0]["compiler"]["compiled_ahead"]
    assert ahead["processes"] == 2 and ahead["compile_threads"] == 8, ahead
    assert sorted(ahead["points"]) == ["1x8", "2x8", "4x8"] and all("AttributeError" in p["error"] for p in ahead["points"].values())
