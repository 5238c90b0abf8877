"""Shared fixtures: small real catalogs and a helper that runs the CLI like a user would."""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]


# Recorded tool output and fixtures, for the tests of every folder.
DATA = Path(__file__).parent / "data"
# Recorded trtexec output (tests/data/trtexec/README.md says where each file came from).
SAMPLES = DATA / "trtexec"

# timm's `test_vit` (371k parameters, 160x160) keeps every export a real export that takes seconds.
TINY_CATALOG = """
opset = 17

[defaults]
models = ["tiny"]
variants = ["fp32", "fp16", "int8"]
toolchain = "onnxruntime"

[profile]
warmup_ms = 5
iterations = 5
duration_s = 0.05
take_ms = 5
round_ms = 0

[models.tiny]
timm = "test_vit"
batch_size = 2

[variants.fp32]
precision = "fp32"
[variants.fp16]
precision = "fp16"
[variants.int8]
precision = "int8"
[variants.mxfp8]
precision = "mxfp8"
[variants.nvfp4]
precision = "nvfp4"
[variants.fp16_sparse]
precision = "fp16"
sparsity = "2:4"

[toolchains.onnxruntime]
kind = "onnxruntime"
baselines = ["fp32"]

[toolchains."trt10.14"]
kind = "trtexec-container"
trt = "10.14.1"
image = "nvcr.io/nvidia/tensorrt:25.11-py3"
"""


@dataclass
class Rendered:
    dom: str
    screenshot: Path


def render_in_chromium(page: Path, scratch: Path, screenshot: bool = False) -> Rendered:
    """The page as headless Chromium lays it out: its DOM after rendering, and a screenshot.
    Skips, saying why, where Chromium is not installed (.ci/run installs it)."""
    import shutil
    import subprocess

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run installs it)")
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", f"--user-data-dir={scratch / 'chromium-profile'}",
    ]  # fmt: skip
    shot = scratch / f"{page.stem}.png"
    if screenshot:
        subprocess.run(
            [chromium, *flags, "--window-size=1400,1600", f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120
        )
    dom = subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    return Rendered(dom, shot)


# The toolchains every CPU machine has, each compared with its fp32 variant: ONNX Runtime and eager
# PyTorch (the catalogs' baseline).
CPU_TOOLCHAINS = """
[toolchains.onnxruntime]
kind = "onnxruntime"
baselines = ["fp32"]

[toolchains.torch-eager]
kind = "torch"
backend = "eager"
baselines = ["fp32"]
"""


def catalog_head(models: list[str], variants: list[str], baseline: str = "torch-eager") -> str:
    """A catalog's top: opset 17, the baseline toolchain, defaults of ``models`` and ``variants`` on
    ONNX Runtime, and short measurement bounds; models, variants and toolchains are the caller's."""

    def listed(names: list[str]) -> str:
        return "[" + ", ".join(f'"{name}"' for name in names) + "]"

    return f"""
opset = 17
baseline_toolchain = "{baseline}"

[defaults]
models = {listed(models)}
variants = {listed(variants)}
toolchain = "onnxruntime"

[profile]
warmup_ms = 5
iterations = 5
duration_s = 0.05
take_ms = 5
round_ms = 0
"""


def tiny_bert_catalog(shapes: list[str], variants: list[str], defaults: list[str]) -> str:
    """A catalog's head with a 2-layer BERT from transformers (random weights) measured at
    ``shapes``, its variants and short measurement bounds; toolchains are the caller's."""
    listed = "[" + ", ".join(f'"{shape}"' for shape in shapes) + "]"
    model = f"""
[models.bert]
transformers = "BertModel"
config = {{ hidden_size = 32, num_hidden_layers = 2, num_attention_heads = 2, intermediate_size = 64, vocab_size = 512, max_position_embeddings = 64 }}
shapes = {listed}

"""
    return catalog_head(["bert"], defaults) + model + "".join(f'[variants.{name}]\nprecision = "{name}"\n' for name in variants)


def write_catalog(directory: Path, text: str = TINY_CATALOG) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pipeline.toml"
    path.write_text(textwrap.dedent(text))
    return path


def quantized_test_vit(precision: str, device: str = "cpu"):
    """timm's test_vit, seeded and calibrated with ModelOpt on one random batch."""
    import torch

    from pipeline.models.torch_import import import_timm
    from pipeline.stages.quantize import quantize_model

    torch.manual_seed(0)
    model = import_timm().create_model("test_vit").eval().to(device)
    model, _ = quantize_model(model, precision, [torch.randn(4, 3, 160, 160)])
    return model


def modelopt_onnx(model, sample, opset: int, weights_dtype: str) -> bytes:
    """The ONNX file ModelOpt's exporter writes (its wrapper around it also names a temporary folder)."""
    from modelopt.torch._deploy.utils.torch_onnx import OnnxBytes, get_onnx_bytes_and_metadata

    data, _ = get_onnx_bytes_and_metadata(model, (sample,), onnx_opset=opset, weights_dtype=weights_dtype)
    (only,) = OnnxBytes.from_bytes(data).onnx_model.values()
    return only


# What a process keeps of its own work for the next run in it (pipeline/runtimes/pytorch/
# engine_file.py, preparing.py; pipeline/stages/export_references.py): each test starts as a new
# process would, so that no test reads what another one left (a test that replaces a function
# would otherwise get an answer kept from before it). Reset only where already imported.
PROCESS_MEMOS = {
    "pipeline.runtimes.pytorch.engine_file": "_written",
    "pipeline.runtimes.pytorch.preparing": "_eager_sdpa",
    "pipeline.stages.export_references": "_fp32_kept",
}


@pytest.fixture(autouse=True)
def _nothing_kept_from_another_test(monkeypatch):
    import sys

    for module, name in PROCESS_MEMOS.items():
        if module in sys.modules:
            kept = getattr(sys.modules[module], name)
            monkeypatch.setattr(sys.modules[module], name, type(kept)())


@dataclass
class CliResult:
    exit_code: int
    out: str
    err: str


@pytest.fixture
def run_cli(capsys):
    """Call `pipeline` in-process with a catalog; returns exit code and captured output."""

    def _run(catalog: Path, *args: str) -> CliResult:
        capsys.readouterr()
        code = main(["--catalog", str(catalog), *args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return _run


@pytest.fixture
def tiny_catalog(tmp_path) -> Path:
    return write_catalog(tmp_path / "ws")


# The two TensorRT-RTX releases the tests build with, as catalog entries.
RTX_TOOLCHAINS = """
[toolchains."trt-rtx1.7"]
kind = "tensorrt-rtx"
release = "1.7.1.116"

[toolchains."trt-rtx1.6"]
kind = "tensorrt-rtx"
release = "1.6.1.120"
"""


@pytest.fixture(scope="session")
def rtx_cache(tmp_path_factory):
    """Both releases pulled once for the session, the way a user pulls them."""
    from pipeline.cli import main

    cache = tmp_path_factory.mktemp("rtx-cache")
    previous = os.environ.get("PIPELINE_CACHE_DIR")
    os.environ["PIPELINE_CACHE_DIR"] = str(cache)
    catalog = write_catalog(tmp_path_factory.mktemp("rtx-pull"), TINY_CATALOG + RTX_TOOLCHAINS)
    code = main(["--catalog", str(catalog), "toolchains", "pull", "trt-rtx1.7", "trt-rtx1.6"])
    if code != 0:
        why = f"could not pull TensorRT-RTX from the package index (exit status {code}; see the output above)"
        if os.environ.get("PIPELINE_REQUIRE_RTX") == "1":
            pytest.fail(why + "; PIPELINE_REQUIRE_RTX=1 requires these tests to run")
        pytest.skip(why)
    yield cache
    if previous is None:
        os.environ.pop("PIPELINE_CACHE_DIR", None)
    else:
        os.environ["PIPELINE_CACHE_DIR"] = previous


# --- a graph no compiler here builds ---------------------------------------------------------------


def bury(exported: Path, path: Path, op: str, domain: str) -> None:
    """The exported graph with its fourth GELU's Erf replaced by ``domain:op`` (no compiler here
    has it), named as a user's layer would be, and no value_info (a hand-edited graph has none)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(exported))
    erfs = [i for i, node in enumerate(model.graph.node) if node.op_type == "Erf"]
    index = erfs[3]
    old = model.graph.node[index]
    new = helper.make_node(op, list(old.input), list(old.output), name=f"blocks.3.mlp.act/{op}", domain=domain)
    model.graph.node.remove(old)
    model.graph.node.insert(index, new)
    model.opset_import.append(helper.make_opsetid(domain, 1))
    del model.graph.value_info[:]
    onnx.save(model, str(path))


@pytest.fixture(scope="session")
def exported_tiny(tmp_path_factory) -> Path:
    """timm's test_vit as this pipeline exports it: a real graph of 194 nodes once folded."""
    catalog = write_catalog(tmp_path_factory.mktemp("exported"), TINY_CATALOG)
    assert main(["--catalog", str(catalog), "export", "--engine", "tiny_fp32"]) == 0
    return catalog.parent / "models" / "tiny" / "fp32.onnx"
