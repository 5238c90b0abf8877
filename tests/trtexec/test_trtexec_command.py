"""Every flag the pipeline emits exists in that release's recorded `trtexec --help`."""

from __future__ import annotations

import re
from itertools import product

import pytest

from pipeline.running.errors import UsageError
from pipeline.trtexec.command import WEAK_TYPING_FLAGS, BuildCommand, ProfileCommand, shapes_spec
from pipeline.trtexec.preflight import unsupported_reasons
from tests.conftest import SAMPLES

HELP_FILES = {
    "8.6.1": "trt8.6.1_help.txt",
    "10.0.1": "trt10.0.1_help.txt",
    "10.6.0": "trt10.6.0_help.txt",
    "10.14.1": "trt10.14.1_help.txt",
    "10.16.1": "trt10.16.1_help.txt",
    "11.0": "trt11.0.0_help.txt",
    # Rebuilt from NVIDIA's trtexec source (tests/data/trtexec/README.md): no real 11.1 capture exists.
    "11.1": "trt11.1_help_RECONSTRUCTED_from_oss_source.txt",
}
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8", "mxfp8", "nvfp4")


def help_flags(version: str) -> set[str]:
    text = (SAMPLES / HELP_FILES[version]).read_text()
    # Option lines are indented by two spaces; deeper lines are descriptions that mention flags.
    return {"--" + name for name in re.findall(r"^  --([A-Za-z0-9]+)", text, re.M)}


def flags(argv: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in argv[1:]}


# A transformer's two dynamic inputs: batch × sequence from 1×16 to 4×512.
RANGES = {"input_ids": ((1, 16), (2, 128), (4, 512)), "attention_mask": ((1, 16), (2, 128), (4, 512))}


def build_argvs(version: str):
    for precision, sparse, verbose, ranges in product(PRECISIONS, (False, True), (False, True), ({}, RANGES)):
        command = BuildCommand(
            onnx="/w/m.onnx", engine="/w/m.engine", precision=precision, sparse=sparse,
            timing_cache="/w/t.cache", layer_info="/w/m.layers.json", optimization_level=5, verbose=verbose,
            shape_ranges=ranges,
        )  # fmt: skip
        try:
            yield precision, command.argv(version)
        except UsageError:
            assert version.startswith("8.") and precision in ("bf16", "mxfp8", "nvfp4")


def profile_argv(version: str, **settings) -> list[str]:
    return ProfileCommand(
        engine="/w/m.engine", warmup_ms=200, iterations=10, duration_s=3,
        times_json="/w/t.json", profile_json="/w/p.json", verbose=True,
        shapes={"input_ids": (2, 512), "attention_mask": (2, 512)}, **settings,
    ).argv(version)  # fmt: skip


MEASUREMENT_SETTINGS = [
    dict(use_cuda_graph=graph, no_data_transfers=no_transfers, spin_wait=spin)
    for graph, no_transfers, spin in product((True, False), repeat=3)
]


def test_help_files_are_read():
    assert len(help_flags("10.16.1")) == 120
    assert len(help_flags("10.14.1")) == 116
    assert len(help_flags("8.6.1")) == 94


@pytest.mark.parametrize("version", sorted(HELP_FILES))
def test_every_emitted_flag_exists_in_that_release(version):
    known = help_flags(version)
    for precision, argv in build_argvs(version):
        assert flags(argv) <= known, (precision, flags(argv) - known)
    for settings in MEASUREMENT_SETTINGS:
        assert flags(profile_argv(version, **settings)) <= known, settings


def deprecated_flags(version: str) -> set[str]:
    text = (SAMPLES / HELP_FILES[version]).read_text()
    return {"--" + name for name in re.findall(r"^  --([A-Za-z0-9]+)\S*\s+\[Deprecated\]", text, re.M)}


@pytest.mark.parametrize("version", ["11.0", "11.1"])
def test_tensorrt_11_gets_no_deprecated_flag_and_the_opposites_when_a_setting_is_off(version):
    deprecated = deprecated_flags(version)
    assert {"--useCudaGraph", "--noDataTransfers", "--useSpinWait", "--separateProfileRun", "--stronglyTyped"} <= deprecated
    for settings in MEASUREMENT_SETTINGS:
        assert not flags(profile_argv(version, **settings)) & deprecated, settings
    for precision, argv in build_argvs(version):
        assert not flags(argv) & deprecated, precision
    assert not {"--noCudaGraph", "--includeDataTransfers", "--noSpinWait"} & flags(profile_argv(version))  # the defaults
    off = flags(profile_argv(version, use_cuda_graph=False, no_data_transfers=False, spin_wait=False))
    assert {"--noCudaGraph", "--includeDataTransfers", "--noSpinWait"} <= off


@pytest.mark.parametrize("version", ["10.14.1", "10.16.1"])
def test_tensorrt_10_gets_the_explicit_flags_for_the_same_settings(version):
    on = flags(profile_argv(version))
    assert {"--useCudaGraph", "--noDataTransfers", "--useSpinWait", "--separateProfileRun"} <= on
    off = flags(profile_argv(version, use_cuda_graph=False, no_data_transfers=False, spin_wait=False))
    assert not {"--useCudaGraph", "--noDataTransfers", "--useSpinWait"} & off


def test_the_settings_in_force_read_the_same_on_every_release():
    command = ProfileCommand(engine="e", warmup_ms=1, iterations=1, duration_s=0, use_cuda_graph=False)
    assert command.settings_in_force() == {"cuda_graph": False, "data_transfers": False, "spin_wait": True, "host_sync_per_run": False}


@pytest.mark.parametrize("version", ["10.0.1", "10.6.0", "10.14.1", "10.16.1"])
def test_tensorrt_10_builds_are_strongly_typed_and_never_weakly_typed(version):
    for precision, argv in build_argvs(version):
        assert not set(WEAK_TYPING_FLAGS) & flags(argv)
        assert ("--stronglyTyped" in argv) == (precision != "fp32")


@pytest.mark.parametrize("version", ["11.0", "11.1.0"])
def test_tensorrt_11_emits_none_of_the_removed_flags(version):
    for _precision, argv in build_argvs(version):
        assert not set(WEAK_TYPING_FLAGS) & flags(argv)
        assert "--stronglyTyped" not in argv  # a deprecated no-op there: strong typing is the only kind


def test_tensorrt_8_uses_weak_typing_and_cannot_do_block_formats():
    argvs = dict(build_argvs("8.6.1"))
    assert {"--fp16", "--int8"} <= flags(argvs["int8"])
    assert "--stronglyTyped" not in flags(argvs["fp16"])
    for precision in ("nvfp4", "bf16"):  # 8.6.1's help has no --bf16
        with pytest.raises(UsageError, match="needs a strongly typed build"):
            BuildCommand(onnx="a", engine="b", precision=precision).argv("8.6.1")


def test_build_command_in_full():
    argv = BuildCommand(
        onnx="/work/models/vit/fp16_sparse.onnx", engine="/work/engines/trt10.14/vit_fp16_sparse.engine",
        precision="fp16", sparse=True, timing_cache="/work/engines/trt10.14/timing.cache",
        layer_info="/work/engines/trt10.14/vit_fp16_sparse.layers.json",
    ).argv("10.14.1")  # fmt: skip
    assert argv == [
        "trtexec",
        "--onnx=/work/models/vit/fp16_sparse.onnx",
        "--saveEngine=/work/engines/trt10.14/vit_fp16_sparse.engine",
        "--stronglyTyped",
        "--sparsity=enable",
        "--timingCacheFile=/work/engines/trt10.14/timing.cache",
        "--profilingVerbosity=detailed",
        "--exportLayerInfo=/work/engines/trt10.14/vit_fp16_sparse.layers.json",
        "--skipInference",
    ]


def test_profile_command_uses_trtexec_units():
    argv = ProfileCommand(engine="e", warmup_ms=500, iterations=50, duration_s=2.5, times_json="t", profile_json="p").argv("10.16.1")
    assert "--warmUp=500" in argv  # milliseconds
    assert "--iterations=50" in argv and "--duration=2.5" in argv
    assert argv.index("--separateProfileRun") < argv.index("--exportProfile=p")
    assert {"--useCudaGraph", "--noDataTransfers", "--useSpinWait", "--exportTimes"} <= flags(argv)


@pytest.mark.parametrize(
    "precision, sparse, trt, cc, expected",
    [
        ("fp16", False, "10.14.1", "7.0", []),
        ("fp8", False, "10.14.1", "8.6", ["FP8 needs compute capability 8.9"]),
        ("fp8", False, "10.14.1", "8.9", []),
        ("fp8", False, "10.14.1", "9.0", []),
        ("nvfp4", False, "10.14.1", "9.0", ["NVFP4 needs a Blackwell GPU"]),
        ("nvfp4", False, "10.7.0", "10.0", ["NVFP4 needs TensorRT 10.8"]),
        ("nvfp4", False, "10.8", "10.0", []),
        ("nvfp4", False, "10.16.1", "12.0", []),
        ("mxfp8", False, "10.11", "10.0", ["MXFP8 needs TensorRT 10.12"]),
        ("mxfp8", False, "10.14.1", "9.0", ["MXFP8 needs a Blackwell GPU"]),
        ("mxfp8", False, "10.12", "10.0", []),
        ("fp16", True, "10.14.1", "7.5", ["2:4 sparsity needs compute capability 8.0"]),
        ("fp16", True, "10.14.1", "8.0", []),
        ("bf16", False, "10.14.1", "7.5", ["BF16 needs compute capability 8.0"]),
        ("bf16", False, "10.14.1", "8.0", []),
        ("int8", False, "10.5", "7.0", ["INT8 on TensorRT 10.5+ needs compute capability 7.5"]),
        ("int8", False, "10.4", "7.0", []),
        ("nvfp4", True, "10.6", "7.5", ["NVFP4 needs TensorRT 10.8", "NVFP4 needs a Blackwell", "2:4 sparsity needs"]),
    ],
)
def test_preflight_rules(precision, sparse, trt, cc, expected):
    reasons = unsupported_reasons(precision, sparse, trt, cc)
    assert len(reasons) == len(expected)
    for reason, start in zip(reasons, expected):
        assert reason.startswith(start)


def test_a_trt11_profile_dry_run_carries_no_deprecated_flag(tmp_path, run_cli):
    from tests.conftest import TINY_CATALOG, write_catalog

    toolchain = '\n[toolchains."trt11.1"]\nkind = "trtexec-container"\ntrt = "11.1.0"\ndockerfile = "Dockerfile.tensorrt-tarball"\n'
    catalog = write_catalog(tmp_path / "ws", TINY_CATALOG + toolchain)
    result = run_cli(catalog, "profile", "--engine", "tiny_fp16", "--trt", "11.1", "--dry-run")
    assert result.exit_code == 0, result.err
    profile_line = next(line for line in result.out.splitlines() if "profile:" in line)
    for flag in ("--useCudaGraph", "--noDataTransfers", "--useSpinWait", "--separateProfileRun", "--stronglyTyped"):
        assert flag not in profile_line
    catalog.write_text(catalog.read_text() + "use_cuda_graph = false\n")
    result = run_cli(catalog, "profile", "--engine", "tiny_fp16", "--trt", "11.1", "--dry-run")
    assert "--noCudaGraph" in next(line for line in result.out.splitlines() if "profile:" in line)


@pytest.mark.parametrize("version", sorted(HELP_FILES))
def test_a_dynamic_engine_is_built_for_every_input_range_and_timed_at_a_point(version):
    argvs = [argv for _, argv in build_argvs(version) if "--minShapes=input_ids:1x16,attention_mask:1x16" in argv]
    assert argvs  # every precision the release can build, with the ranges
    for argv in argvs:
        assert "--optShapes=input_ids:2x128,attention_mask:2x128" in argv
        assert "--maxShapes=input_ids:4x512,attention_mask:4x512" in argv
    assert "--shapes=input_ids:2x512,attention_mask:2x512" in profile_argv(version)
    static = BuildCommand(onnx="/w/m.onnx", engine="/w/m.engine", precision="fp16").argv(version)
    assert not {"--minShapes", "--optShapes", "--maxShapes"} & flags(static)


def test_shape_specs_quote_names_trtexec_would_split_and_write_scalars_as_it_asks():
    assert shapes_spec({"input_ids": (2, 512)}) == "input_ids:2x512"
    assert shapes_spec({"onnx::Add_5": (1, 320), "x,y": (4,), "step": ()}) == "'onnx::Add_5':1x320,'x,y':4,step:scalar"


@pytest.mark.parametrize("version", sorted(HELP_FILES))
def test_inf_streams_is_emitted_where_that_release_has_it(version):
    known = help_flags(version)
    assert "--infStreams" in known  # every recorded --help, 8.6.1 to 11.1
    for settings in MEASUREMENT_SETTINGS:
        argv = profile_argv(version, inf_streams=4, **settings)
        assert flags(argv) <= known and "--infStreams=4" in argv, settings
    assert "--infStreams" not in flags(profile_argv(version))  # one stream: trtexec's default, unsaid


def test_a_release_before_inf_streams_refuses_them():
    with pytest.raises(UsageError, match=r"TensorRT 8\.5\.10 has no --infStreams \(from 8\.6\)"):
        profile_argv("8.5.10", inf_streams=2)
    assert "--infStreams" not in flags(profile_argv("8.5.10"))
