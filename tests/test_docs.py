"""The commands the README and docs/ show are commands that run.

The README's quick start is run for real, in order, in a fresh workspace; every other `pipeline …`
line in a code block of the README or docs/ must at least name a real command with real options,
and every `make …` target must exist.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from tests.conftest import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
PROMPTS = ("$ ", ".venv/bin/")


def code_lines(path: Path) -> list[str]:
    """The lines of the fenced code blocks of a markdown file, prompts and trailing comments removed."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            line = line.strip()
            for prompt in PROMPTS:
                line = line.removeprefix(prompt)
            lines.append(re.sub(r"\s+#\s.*$", "", line))
    return lines


def quick_start() -> list[list[str]]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- quickstart -->", 1)[1].split("<!-- /quickstart -->", 1)[0]
    commands = [shlex.split(re.sub(r"\s+#\s.*$", "", line)) for line in block.splitlines() if line.startswith("pipeline ")]
    return [argv[1:] for argv in commands]


def test_the_readme_has_a_quick_start_and_every_doc_page_it_links_to_exists():
    assert len(quick_start()) >= 5
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    linked = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert linked and all((REPO_ROOT / page).is_file() for page in linked)
    assert {p.name for p in (REPO_ROOT / "docs").glob("*.md")} == {Path(page).name for page in linked}


def test_the_quick_start_runs_in_order(tmp_path, monkeypatch, capsys):
    workspace = tmp_path / "clone"
    workspace.mkdir()
    shutil.copy(REPO_ROOT / "pipeline.toml", workspace / "pipeline.toml")
    (workspace / "tests").symlink_to(REPO_ROOT / "tests")  # the recorded logs the quick start parses
    monkeypatch.chdir(workspace)  # as a user runs it: the catalog is found from here
    monkeypatch.setenv("COLUMNS", "160")
    outputs = {}
    for argv in quick_start():
        capsys.readouterr()
        code = main(argv)
        captured = capsys.readouterr()
        assert code == 0, (argv, captured.err[-2000:])
        outputs[" ".join(argv)] = captured.out + captured.err
    said = "\n".join(outputs.values())
    assert "vs torch-eager" in said or "vs baseline" in said  # the baseline toolchain's column
    assert (workspace / "reports" / "compare.html").is_file()
    assert "trtexec --onnx=/work/models/vit/fp16.onnx" in said  # the dry run's exact command
    assert "10.16.1" in said  # the parsed log's release
    assert (workspace / "manifests" / "torch-eager" / "vit_tiny_fp32.json").is_file()


def pipeline_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOCS:
        for line in code_lines(path):
            if line.startswith("pipeline ") and not re.search(r"[…<>\[\]|]", line):
                found.append((f"{path.name}: {line}", shlex.split(line)[1:]))
    return found


@pytest.mark.parametrize("where,argv", pipeline_commands(), ids=lambda value: value if isinstance(value, str) else "")
def test_every_command_shown_names_real_options(where, argv, capsys):
    # --help is eager: the command line is parsed (unknown commands and options fail) and nothing runs.
    assert main([*argv, "--help"]) == 0, (where, capsys.readouterr().err)


def test_every_make_target_shown_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO_ROOT / "Makefile").read_text(), re.M))
    shown = {line.split()[1] for path in DOCS for line in code_lines(path) if line.startswith("make ") and len(line.split()) > 1}
    shown = {word for word in shown if "=" not in word}
    assert shown and shown <= targets, shown - targets


def test_the_readmes_set_up_names_what_the_makefile_does():
    """The Makefile's torch variables, their defaults and the script that uses them are the ones
    the README's set-up section describes; `make -n setup` shows the CPU index on Linux."""
    import platform
    import subprocess

    makefile, readme = (REPO_ROOT / "Makefile").read_text(), (REPO_ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set-up") : readme.index("## Quick start")]
    packages = re.search(r"^TORCH_PACKAGES \?= (.+)$", makefile, re.M).group(1)
    index = re.search(r"^TORCH_INDEX \?= .*,(https://[^)]+)\)$", makefile, re.M).group(1)
    assert "`torch==2.13.0 torchvision==0.28.0`" in setup and packages == "torch==2.13.0 torchvision==0.28.0"
    assert index == "https://download.pytorch.org/whl/cpu" and f"`{index}`" in setup
    for name in ("TORCH_PACKAGES", "TORCH_INDEX", "scripts/install_torch.py", "make setup TORCH_PACKAGES=", "EXTRAS=cluster"):
        assert name in setup and (name.startswith("make ") or name.split("=")[0] in makefile), name
    assert "scripts/install_torch.py --index '$(TORCH_INDEX)' $(TORCH_NAMED) $(TORCH_PACKAGES)" in makefile
    if platform.system() == "Linux":
        dry = subprocess.run(["make", "-n", "-B", "setup"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
        assert f"scripts/install_torch.py --index '{index}'  {packages}" in dry  # the default: it may fall back
        named = ["make", "-n", "-B", "setup", "TORCH_INDEX=http://mirror.invalid/whl/cpu"]
        dry = subprocess.run(named, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
        assert f"scripts/install_torch.py --index 'http://mirror.invalid/whl/cpu' --named {packages}" in dry  # used or the set-up fails


def test_no_guide_is_over_300_lines_and_the_run_records_are_pages_of_their_own():
    """A guide says how to use the product and what its output means; dated records of measurement
    runs go to docs/results/, linked from their guide, so a reader of a guide does not read logs."""
    long = {path.name: n for path in (REPO_ROOT / "docs").glob("*.md") if (n := path.read_text().count("\n")) > 300}
    assert long == {}
    for record in (REPO_ROOT / "docs" / "results").glob("*.md"):
        assert any(f"results/{record.name}" in guide.read_text() for guide in (REPO_ROOT / "docs").glob("*.md")), record.name


def test_the_docs_name_the_schema_versions_the_code_writes():
    """A version said in prose or in the JSON schema's title goes stale silently: held here."""
    import json

    from pipeline.manifest.schema import SCHEMA_VERSION
    from pipeline.report.json_document import JSON_SCHEMA_VERSION

    schema = json.loads((REPO_ROOT / "docs" / "compare.schema.json").read_text())
    assert schema["title"] == f"pipeline compare --format json, schema {JSON_SCHEMA_VERSION}"
    assert schema["properties"]["schema"]["const"] == JSON_SCHEMA_VERSION
    assert f'{{"schema": {JSON_SCHEMA_VERSION}, "verdicts"' in (REPO_ROOT / "docs" / "sweeps.md").read_text()
    assert f"reads (now {SCHEMA_VERSION})" in (REPO_ROOT / "docs" / "outputs.md").read_text()
