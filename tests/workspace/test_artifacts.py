import errno
import os

import pytest

from pipeline.running import files
from pipeline.running.errors import PipelineError
from pipeline.running.files import atomic_output, atomic_write_text
from pipeline.workspace import artifacts
from pipeline.workspace.artifacts import HashCache, sha256_file


def test_atomic_output_replaces_only_on_success(tmp_path):
    target = tmp_path / "out" / "engine.bin"
    with atomic_output(target) as tmp:
        tmp.write_bytes(b"engine")
        assert not target.exists()  # nothing visible until the block finishes
    assert target.read_bytes() == b"engine"
    assert list(target.parent.iterdir()) == [target]


def test_atomic_output_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "engine.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_output(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer crashed")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.bin"]


def test_full_disk_becomes_a_user_error_and_leaves_no_temp_file(tmp_path, monkeypatch):
    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(PipelineError) as info:
        atomic_write_text(tmp_path / "manifest.json", "{}")
    assert "No space left on device" in info.value.message
    assert "free space" in info.value.hint
    assert list(tmp_path.iterdir()) == []


def test_outputs_get_umask_permissions_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644


def test_hash_cache_rehashes_only_when_size_or_mtime_changes(tmp_path, monkeypatch):
    data = tmp_path / "model.onnx"
    data.write_bytes(b"a" * 1000)
    calls = []
    real = artifacts.sha256_file
    monkeypatch.setattr(artifacts, "sha256_file", lambda p: calls.append(p) or real(p))
    cache = HashCache(tmp_path / "cache.json")
    first = cache.sha256(data)
    assert cache.sha256(data) == first and len(calls) == 1
    cache.save()
    assert HashCache(tmp_path / "cache.json").sha256(data) == first and len(calls) == 1  # persisted
    data.write_bytes(b"b" * 1001)
    assert cache.sha256(data) == sha256_file(data) != first


def test_hash_cache_reads_a_file_once_under_all_its_names(tmp_path, monkeypatch):
    """A second name of a file hashed in this process (a link) is not read again; a file written
    anew under that name is."""
    first = tmp_path / "torch-eager" / "m.pt"
    second = tmp_path / "torch-compile" / "m.pt"
    first.parent.mkdir()
    second.parent.mkdir()
    first.write_bytes(b"w" * 1000)
    os.link(first, second)
    calls = []
    real = artifacts.sha256_file
    monkeypatch.setattr(artifacts, "sha256_file", lambda p: calls.append(p) or real(p))
    cache = HashCache(tmp_path / "cache.json")
    assert cache.sha256(first) == cache.sha256(second) == real(first) and len(calls) == 1
    replaced = tmp_path / "new.pt"
    replaced.write_bytes(b"v" * 1000)
    os.replace(replaced, second)  # the same size, another file
    assert cache.sha256(second) == real(second) != real(first) and len(calls) == 2


def test_a_sigterm_just_after_the_temporary_file_is_made_leaves_no_file(tmp_path, monkeypatch):
    """SIGTERM raises wherever Python is (pipeline/running/signals.py), here the moment the temporary file
    exists and before its maker returns: the file left behind once in a suite run, when the
    signal landed in another thread than the one that had blocked it."""
    from pipeline.running.signals import Terminated

    made = files._create_new

    def create_then_terminated(path):
        os.close(made(path))
        assert path.exists()
        raise Terminated()

    monkeypatch.setattr(files, "_create_new", create_then_terminated)
    with pytest.raises(Terminated):
        with files.atomic_output(tmp_path / "model.onnx") as tmp:
            tmp.write_bytes(b"never finished")
    assert list(tmp_path.iterdir()) == []


def test_a_temporary_name_already_taken_is_passed_over(tmp_path, monkeypatch):
    taken = tmp_path / ".model.onnx.0000.tmp"
    taken.write_bytes(b"someone else's")
    names = iter(["0000", "0001"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda _n: next(names))
    with files.atomic_output(tmp_path / "model.onnx") as tmp:
        assert tmp.name == ".model.onnx.0001.tmp"
        tmp.write_bytes(b"mine")
    assert taken.read_bytes() == b"someone else's" and (tmp_path / "model.onnx").read_bytes() == b"mine"
