"""TensorRT container toolchains against a real Docker Engine that these tests start themselves.

TensorRT cannot run here, so the image holds a stand-in `trtexec` (tests/standin/trtexec) that
replays logs recorded from real trtexec runs (tests/data/trtexec) and writes the files
trtexec writes. These tests therefore prove the plumbing — mounts, user, no network, exit codes,
timeouts, cleanup, log capture, parsing into manifests — not TensorRT's behaviour.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from pipeline.manifest import read_manifest
from tests.conftest import TINY_CATALOG, bury, write_catalog
from tests.dockerd import PrivateDockerd, import_standin_images, standin_times_json, why_unavailable

REASON = why_unavailable()
pytestmark = [pytest.mark.docker, pytest.mark.skipif(REASON is not None, reason=f"Docker tests: {REASON}")]

STANDIN_TOOLCHAINS = """
[toolchains.standin]
kind = "trtexec-container"
trt = "10.14.1"
image = "standin-trtexec:ok"
gpus = "none"
timeout_s = 60

[toolchains.standin-failed]
kind = "trtexec-container"
trt = "10.14.1"
image = "standin-trtexec:failed"
gpus = "none"

[toolchains.standin-plugin]
kind = "trtexec-container"
trt = "10.14.1"
image = "standin-trtexec:plugin"
gpus = "none"

[toolchains.standin-slow]
kind = "trtexec-container"
trt = "10.14.1"
image = "standin-trtexec:slow"
gpus = "none"
timeout_s = 3

[toolchains.standin-killed]
kind = "trtexec-container"
trt = "10.14.1"
image = "standin-trtexec:killed"
gpus = "none"

[toolchains.standin-noengine]
kind = "trtexec-container"
trt = "10.14.1"
image = "standin-trtexec:noengine"
gpus = "none"

[toolchains.standin-wrongversion]
kind = "trtexec-container"
trt = "10.16.1"
image = "standin-trtexec:ok"
gpus = "none"

[toolchains.standin-gpu]
kind = "trtexec-container"
trt = "10.14.1"
image = "standin-trtexec:ok"

[toolchains.missing]
kind = "trtexec-container"
trt = "10.14.1"
image = "registry.invalid/nvidia/tensorrt:99.99-py3"
gpus = "none"
"""


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory):
    daemon = PrivateDockerd(tmp_path_factory.mktemp("dockerd"))
    daemon.start()
    try:
        import_standin_images(daemon.client())
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def docker_host(dockerd, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", dockerd.url)
    yield dockerd
    leftovers = dockerd.client().containers.list(all=True, filters={"label": "trt-pipeline"})
    assert leftovers == [], "containers must be removed on every exit path"


@pytest.fixture
def workspace(tmp_path):
    return write_catalog(tmp_path / "ws", TINY_CATALOG + STANDIN_TOOLCHAINS)


def _engine_dir(catalog, toolchain):
    return catalog.parent / "engines" / toolchain


# --- the runner on its own ---------------------------------------------------------------------


def test_runner_isolates_the_container(docker_host, tmp_path, monkeypatch):
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.tensorrt import docker as container
    from pipeline.runtimes.tensorrt.docker import DockerRunner, Mount

    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    outputs.mkdir()
    outputs.chmod(0o777)
    (inputs / "data.txt").write_text("input")
    monkeypatch.setattr(container.os, "getuid", lambda: 4321)
    monkeypatch.setattr(container.os, "getgid", lambda: 4322)
    script = (
        "echo uid=$(id -u):$(id -g); echo net=$(ls /sys/class/net | tr '\\n' ' '); cat /in/data.txt; echo; "
        "touch /in/x 2>/dev/null && echo in-writable || echo in-read-only; echo made > /out/made.txt; exit 3"
    )
    result = DockerRunner(Reporter()).run(
        "standin-trtexec:ok", ["sh", "-c", script],
        [Mount(inputs, "/in", read_only=True), Mount(outputs, "/out", read_only=False)],
        log_path=tmp_path / "run.log", timeout_s=60, gpus=False,
    )  # fmt: skip
    assert result.exit_code == 3
    assert "uid=4321:4322" in result.log_text
    assert "net=lo\n" in result.log_text  # network_mode none: loopback only
    assert "input" in result.log_text and "in-read-only" in result.log_text
    made = outputs / "made.txt"
    assert made.read_text() == "made\n" and made.stat().st_uid == 4321
    assert (tmp_path / "run.log").read_text() == result.log_text
    assert result.image_id.startswith("sha256:")


def test_runner_kills_on_timeout_and_removes_the_container(docker_host, tmp_path):
    from pipeline.running.errors import PipelineError
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes.tensorrt.docker import DockerRunner

    with pytest.raises(PipelineError, match="ran past its 2 s limit and was killed"):
        DockerRunner(Reporter()).run(
            "standin-trtexec:ok", ["sh", "-c", "echo started; sleep 60"], [], log_path=tmp_path / "t.log", timeout_s=2, gpus=False
        )
    assert "started" in (tmp_path / "t.log").read_text()


def test_ctrl_c_removes_the_container(docker_host, workspace, run_cli, monkeypatch):
    import docker.models.containers

    def interrupted(self, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(docker.models.containers.Container, "wait", interrupted)
    result = run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", "standin")
    assert result.exit_code == 130 and "interrupted" in result.err
    assert not (_engine_dir(workspace, "standin") / "tiny_fp32.engine").exists()


# --- build and profile through the CLI -----------------------------------------------------------


def test_build_and_profile_record_what_trtexec_reported(docker_host, workspace, run_cli):
    result = run_cli(workspace, "run", "--engine", "tiny_fp16", "--toolchain", "standin")
    assert result.exit_code == 0, result.err
    engines = _engine_dir(workspace, "standin")
    assert (engines / "tiny_fp16.engine").read_text().startswith("stand-in engine for /work/engines/standin/.tiny_fp16.engine")
    manifest = read_manifest(workspace.parent / "manifests" / "standin" / "tiny_fp16.json")

    build = manifest.build
    assert build.status == "done"
    assert build.command[:4] == [
        "trtexec",
        "--onnx=/work/models/tiny/fp16.onnx",
        build.command[2],
        "--stronglyTyped",
    ]
    assert build.command[2].startswith("--saveEngine=/work/engines/standin/.tiny_fp16.engine.")
    assert build.details.image == "standin-trtexec:ok" and build.details.image_digest.startswith("sha256:")
    assert build.details.trtexec["trt_version"] == "10.14.1"
    assert build.details.trtexec["device"]["name"] == "NVIDIA RTX 6000 Ada Generation"
    assert {a.role for a in build.outputs} == {"engine", "build_log", "layer_info"}
    # The replayed layer info is an FP32 engine: the audit catches the silent fallback.
    assert build.details.precision_audit["intended_found"] is False
    assert "silent fallback" in result.err

    log = (engines / "tiny_fp16.build.log").read_text()
    assert f"standin: uid={os.getuid()}" in log
    assert "interfaces=lo \n" in log and "models read-only" in log
    assert "&&&& PASSED TensorRT.trtexec [TensorRT v101401]" in log

    profile = manifest.profile.details
    expected = [r["computeMs"] for r in json.loads(standin_times_json())]
    assert profile.metric == "GPU compute time"
    assert profile.per_iteration_ms == pytest.approx(expected)
    assert profile.latency_ms.count == len(expected)
    assert profile.trtexec["profile"]["iterations"] == 21248  # the replayed --dumpProfile table
    assert profile.trtexec["exported_profile"]["iterations"] == 14590
    assert any("auxiliary streams" in w for w in profile.warnings)
    assert manifest.profile.command[1] == "--loadEngine=/work/engines/standin/tiny_fp16.engine"
    assert "--warmUp=5" in manifest.profile.command  # the catalog's warmup_ms, in milliseconds
    assert {a.role for a in manifest.profile.outputs} == {"profile_log", "times", "layer_profile", "reference_log", "reference_outputs"}
    assert not [p.name for p in engines.iterdir() if p.name.startswith(".")]  # no partial files left
    # The accuracy run inside the container: the reference batch read from the read-only models
    # mount, the outputs written to the engines mount (the stand-in echoes the FP32 reference).
    reference_log = (engines / "tiny_fp16.reference.log").read_text()
    assert "--loadInputs=input:/work/models/tiny/fp16.ref-input.bin" in reference_log and "models read-only" in reference_log
    assert profile.accuracy["checked_by"] == "trtexec 10.14.1 --loadInputs/--exportOutput"
    assert profile.accuracy["cosine_similarity"] == pytest.approx(1.0, abs=1e-6)

    table = run_cli(workspace, "compare", "--format", "md", "--toolchain", "standin")
    assert "| tiny_fp16 | standin |" in table.out

    again = run_cli(workspace, "run", "--engine", "tiny_fp16", "--toolchain", "standin")
    assert again.exit_code == 0 and again.err.count("didn't change, skipping") == 3


def test_failed_build_says_where_leaves_no_engine_and_records_the_refusal(docker_host, workspace, run_cli):
    result = run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", "standin-failed")
    assert result.exit_code == 1
    assert "ERROR trtexec build failed with exit status 1 in image standin-trtexec:failed" in result.err
    # The node TensorRT's parser refused, as its log names it (the recorded log's custom op).
    assert (
        'could not parse /work/models/tiny/fp32.onnx at node 0 "CustomOpModel-N-0-AddScalar" (AddScalar → CustomOpModel-V-0-AddScalar-0): '
        "checkFallbackPluginImporter: Plugin not found, are the plugin name, version, and namespace correct?"
    ) in " ".join(result.err.split())
    assert "TIP full log: " in result.err and "tiny_fp32.build.log" in result.err
    assert "`pipeline reduce --engine tiny_fp32 --toolchain standin-failed`" in " ".join(result.err.split())
    engines = _engine_dir(workspace, "standin-failed")
    assert sorted(p.name for p in engines.iterdir() if not p.name.startswith("timing")) == ["tiny_fp32.build.log"]
    assert "&&&& FAILED" in (engines / "tiny_fp32.build.log").read_text()
    # TensorRT ran and refused the network: that is evidence, kept with its reason and log.
    build = read_manifest(workspace.parent / "manifests" / "standin-failed" / "tiny_fp32.json").build
    assert build.status == "failed" and "Plugin not found" in build.reason
    assert [a.role for a in build.outputs] == ["build_log"]
    assert build.details.trtexec["status"] == "FAILED"
    assert build.details.parser_failure["op_type"] == "AddScalar" and build.details.parser_failure["node_number"] == 0
    table = run_cli(workspace, "compare", "--format", "csv", "--toolchain", "standin-failed")
    assert "build refused: trtexec build failed" in table.out


def test_a_refused_build_is_reduced_by_builds_in_the_container(docker_host, exported_tiny, tmp_path, run_cli):
    """Each cut of the graph is built by trtexec in the toolchain's image, from the engine folder
    the container sees; the stand-in refuses any graph holding the custom op AddScalar."""
    import onnx

    catalog = write_catalog(tmp_path / "user", TINY_CATALOG + STANDIN_TOOLCHAINS + '\n[models.user]\nonnx = "user.onnx"\n')
    bury(exported_tiny, catalog.parent / "user.onnx", "AddScalar", "acme.plugins")
    assert run_cli(catalog, "build", "--engine", "user_fp32", "--toolchain", "standin-plugin").exit_code == 1
    result = run_cli(catalog, "reduce", "--engine", "user_fp32", "--toolchain", "standin-plugin")
    assert result.exit_code == 0, result.err
    reduced = onnx.load(str(catalog.parent / "models" / "user" / "fp32.standin-plugin.reduced.onnx"))
    ops = [node.op_type for node in reduced.graph.node]
    assert len(ops) <= 3 and "AddScalar" in ops, ops
    assert not list(_engine_dir(catalog, "standin-plugin").glob(".reduce-*"))


@pytest.mark.parametrize(
    "toolchain, message",
    [
        ("standin-slow", "ran past its 3 s limit and was killed"),
        ("standin-killed", "failed with exit status 137 (killed: out of memory or stopped)"),
        ("standin-noengine", "reported PASSED but wrote no engine"),
        ("standin-wrongversion", "claims TensorRT 10.16.1, but trtexec in image standin-trtexec:ok reports 10.14.1"),
    ],
)
def test_bad_runs_fail_clearly_and_leave_nothing_valid(docker_host, workspace, run_cli, toolchain, message):
    result = run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", toolchain)
    assert result.exit_code == 1
    assert message in result.err and "Traceback" not in result.err
    engines = _engine_dir(workspace, toolchain)
    assert not (engines / "tiny_fp32.engine").exists()
    assert not [p for p in engines.iterdir() if p.name.startswith(".")]
    assert not (workspace.parent / "manifests" / toolchain / "tiny_fp32.json").exists()


def test_missing_image_says_how_to_get_it(docker_host, workspace, run_cli):
    result = run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", "missing")
    assert result.exit_code == 3
    assert "image registry.invalid/nvidia/tensorrt:99.99-py3 (toolchain missing) is not on this machine" in result.err
    assert "TIP fetch it once with `pipeline toolchains pull missing`" in result.err


def test_refused_pull_is_a_clear_error(docker_host, workspace, run_cli):
    result = run_cli(workspace, "toolchains", "pull", "missing")
    assert result.exit_code == 1
    assert "ERROR pulling registry.invalid/nvidia/tensorrt:99.99-py3 failed" in result.err


def test_gpu_request_without_the_nvidia_runtime(docker_host, workspace, run_cli):
    result = run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", "standin-gpu", "--force")
    assert result.exit_code == 3
    assert "Docker cannot give the container a GPU" in result.err
    assert "NVIDIA Container Toolkit" in result.err


def test_unreachable_daemon(workspace, run_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    result = run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", "standin")
    assert result.exit_code == 3
    assert "the Docker daemon is not reachable" in result.err and "TIP start Docker" in result.err


def test_lock_pins_digests_and_builds_warn_when_the_image_changed(docker_host, workspace, run_cli):
    assert run_cli(workspace, "toolchains", "lock", "standin").exit_code == 0
    lock_path = workspace.parent / "toolchains.lock.json"
    lock = json.loads(lock_path.read_text())
    digest = lock["toolchains"]["standin"]["digest"]
    assert digest == docker_host.client().images.get("standin-trtexec:ok").id
    listing = run_cli(workspace, "toolchains", "list")
    assert "standin-trtexec:ok" in listing.out and "yes" in listing.out

    lock["toolchains"]["standin"]["digest"] = "sha256:" + "0" * 64
    lock_path.write_text(json.dumps(lock))
    result = run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", "standin")
    assert result.exit_code == 0
    assert "toolchains.lock.json pins sha256:000000000000" in result.err
    manifest = read_manifest(workspace.parent / "manifests" / "standin" / "tiny_fp32.json")
    assert manifest.build.details.image_digest == digest  # the digest it really ran on


def test_profiling_an_engine_from_another_release_is_refused(docker_host, workspace, run_cli):
    assert run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", "standin").exit_code == 0
    from pipeline.running.errors import PipelineError
    from pipeline.running.reporting import Reporter
    from pipeline.runtimes import load_catalog
    from pipeline.stages.base import RunContext
    from pipeline.stages.profile import ProfileStage
    from pipeline.workspace import Workspace

    workspace.write_text(
        workspace.read_text().replace(
            'trt = "10.14.1"\nimage = "standin-trtexec:ok"\ngpus = "none"\ntimeout_s = 60',
            'trt = "10.14.2"\nimage = "standin-trtexec:ok"\ngpus = "none"\ntimeout_s = 60',
        )
    )
    catalog = load_catalog(workspace)
    ctx = RunContext(catalog=catalog, workspace=Workspace(catalog.root), reporter=Reporter())
    with pytest.raises(PipelineError, match="was built by trtexec-container 10.14.1, but toolchain standin is 10.14.2"):
        ProfileStage(ctx, catalog.engine("tiny_fp32"), "standin").run()


def test_custom_image_is_built_from_the_docker_folder(docker_host, workspace, run_cli):
    docker_dir = workspace.parent / "docker"
    docker_dir.mkdir()
    # Offline: the base is the local stand-in image; a real one installs a TensorRT tarball.
    (docker_dir / "Dockerfile.custom").write_text("FROM standin-trtexec:ok\nARG TRT_VERSION\nLABEL trt.version=$TRT_VERSION\n")
    workspace.write_text(
        workspace.read_text()
        + textwrap.dedent(
            """
            [toolchains.custom]
            kind = "trtexec-container"
            trt = "10.14.1"
            dockerfile = "Dockerfile.custom"
            gpus = "none"
            """
        )
    )
    result = run_cli(workspace, "toolchains", "pull", "custom")
    assert result.exit_code == 0, result.err
    image = docker_host.client().images.get("trt-pipeline/custom:latest")
    assert image.labels["trt.version"] == "10.14.1"
    built = run_cli(workspace, "build", "--engine", "tiny_fp32", "--toolchain", "custom")
    assert built.exit_code == 0, built.err
    manifest = read_manifest(workspace.parent / "manifests" / "custom" / "tiny_fp32.json")
    assert manifest.build.details.image == "trt-pipeline/custom:latest"
