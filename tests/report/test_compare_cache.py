"""`compare` remembers rows and confidence intervals between calls (pipeline/report/row_cache.py):
what it shows must be exactly what a compare without the cache shows, whatever happened to the
manifests or the cache file in between."""

from __future__ import annotations

import functools
import json
import os

import pytest

from pipeline.manifest import read_manifest
from pipeline.report.row_cache import CACHE_NAME
from tests.report.test_compare import trt_workspace  # noqa: F401  (the fixture)

FORMATS = ("json", "md", "csv")


def _outputs(run_cli, catalog) -> dict[str, str]:
    outputs = {}
    for fmt in FORMATS:
        result = run_cli(catalog, "compare", "--format", fmt)
        assert result.exit_code == 0, result.err
        outputs[fmt] = result.out
    outputs["table"] = run_cli(catalog, "compare", "--wide").out
    return outputs


def _uncached(run_cli, catalog) -> dict[str, str]:
    cache = catalog.parent / "manifests" / CACHE_NAME
    cache.unlink(missing_ok=True)
    result = _outputs(run_cli, catalog)
    cache.unlink(missing_ok=True)
    return result


def test_a_warm_compare_reads_no_manifest_and_shows_the_same(trt_workspace, run_cli, monkeypatch):  # noqa: F811
    cold = _outputs(run_cli, trt_workspace)
    cache = trt_workspace.parent / "manifests" / CACHE_NAME
    assert cache.is_file()
    kept = json.loads(cache.read_text())
    assert len(kept["rows"]) == 4 and kept["pairs"]  # every row, and the intervals of its comparisons

    def refuse(path):
        raise AssertionError(f"a warm compare read {path}")

    monkeypatch.setattr("pipeline.report.row_cache.read_manifest", refuse)
    assert _outputs(run_cli, trt_workspace) == cold


def test_a_rewritten_manifest_is_read_again_with_its_comparisons(trt_workspace, run_cli):  # noqa: F811
    _outputs(run_cli, trt_workspace)
    path = trt_workspace.parent / "manifests" / "trt10.16" / "tiny_fp16.json"
    manifest = read_manifest(path)
    details = manifest.profile.details
    slower = [value * 3 for value in details.per_iteration_ms]  # now slower than 10.14, not faster
    stats = details.latency_ms.model_copy(update={"median": details.latency_ms.median * 3})
    manifest.profile.details = details.model_copy(update={"per_iteration_ms": slower, "latency_ms": stats})
    manifest.write(path)
    warm = _outputs(run_cli, trt_workspace)
    rows = {(r["variant"], r["toolchain"]): r for r in json.loads(warm["json"])["rows"]}
    assert rows[("fp16", "trt10.16")]["median_ms"] == pytest.approx(details.latency_ms.median * 3)
    assert rows[("fp16", "trt10.16")]["change_pct"] > 0
    assert warm == _uncached(run_cli, trt_workspace)


def test_a_deleted_manifest_leaves_the_comparison_and_the_cache(trt_workspace, run_cli):  # noqa: F811
    _outputs(run_cli, trt_workspace)
    (trt_workspace.parent / "manifests" / "trt10.14" / "tiny_fp32.json").unlink()
    warm = _outputs(run_cli, trt_workspace)
    assert ("fp32", "trt10.14") not in {(r["variant"], r["toolchain"]) for r in json.loads(warm["json"])["rows"]}
    kept = json.loads((trt_workspace.parent / "manifests" / CACHE_NAME).read_text())
    assert len(kept["rows"]) == 3 and not any("trt10.14/tiny_fp32.json" in key for key in kept["pairs"])
    assert warm == _uncached(run_cli, trt_workspace)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda path: path.write_text("{not json"), id="not JSON"),
        pytest.param(lambda path: path.write_text("[]"), id="not an object"),
        pytest.param(lambda path: path.write_bytes(b"\xff\xfe\x00garbage"), id="binary"),
    ],
)
def test_a_damaged_cache_costs_time_never_a_result(trt_workspace, run_cli, damage):  # noqa: F811
    expected = _uncached(run_cli, trt_workspace)
    cache = trt_workspace.parent / "manifests" / CACHE_NAME
    damage(cache)
    assert _outputs(run_cli, trt_workspace) == expected
    assert json.loads(cache.read_text())["rows"]  # rewritten whole


def test_rows_computed_by_other_code_are_not_shown(trt_workspace, run_cli):  # noqa: F811
    """A cache written by another version of the pipeline (its code digest differs) is ignored,
    however plausible its rows look."""
    expected = _uncached(run_cli, trt_workspace)
    _outputs(run_cli, trt_workspace)
    cache = trt_workspace.parent / "manifests" / CACHE_NAME
    kept = json.loads(cache.read_text())
    for entry in kept["rows"].values():
        if entry["row"]["median_ms"] is not None:
            entry["row"]["median_ms"] = 999.0
    kept["code"] = "0" * 16
    cache.write_text(json.dumps(kept))
    assert _outputs(run_cli, trt_workspace) == expected


def test_a_cache_that_cannot_be_written_is_no_error(trt_workspace, run_cli):  # noqa: F811
    expected = _uncached(run_cli, trt_workspace)
    (trt_workspace.parent / "manifests" / CACHE_NAME).mkdir()  # a directory where the file would go
    assert _outputs(run_cli, trt_workspace) == expected


def test_another_noisy_threshold_is_not_answered_from_the_cache(trt_workspace, run_cli):  # noqa: F811
    expected = _uncached(run_cli, trt_workspace)
    _outputs(run_cli, trt_workspace)
    flagged = json.loads(run_cli(trt_workspace, "compare", "--format", "json", "--noisy-cv", "0.01").out)["rows"]
    assert all(any(flag.startswith("noisy") for flag in row["flags"]) for row in flagged)
    again = json.loads(run_cli(trt_workspace, "compare", "--format", "json").out)["rows"]
    assert not any(flag.startswith("noisy") for row in again if row["toolchain"] == "trt10.14" for flag in row["flags"])
    assert _outputs(run_cli, trt_workspace) == expected


def test_a_cache_entry_damaged_by_hand_is_read_anew(trt_workspace, run_cli):  # noqa: F811
    expected = _uncached(run_cli, trt_workspace)
    _outputs(run_cli, trt_workspace)
    cache = trt_workspace.parent / "manifests" / CACHE_NAME
    kept = json.loads(cache.read_text())
    first, second, *_ = kept["rows"]
    kept["rows"][first]["row"] = {"median_ms": 1.0}  # fields missing
    kept["rows"][second] = "not an entry"
    cache.write_text(json.dumps(kept))
    assert _outputs(run_cli, trt_workspace) == expected


_READ_HERE: list[int] = []  # per call, the manifests read in this process
_ASKED: list[int] = []  # per call, the manifests asked for


def _reading_here(work, paths):
    _READ_HERE.append(len(paths))  # in the process that reads them: a copy's list is its own
    return work(paths)


def _in_copies(monkeypatch) -> None:
    """Manifests read in copies of this process, a manifest a copy, each share counted in
    _READ_HERE where it is read here."""
    from pipeline.launchers import shares

    monkeypatch.setattr("pipeline.report.row_cache.READ_SHARE", 1)
    monkeypatch.setattr(shares.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(shares, "_forkable", lambda: True)
    read = shares.in_shares

    def counted(work, items, least):
        _ASKED.append(len(items))
        return read(functools.partial(_reading_here, work), items, least)

    monkeypatch.setattr("pipeline.report.row_cache.in_shares", counted)
    _READ_HERE.clear()
    _ASKED.clear()


def test_manifests_read_across_copies_of_the_process_show_the_same(trt_workspace, run_cli, monkeypatch):  # noqa: F811
    alone = _uncached(run_cli, trt_workspace)
    _in_copies(monkeypatch)
    assert _uncached(run_cli, trt_workspace) == alone
    assert _READ_HERE[0] == 1  # the cold compare read one manifest here and three in copies: their rows came back


def test_the_cache_saved_in_a_copy_while_the_answer_is_made_serves_the_next_compare(trt_workspace, run_cli, monkeypatch, tmp_path):  # noqa: F811
    from pipeline.report.row_cache import RowCache

    alone = _uncached(run_cli, trt_workspace)
    _in_copies(monkeypatch)
    save, savers = RowCache.save, tmp_path / "savers"

    def saved_by_whom(cache):
        if cache._dirty:  # a save that writes (a warm compare's writes nothing)
            with savers.open("a") as out:  # a copy's writes reach the file, not this process's memory
                out.write(f"{os.getpid()}\n")
        save(cache)

    monkeypatch.setattr(RowCache, "save", saved_by_whom)
    assert _outputs(run_cli, trt_workspace)["json"] == alone["json"]  # cold: the cache saved beside
    saved_by = savers.read_text().split()
    assert len(saved_by) == 1 and int(saved_by[0]) != os.getpid()  # once, by a copy of the process, not again here
    assert (trt_workspace.parent / "manifests" / CACHE_NAME).is_file()
    monkeypatch.setattr("pipeline.report.row_cache.read_manifest", _refuse)
    assert _outputs(run_cli, trt_workspace) == alone  # warm, from what the copy saved


def _refuse(path):
    raise AssertionError(f"a warm compare read {path}")


def test_a_rewritten_reference_has_every_rows_times_read_across_copies(trt_workspace, run_cli, monkeypatch):  # noqa: F811
    _outputs(run_cli, trt_workspace)
    path = trt_workspace.parent / "manifests" / "trt10.14" / "tiny_fp16.json"  # the toolchain the others are set against
    manifest = read_manifest(path)
    manifest.profile.details = manifest.profile.details.model_copy(
        update={"per_iteration_ms": [value * 1.5 for value in manifest.profile.details.per_iteration_ms]}
    )
    manifest.write(path)
    _in_copies(monkeypatch)
    warm = _outputs(run_cli, trt_workspace)
    shared = [(asked, here) for asked, here in zip(_ASKED, _READ_HERE) if asked > 1]
    assert shared and all(here == 1 for _, here in shared)  # cached rows' times, read one here and the rest in copies
    monkeypatch.undo()
    assert warm == _uncached(run_cli, trt_workspace)


def test_a_link_to_nothing_after_a_broken_manifest_is_said_in_order(trt_workspace, run_cli):  # noqa: F811
    folder = trt_workspace.parent / "manifests" / "trt10.16"
    (folder / "tiny_fp16.json").write_text("{ not json")
    (folder / "tiny_zz.json").symlink_to(folder / "nowhere.json")  # listed after it
    result = run_cli(trt_workspace, "compare", "--format", "json")
    assert result.exit_code == 1 and "trt10.16/tiny_fp16.json is not JSON" in result.err
    (folder / "tiny_fp16.json").unlink()
    result = run_cli(trt_workspace, "compare", "--format", "json")
    assert result.exit_code == 1 and "tiny_zz.json was listed, then not found" in result.err, result.err
    assert "Traceback" not in result.err


def test_a_folder_named_like_a_manifest_is_an_error_not_skipped(trt_workspace, run_cli):  # noqa: F811
    (trt_workspace.parent / "manifests" / "trt10.16" / "tiny_zz.json").mkdir()
    result = run_cli(trt_workspace, "compare", "--format", "json")
    assert result.exit_code == 1 and "tiny_zz.json is unreadable" in result.err
