from pathlib import Path

import pytest

from pipeline.catalog import EngineRef
from pipeline.running.errors import UsageError
from pipeline.runtimes import load_catalog
from tests.conftest import REPO_ROOT, TINY_CATALOG, write_catalog


def test_shipped_catalog_names_the_models_variants_and_toolchains_users_type():
    catalog = load_catalog(REPO_ROOT / "pipeline.toml")
    assert catalog.models["vit"].timm == "vit_base_patch16_224"
    assert catalog.models["vit"].batch_size == 64
    assert catalog.models["vit_tiny"].timm == "vit_tiny_patch16_224"
    assert catalog.models["vit_tiny"].batch_size < catalog.models["vit"].batch_size
    for variant in ("fp32", "fp16", "int8", "fp8", "mxfp8", "nvfp4", "fp16_sparse", "fp8_sparse", "mxfp8_sparse", "nvfp4_sparse"):
        assert variant in catalog.variants
    assert all(spec.checkpoint is None for spec in catalog.models.values())  # never downloads weights
    assert catalog.defaults.toolchain == "onnxruntime"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("vit_nvfp4", EngineRef("vit", "nvfp4")),
        ("vit_fp16_sparse", EngineRef("vit", "fp16_sparse")),
        ("vit_tiny_fp32", EngineRef("vit_tiny", "fp32")),
        ("vit_tiny_nvfp4_sparse", EngineRef("vit_tiny", "nvfp4_sparse")),
    ],
)
def test_engine_names_split_into_model_and_variant(name, expected):
    assert load_catalog(REPO_ROOT / "pipeline.toml").engine(name) == expected


def test_unknown_engine_suggests_the_closest_names():
    catalog = load_catalog(REPO_ROOT / "pipeline.toml")
    with pytest.raises(UsageError) as info:
        catalog.engine("vit_nvpf4")
    assert "unknown engine 'vit_nvpf4'" in info.value.message
    assert "did you mean 'vit_nvfp4'" in info.value.hint


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "UPPER", "export"])
def test_path_like_or_reserved_names_are_refused(name):
    catalog = load_catalog(REPO_ROOT / "pipeline.toml")
    with pytest.raises(UsageError, match="not allowed"):
        catalog.engine(name)


def test_malformed_toml_names_the_problem(tmp_path):
    path = write_catalog(tmp_path, "[models.vit\ntimm = 'x'\n")
    with pytest.raises(UsageError, match="is not valid TOML"):
        load_catalog(path)


def test_invalid_field_names_field_value_and_rule(tmp_path):
    path = write_catalog(tmp_path, TINY_CATALOG.replace("batch_size = 2", "batch_size = 0"))
    with pytest.raises(UsageError) as info:
        load_catalog(path)
    assert "models.tiny.batch_size" in info.value.message
    assert "greater than 0" in info.value.message
    assert "(got 0)" in info.value.message


def test_unknown_keys_are_rejected_not_ignored(tmp_path):
    path = write_catalog(tmp_path, TINY_CATALOG.replace("batch_size = 2", "batch_size = 2\nbatchsize = 8"))
    with pytest.raises(UsageError, match="models.tiny.batchsize: Extra inputs are not permitted"):
        load_catalog(path)


def test_unquoted_trt_version_is_rejected_because_10_10_would_become_10_1(tmp_path):
    path = write_catalog(tmp_path, TINY_CATALOG.replace('trt = "10.14.1"', "trt = 10.10"))
    with pytest.raises(UsageError, match=r"toolchains.trt10.14.trt: Input should be a valid string"):
        load_catalog(path)


def test_variant_with_unknown_precision_lists_allowed_values(tmp_path):
    path = write_catalog(tmp_path, TINY_CATALOG.replace('precision = "int8"', 'precision = "int4"'))
    with pytest.raises(UsageError) as info:
        load_catalog(path)
    assert "variants.int8.precision" in info.value.message
    assert "'fp32', 'fp16', 'bf16', 'int8', 'fp8', 'mxfp8' or 'nvfp4'" in info.value.message


def test_ambiguous_engine_names_are_caught_at_load(tmp_path):
    text = TINY_CATALOG + '\n[models.tiny_fp32]\ntimm = "test_vit"\nbatch_size = 1\n[variants.fp32_fp32]\nprecision = "fp32"\n'
    path = write_catalog(tmp_path, text)
    with pytest.raises(UsageError, match="engine name 'tiny_fp32_fp32' is ambiguous"):
        load_catalog(path)


def test_defaults_must_reference_defined_names(tmp_path):
    path = write_catalog(tmp_path, TINY_CATALOG.replace('variants = ["fp32", "fp16", "int8"]', 'variants = ["fp64"]'))
    with pytest.raises(UsageError, match="defaults.variants: 'fp64' is not defined"):
        load_catalog(path)


def test_a_catalog_without_defaults_runs_what_it_defines(tmp_path):
    """No [defaults]: the demo's names are not this catalog's, so it runs its own models and
    variants on its first toolchain; a [defaults] written in part keeps what it says."""
    own = """
[models.m]
timm = "test_vit"
batch_size = 1
[variants.half]
precision = "fp16"
[variants.fp32]
precision = "fp32"
[toolchains.ort]
kind = "onnxruntime"
[toolchains.eager]
kind = "torch"
"""
    defaults = load_catalog(write_catalog(tmp_path / "a", own)).defaults
    assert (defaults.models, defaults.variants, defaults.toolchain) == (("m",), ("fp32",), "ort")
    written = load_catalog(write_catalog(tmp_path / "b", '[defaults]\ntoolchain = "eager"\n' + own)).defaults
    assert (written.models, written.variants, written.toolchain) == (("m",), ("fp32",), "eager")
    wrong = write_catalog(tmp_path / "c", '[defaults]\nmodels = ["vit_tiny"]\n' + own)
    with pytest.raises(UsageError, match="defaults.models: 'vit_tiny' is not defined"):
        load_catalog(wrong)


def test_trt_version_selects_its_toolchain(tiny_catalog):
    catalog = load_catalog(tiny_catalog)
    assert catalog.toolchain_for_trt("10.14") == "trt10.14"
    assert catalog.toolchain_for_trt("10.14.1") == "trt10.14"
    with pytest.raises(UsageError) as info:
        catalog.toolchain_for_trt("10.1")
    assert "no toolchain provides TensorRT 10.1" in info.value.message
    assert "10.14.1" in info.value.hint


def test_missing_catalog_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_catalog(tmp_path / "nope.toml")


def test_outputs_live_beside_the_catalog(tiny_catalog):
    assert load_catalog(tiny_catalog).root == Path(tiny_catalog).parent.resolve()


@pytest.mark.parametrize(
    "streams, words",
    [("[0, 2]", "[0, 2]: give stream counts from 1 to 256"), ("[2, 2]", "each stream count once"), ("[]", "give stream counts")],
)
def test_stream_counts_name_the_field_the_value_and_what_is_allowed(tmp_path, streams, words):
    path = write_catalog(tmp_path, TINY_CATALOG.replace("round_ms = 0", f"round_ms = 0\nstreams = {streams}"))
    with pytest.raises(UsageError) as info:
        load_catalog(path)
    assert "profile.streams" in info.value.message and words in info.value.message


def test_stream_counts_default_to_one_and_are_kept_in_order(tmp_path):
    assert load_catalog(write_catalog(tmp_path / "a")).profile.streams == (1,)
    profile = load_catalog(write_catalog(tmp_path / "b", TINY_CATALOG.replace("round_ms = 0", "round_ms = 0\nstreams = [4, 1, 2]"))).profile
    assert profile.streams == (1, 2, 4) and profile.serves


def test_a_misspelt_key_is_given_the_one_it_most_likely_meant(tmp_path):
    text = TINY_CATALOG.replace("batch_size = 2", 'batch_size = 2\nshape = ["2x8"]').replace("take_ms = 5", "take_mss = 5")
    with pytest.raises(UsageError) as refused:
        load_catalog(write_catalog(tmp_path, text))
    assert "models.tiny.shape: Extra inputs are not permitted; did you mean 'shapes'?" in refused.value.message
    assert "profile.take_mss: Extra inputs are not permitted; did you mean 'take_ms'?" in refused.value.message
    unlike = TINY_CATALOG.replace("take_ms = 5", "take_ms = 5\nzzz = 1")
    with pytest.raises(UsageError, match=r"profile\.zzz: Extra inputs are not permitted \(got 1\)"):
        load_catalog(write_catalog(tmp_path, unlike))


def test_a_catalog_of_another_name_is_named_by_its_own_in_the_floor_and_hints(tmp_path):
    """`--catalog` may read a file other than pipeline.toml: the answer's floor source and the
    catalog's hints name that file, as the user must edit it."""
    text = TINY_CATALOG.replace("batch_size = 2", 'batch_size = 2\naccuracy_floor = ["cos=0.995"]', 1)
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    catalog = load_catalog(path)
    assert catalog.accuracy_floor_for("tiny").source == "models.tiny in sweep.toml"
    with pytest.raises(UsageError) as info:
        catalog.toolchain_for_trt("9.9")
    assert "under [toolchains] in sweep.toml" in info.value.hint
    path.write_text(TINY_CATALOG.replace("batch_size = 2", "batch_size = 0"))
    with pytest.raises(UsageError) as info:
        load_catalog(path)
    assert info.value.hint == "see the comments in sweep.toml"
    assert load_catalog(write_catalog(tmp_path / "default", text)).accuracy_floor_for("tiny").source == "models.tiny in pipeline.toml"
