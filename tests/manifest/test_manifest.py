import json
import shutil
from pathlib import Path

import pytest

from pipeline.manifest import SCHEMA_VERSION, EngineManifest, Environment, read_manifest
from pipeline.running.errors import PipelineError


def _manifest() -> EngineManifest:
    env = Environment(hostname="h", os="Linux", python="3.11", cpu="cpu", cpu_count=2, pipeline_version="0")
    return EngineManifest(engine="m_fp32", model="m", variant="fp32", precision="fp32", toolchain="onnxruntime", environment=env)


def test_round_trip(tmp_path):
    path = tmp_path / "m_fp32.json"
    _manifest().write(path)
    loaded = read_manifest(path)
    assert loaded == _manifest()
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION


def test_corrupt_manifest_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "m_fp32.json"
    path.write_text('{"schema_version": 1, "engine": ')
    with pytest.raises(PipelineError) as info:
        read_manifest(path)
    assert str(path) in info.value.message and "--force" in info.value.hint


def test_other_schema_versions_are_not_misread(tmp_path):
    path = tmp_path / "m_fp32.json"
    data = json.loads(_manifest().model_dump_json())
    data["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(PipelineError, match=f"schema_version {SCHEMA_VERSION + 1}"):
        read_manifest(path)


def test_schema_violation_is_reported_with_its_location(tmp_path):
    path = tmp_path / "m_fp32.json"
    data = json.loads(_manifest().model_dump_json())
    data["environment"]["cpu_count"] = "many"
    path.write_text(json.dumps(data))
    with pytest.raises(PipelineError, match="environment.cpu_count"):
        read_manifest(path)


def test_manifests_of_the_previous_layout_are_read_and_compared(tmp_path, run_cli):
    from tests.conftest import REPO_ROOT

    recorded = Path(__file__).parents[1] / "data" / "manifests" / "landed-bdf42fb"
    int8 = read_manifest(recorded / "onnxruntime" / "vit_tiny_int8.json")
    assert (int8.engine, int8.toolchain, int8.profile.status) == ("vit_tiny_int8", "onnxruntime", "done")
    assert int8.profile.details.latency_ms.median > 0 and int8.profile.details.accuracy["cosine_similarity"] > 0.99
    assert read_manifest(recorded / "export" / "vit_tiny_int8.json").export.details.parity.passed

    workspace = tmp_path / "ws"
    workspace.mkdir()
    shutil.copy(REPO_ROOT / "pipeline.toml", workspace / "pipeline.toml")
    shutil.copytree(recorded, workspace / "manifests")
    result = run_cli(workspace / "pipeline.toml", "compare", "--format", "json")
    assert result.exit_code == 0, result.err
    rows = {row["variant"]: row for row in json.loads(result.out)["rows"]}
    assert set(rows) == {"fp32", "int8"}
    assert rows["int8"]["median_ms"] == int8.profile.details.latency_ms.median


@pytest.mark.parametrize(("given", "kept"), [("2x512", "2x512"), ("2×512", "2x512"), ("static", "static"), (None, None)])
def test_a_manifests_shape_point_is_kept_as_the_pipeline_writes_it(given, kept):
    assert EngineManifest.model_validate({**_manifest().model_dump(), "shape": given}).shape == kept


@pytest.mark.parametrize("given", ["2x", "0x512", "big"])
def test_a_manifests_shape_point_that_is_not_one_is_refused(given):
    with pytest.raises(ValueError, match="is not a shape"):
        EngineManifest.model_validate({**_manifest().model_dump(), "shape": given})


def test_a_manifest_this_version_wrote_reads_as_its_parsed_json_validates(tmp_path):
    """A manifest this version wrote is validated from its text by pydantic's JSON parser (a compare
    reads thousands); what it reads must be what the JSON, parsed and validated, says."""
    from pipeline.manifest.reading import parse_manifest

    recorded = sorted((Path(__file__).parents[1] / "data" / "manifests" / "landed-bdf42fb").glob("*/*.json"))
    assert len(recorded) >= 4
    for source in recorded:
        path = tmp_path / source.parent.name / source.name
        path.parent.mkdir(exist_ok=True)
        read_manifest(source).write(path)  # lifted to today's schema, as this version writes it
        text = path.read_text()
        assert parse_manifest(text, str(path)) == EngineManifest.model_validate(json.loads(text)), source


@pytest.mark.parametrize(
    ("last", "read"),
    [
        (SCHEMA_VERSION + 1, f"schema_version {SCHEMA_VERSION + 1}: it was written by a newer version"),
        ('"7"', "has schema_version '7'"),
        (1, None),  # read as schema 1, and lifted to this version's
    ],
)
def test_a_schema_version_written_twice_is_read_as_its_last(tmp_path, last, read):
    """JSON keeps the last of a key written twice: a manifest that opens with this version's
    schema and names another at its end is read as that other one, as any other manifest is."""
    path = tmp_path / "m_fp32.json"
    _manifest().write(path)
    text = path.read_text().rstrip().removesuffix("}") + f', "schema_version": {last}}}'
    path.write_text(text)
    if read is None:
        assert read_manifest(path).schema_version == SCHEMA_VERSION
        return
    with pytest.raises(PipelineError, match=read):
        read_manifest(path)
