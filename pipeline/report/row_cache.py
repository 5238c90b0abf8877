"""What `compare` remembers between calls, so a results folder of thousands of manifests compares
in about a second: each manifest's row and the bootstrap confidence intervals, kept in one JSON
file beside the manifests (``manifests/.compare-cache.json``).

A row is reused only while its manifest is the same file — same size, modification time and inode
(a manifest rewritten by a stage, edited by hand or checked out again is read anew) — and only by
the same code: the cache is keyed by a digest of the modules that compute rows and intervals, so an
upgraded checkout starts afresh rather than showing rows computed the old way. An interval of a
difference is kept per pair of manifest versions. The bootstrap is seeded and its draws depend only
on the series' lengths (pipeline/measuring/stats.py), so a remembered interval is the one a fresh
computation gives, bit for bit.

The cache is an optimisation: a missing, unreadable or unwritable cache file costs time, never a
result.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import operator
import os
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from pipeline.launchers.shares import beside, in_shares
from pipeline.manifest import read_manifest
from pipeline.report.manifest_sources import built_from
from pipeline.report.row_times import attach_timings, timings_of
from pipeline.report.rows import FILLED_BY_COMPARISON, ComparisonRow, row_of
from pipeline.running.errors import PipelineError

CACHE_NAME = ".compare-cache.json"
# What a cached row is made from: a change to any of these modules invalidates every entry.
_CODE = (
    "pipeline/manifest/schema.py",
    "pipeline/measuring/rounds.py",
    "pipeline/measuring/records.py",
    "pipeline/measuring/energy.py",
    "pipeline/measuring/machine_watch.py",
    "pipeline/measuring/stats.py",
    "pipeline/measuring/quantiles.py",
    "pipeline/report/flags.py",
    "pipeline/report/rows.py",
    "pipeline/report/row_times.py",
    "pipeline/report/energy.py",
    "pipeline/report/row_cache.py",
    "pipeline/report/manifest_sources.py",  # built_from, remembered with each row
    "pipeline/report/streams.py",
    "pipeline/measuring/serving.py",
)
# Cached with the row: everything but what compare_rows fills in from other rows, and the samples
# (which can be many thousands per row; read again from the manifest when an interval is missing).
_KEPT = tuple(f.name for f in fields(ComparisonRow) if f.name not in ("samples_ms", "layers", *FILLED_BY_COMPARISON))
# The fewest manifests a copy of this process reads (pipeline/launchers/shares.py): forking and
# sending the rows back cost about what reading 60 costs (measured on a 2-CPU VM: 1000 read in
# 0.31 s alone, 0.19 s in two processes; 100 in 0.022 s alone, 0.026 s in two).
READ_SHARE = 200
_TUPLES = ("median_ci_ms", "export_flops", "p90_interval_ms", "p99_interval_ms")
# A row's kept fields in _KEPT's order, read at C speed: a cold compare of 3000 manifests keeps 186,000.
_kept_of = operator.attrgetter(*_KEPT)


def _code_digest() -> str:
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for name in _CODE:
        digest.update((root / name).read_bytes())
    return digest.hexdigest()[:16]


class RowCache:
    """Rows by manifest, and confidence intervals by manifest version; ``cache_file`` None keeps
    nothing between calls."""

    def __init__(self, cache_file: Path | None, noisy_cv: float):
        self.cache_file = cache_file
        self.noisy_cv = noisy_cv
        self._rows: dict[str, dict] = {}  # manifest path -> {"stat": [...], "noisy_cv": x, "row": {...}}
        self._pairs: dict[str, list[float]] = {}  # "<version of row>\n<version of base>" -> [low, high]
        self._versions: dict[str, str] = {}  # manifest path -> its version in this call
        self._stats: dict[str, list[int]] = {}  # manifest path -> its stat in this call
        self._builds: dict[str, list] = {}  # manifest path -> [its stat, what its engine was built from]
        self._dirty = False
        if cache_file is not None:
            self._load()

    # --- the file ---------------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = json.loads(self.cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(data, dict) or data.get("code") != _code_digest():
            self._dirty = True  # written by other code: replaced by this call's
            return
        rows, pairs, builds = data.get("rows"), data.get("pairs"), data.get("builds")
        self._rows = rows if isinstance(rows, dict) else {}
        self._pairs = pairs if isinstance(pairs, dict) else {}
        self._builds = builds if isinstance(builds, dict) else {}

    def save(self) -> None:
        if self.cache_file is None or not self._dirty:
            return
        from pipeline.running.files import atomic_write_text

        # Forget manifests that are gone (those stat'ed this call are not), and intervals of
        # versions no row has any more.
        self._rows = {path: entry for path, entry in self._rows.items() if path in self._stats or os.path.exists(path)}
        self._builds = {path: entry for path, entry in self._builds.items() if path in self._stats or os.path.exists(path)}
        current = {_version(path, entry["stat"]) for path, entry in self._rows.items()}
        self._pairs = {key: value for key, value in self._pairs.items() if set(key.split("\n")) <= current}
        data = {"code": _code_digest(), "rows": self._rows, "pairs": self._pairs, "builds": self._builds}
        with contextlib.suppress(PipelineError, OSError):
            atomic_write_text(self.cache_file, json.dumps(data, separators=(",", ":")))
        self._dirty = False

    def saved_beside(self):
        """A ``with`` whose body runs while the cache is saved in a copy of this process, on another
        CPU: for 3000 engines it is 7 MB of JSON written and synced, a sixth of a second of a
        cold compare's two (scripts/benchmark_compare.py). Saved here first where it is small
        (a copy would cost more than it saves) or a copy cannot be made (launchers/shares.py)."""
        return beside(self.save, worth_a_copy=self._dirty and len(self._rows) >= READ_SHARE)

    # --- rows -------------------------------------------------------------------------------------

    def rows(self, paths: list[Path]) -> list[ComparisonRow]:
        """The row of each manifest: remembered while the file is unchanged, else read — on as
        many CPUs as their count is worth (``READ_SHARE``)."""
        rows = [self._remembered(path) for path in paths]
        unread = [index for index, row in enumerate(rows) if row is None]
        read = in_shares(functools.partial(_read, noisy_cv=self.noisy_cv), [paths[index] for index in unread], READ_SHARE)
        for index, (row, built) in zip(unread, read):
            key = str(paths[index])
            if key in self._stats:  # not where its stat failed and its read did not (a race)
                self._remember(key, self._stats[key], row)
                self._remember_build(key, self._stats[key], built)
            rows[index] = row
        unseen = self._rows.keys() - self._versions.keys()  # other toolchains' rows, or deleted manifests
        if any(not os.path.exists(path) for path in unseen):
            self._dirty = True  # saving forgets them
        return rows

    def _remembered(self, path: Path) -> ComparisonRow | None:
        """The manifest's row as remembered, while the file is the one it was made from; None
        where it must be read. Its stat is kept for the call (build_of, save)."""
        key = str(path)
        try:
            stat = path.stat()
        except OSError:  # a link to nothing, or gone since it was listed: its read says so, in order
            return None
        signature = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        self._versions[key] = _version(key, signature)
        self._stats[key] = signature
        entry = self._rows.get(key)
        if isinstance(entry, dict) and entry.get("stat") == signature and entry.get("noisy_cv") == self.noisy_cv:
            try:
                kept = copied(entry["row"].items())
                for name in _TUPLES:
                    if kept.get(name) is not None:
                        kept[name] = tuple(kept[name])
                return ComparisonRow(**kept)
            except (KeyError, TypeError, AttributeError):  # an entry damaged by hand: read the manifest
                pass
        return None

    def build_of(self, path: Path) -> list | None:
        """What a manifest's engine was built from (manifest_sources.built_from; None: no build, or
        no such file), remembered while the file is unchanged, as a row is."""
        key = str(path)
        signature = self._stats.get(key)  # a row's manifest, stat'ed once this call
        if signature is None:
            try:
                stat = path.stat()
            except FileNotFoundError:
                return None
            signature = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        entry = self._builds.get(key)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == signature:
            return entry[1]
        return self._remember_build(key, signature, built_from(read_manifest(path)))

    def _remember_build(self, key: str, signature: list[int], built: list | None) -> list | None:
        self._builds[key] = [signature, built]
        self._dirty = True
        return built

    def _remember(self, key: str, signature: list[int], row: ComparisonRow) -> None:
        self._rows[key] = {"stat": signature, "noisy_cv": self.noisy_cv, "row": copied(zip(_KEPT, _kept_of(row)))}
        self._dirty = True

    def read_timings(self, rows: list[ComparisonRow]) -> None:
        """The per-iteration and per-layer times of those ``rows`` that lack them (a cached row),
        read from their manifests on as many CPUs as their count is worth: a rewritten manifest of
        the reference toolchain makes every row's pair with it new, and each needs its times."""
        lacking = list({id(row): row for row in rows if not row.samples_ms and row.source and row.median_ms is not None}.values())
        for row, timings in zip(lacking, in_shares(_timings, [Path(row.source) for row in lacking], READ_SHARE)):
            if timings is not None:
                row.samples_ms, row.layers = timings

    def samples(self, row: ComparisonRow) -> list[float]:
        """A row's per-iteration times: a cached row does not keep them, so its manifest is read."""
        if not row.samples_ms and row.source and row.median_ms is not None:
            attach_timings(row, read_manifest(Path(row.source)))
        return row.samples_ms

    # --- intervals --------------------------------------------------------------------------------

    def fill_median_cis(self, rows: list[ComparisonRow]) -> None:
        """Each measured row's 95% bootstrap interval of its median, where the row has none yet."""
        from pipeline.measuring.bootstrap import bootstrap_median_cis

        missing = [row for row in rows if row.median_ms is not None and row.median_ci_ms is None]
        self.read_timings(missing)
        for row, interval in zip(missing, bootstrap_median_cis([self.samples(row) for row in missing])):
            row.median_ci_ms = interval
            entry = self._rows.get(row.source or "")
            if entry is not None:
                entry["row"]["median_ci_ms"] = interval
                self._dirty = True

    def difference_cis(self, pairs: list[tuple[ComparisonRow, ComparisonRow]]) -> list[tuple[float, float]]:
        """The 95% bootstrap interval of median(row) - median(base) for each pair."""
        from pipeline.measuring.bootstrap import median_difference_cis

        keys = [self._pair_key(row, base) for row, base in pairs]
        missing = [i for i, key in enumerate(keys) if key is None or key not in self._pairs]
        self.read_timings([row for i in missing for row in pairs[i]])
        computed = median_difference_cis([(self.samples(pairs[i][0]), self.samples(pairs[i][1])) for i in missing])
        for i, interval in zip(missing, computed):
            if keys[i] is not None:
                self._pairs[keys[i]] = list(interval)
                self._dirty = True
        fresh = dict(zip(missing, computed))
        return [fresh[i] if i in fresh else tuple(self._pairs[key]) for i, key in enumerate(keys)]

    def _pair_key(self, row: ComparisonRow, base: ComparisonRow) -> str | None:
        new, old = self._versions.get(row.source or ""), self._versions.get(base.source or "")
        return f"{new}\n{old}" if new and old else None


def _version(path: str, signature: list[int]) -> str:
    return f"{path}:{':'.join(map(str, signature))}"


def workspace_cache(manifests_dir: Path, noisy_cv: float) -> RowCache:
    return RowCache(manifests_dir / CACHE_NAME, noisy_cv)


def _read(paths: list[Path], noisy_cv: float) -> list[tuple[ComparisonRow, list | None]]:
    """Each manifest's row and what its engine was built from: pure, as shares.py needs."""
    read = []
    for path in paths:
        try:
            manifest = read_manifest(path)
        except FileNotFoundError as exc:
            raise PipelineError(
                f"manifest {path} was listed, then not found: {exc.strerror} (a link to nothing, or deleted while compare ran).",
                hint="delete a link that points nowhere, and compare again",
            ) from exc
        read.append((row_of(manifest, noisy_cv), built_from(manifest)))
    return read


def copied(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """{name: value}, each list or dict copied: a row's fields are flat, so one level of copying
    keeps the row and its cache entry from changing each other."""
    return {name: value.copy() if isinstance(value, (list, dict)) else value for name, value in items}


def _timings(paths: list[Path]) -> list[tuple[list[float], list[tuple[str, float]]] | None]:
    """Each manifest's per-iteration and per-layer times (row_times.timings_of): pure, as shares.py needs."""
    return [timings_of(read_manifest(path)) for path in paths]
