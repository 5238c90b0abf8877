"""The manifests a run writes are a contract: a change to the code that is not meant to change them
(a refactoring) leaves them equal to the ones recorded here, but for what a run cannot repeat —
times, counts of runs, hashes, timestamps, ids, the machine and its package versions.

Two runs are recorded in tests/data/manifests/contract/: a 2-layer BERT at two shape points,
fp32 and fp16 on ONNX Runtime and PyTorch eager (measured in rounds together), and timm's
test_vit on trtexec installed locally (the stand-in replaying recorded TensorRT 10.14.1 output:
a tool's engine measured alone). A change that is meant to change the manifests records them
again (``RECORD_CONTRACT=1 pytest tests/manifest/test_manifest_contract.py``) and says what changed in
docs/outputs.md, with the schema version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import CPU_TOOLCHAINS, TINY_CATALOG, tiny_bert_catalog, write_catalog
from tests.dockerd import STANDIN, standin_files

RECORDED = Path(__file__).parents[1] / "data" / "manifests" / "contract"
HEX = re.compile(r"\b[0-9a-f]{32,}\b")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
TEMPORARY = re.compile(r"\.[a-z0-9_]{8}\.tmp\b")  # a file written under a temporary name, then renamed
IDS = {"group"}  # the rounds' group: the same id in every manifest of a point's engines, new each run
# Why a point's rounds ended, where the times decide it: the pairs settled, or the budget (or the
# most rounds) came first — on a loaded machine the budget does (seen in CI). "alone" and "failed"
# follow from the run itself and stay as they are.
# Whose calibration of the host's speed a point's takes are judged against: the machine's state
# decides it (another process busy during the calibration, an earlier idle one on record).
MEASURED = {"stop": {"decided", "budget", "rounds"}, "host_alone_from": {"this process", "host record"}}
NUMBER = re.compile(r"\d+(\.\d+)?(e[+-]?\d+)?")


def normalised(manifest: dict, root: Path) -> dict:
    """The manifest with what a run cannot repeat replaced by what it is: a number by "<number>",
    a list of numbers by "<numbers>", a list of records alike by one of them, a hash by "<hex>", a time by "<time>", the workspace's path
    by "<workspace>" (the folder the test made), the machine's own words (its CPU, host, package versions) by "<machine>"."""
    environment = manifest.get("environment") or {}
    machine = {value for value in _strings(environment) if len(value) > 2}

    def text(value: str) -> str:
        value = value.replace(str(root), "<workspace>")
        for word in sorted(machine, key=len, reverse=True):
            value = value.replace(word, "<machine>")
        value = TEMPORARY.sub(".<temporary>.tmp", TIMESTAMP.sub("<time>", HEX.sub("<hex>", value)))
        return NUMBER.sub("<number>", value)

    def walk(value):
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, (int, float)):
            return "<number>"
        if isinstance(value, str):
            return text(value)
        if isinstance(value, list):
            if value and all(isinstance(item, (int, float, list)) and not isinstance(item, bool) for item in value):
                return "<numbers>"
            items = [walk(item) for item in value]
            # Records of the same shape, as many as the run made (the takes of the rounds): one of them.
            return ["<each>", items[0]] if items and all(item == items[0] for item in items) else items
        return {text(key): "<id>" if key in IDS else _measured(key, item) or walk(item) for key, item in value.items()}

    # The machine's record itself: its keys are the contract, its words the machine's (and the
    # pipeline's checkout's: its commit, and whether it has changes, as the one running it has it).
    masked = {key: "<machine>" if isinstance(value, str) or key.startswith("git_") else walk(value) for key, value in environment.items()}
    return {**walk(manifest), "environment": masked} if "environment" in manifest else walk(manifest)


def _measured(key: str, value) -> str | None:
    """ "<key as measured>" where ``value`` is one of those the measurement chooses between."""
    return f"<{key} as measured>" if value in MEASURED.get(key, ()) else None


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _manifests(workspace: Path) -> dict[str, dict]:
    """Every manifest of the workspace, normalised; paths under the test's own folder named as such."""
    found = {}
    for path in sorted((workspace / "manifests").rglob("*.json")):
        if path.name.startswith("."):
            continue  # the workspace's caches, not manifests
        found[str(path.relative_to(workspace / "manifests"))] = normalised(json.loads(path.read_text()), workspace.parent)
    return found


def _bert_run(workspace: Path, run_cli) -> dict[str, dict]:
    pytest.importorskip("transformers", reason="bert is a transformers model")
    catalog = write_catalog(workspace, tiny_bert_catalog(["2x8", "3x16"], ["fp32", "fp16"], ["fp32"]) + CPU_TOOLCHAINS)
    args = ("run", "--model", "bert", "--variant", "fp32", "--variant", "fp16", "--toolchain", "onnxruntime", "--toolchain", "torch-eager")
    result = run_cli(catalog, *args)
    assert result.exit_code == 0, result.err
    return _manifests(workspace)


def _trtexec_run(workspace: Path, run_cli, monkeypatch) -> dict[str, dict]:
    root = workspace.parent / "TensorRT"
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    shutil.copy(STANDIN, root / "bin" / "trtexec")
    data = workspace.parent / "standin"
    data.mkdir()
    for name, content in standin_files("ok").items():
        (data / name).write_bytes(content)
    monkeypatch.setenv("STANDIN_DIR", str(data))
    local = f'\n[toolchains.local]\nkind = "trtexec-local"\ntrt = "10.14.1"\ntrt_root = "{root}"\ngpus = "none"\n'
    catalog = write_catalog(workspace, TINY_CATALOG + local)
    result = run_cli(catalog, "run", "--engine", "tiny_fp32", "--toolchain", "local")
    assert result.exit_code == 0, result.err
    return {name: manifest for name, manifest in _manifests(workspace).items() if name.startswith("local/")}


@pytest.mark.parametrize("run", ["bert", "trtexec"])
def test_a_run_writes_the_manifests_it_wrote_before(tmp_path, run_cli, monkeypatch, run):
    # Energy is not asked for, so each take's is recorded as not read, for that reason; were it read
    # by mistake, the machine's counters would not leak in: the powercap tree here is not there.
    monkeypatch.setattr("pipeline.measuring.energy.POWERCAP", tmp_path / "no-powercap")
    written = _bert_run(tmp_path / "ws", run_cli) if run == "bert" else _trtexec_run(tmp_path / "ws", run_cli, monkeypatch)
    recorded_file = RECORDED / f"{run}.json"
    if os.environ.get("RECORD_CONTRACT") == "1":
        recorded_file.parent.mkdir(parents=True, exist_ok=True)
        recorded_file.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(recorded_file.read_text())
    assert sorted(written) == sorted(recorded)
    for name in recorded:
        now, then = dict(_leaves(written[name])), dict(_leaves(recorded[name]))
        changed = {path: (then.get(path), now.get(path)) for path in sorted(set(now) | set(then)) if now.get(path) != then.get(path)}
        assert not changed, f"{name}: (recorded, written) at {changed}"


def _leaves(value, path: str = ""):
    """(path, value) for every leaf: a difference is named where it is."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}[{index}]")
        if not value:
            yield path, "[]"
    else:
        yield path, value
