"""A private Docker Engine for the tests, and stand-in trtexec images imported into it.

No registry is reachable, so images are made locally: a busybox-static root filesystem plus the
stand-in script (tests/standin/trtexec) and the recorded trtexec output it replays.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from tests.conftest import SAMPLES

STANDIN = Path(__file__).parent / "standin" / "trtexec"
BUSYBOX_APPLETS = ("sh", "cat", "cp", "echo", "grep", "id", "ls", "rm", "sleep", "touch", "tr", "kill", "printf", "od", "awk", "sed", "wc")


def why_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "starting a private Docker Engine needs root"
    if not shutil.which("dockerd"):
        return "dockerd is not installed (apt-get install docker.io; .ci/run installs it)"
    if not _static_busybox():
        return "no statically linked busybox for the test image (apt-get install busybox-static)"
    return None


def _is_static_elf(path: Path) -> bool:
    """An ELF64 file with no PT_INTERP program header needs no dynamic loader in the image."""
    import struct

    data = path.read_bytes()
    if data[:5] != b"\x7fELF\x02":
        return False
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def _static_busybox() -> Path | None:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        path = Path(candidate)
        if path.exists() and _is_static_elf(path):
            return path
    return None


class PrivateDockerd:
    def __init__(self, root: Path):
        self.root = root
        self.socket = root / "docker.sock"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "dockerd.log", "w")
        self.process = subprocess.Popen(
            [
                "dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none", "--storage-driver=vfs",
                f"--data-root={self.root / 'data'}", f"--exec-root={self.root / 'exec'}",
                f"--pidfile={self.root / 'dockerd.pid'}", f"--host={self.url}",
            ],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        import docker

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd exited: {(self.root / 'dockerd.log').read_text()[-2000:]}")
            try:
                docker.DockerClient(base_url=self.url, timeout=5).ping()
                return
            except Exception:
                time.sleep(0.5)
        raise RuntimeError("dockerd did not answer within 60 s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.url, timeout=30)


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def standin_times_json(count: int = 40) -> bytes:
    """A complete --exportTimes file in TensorRT 10.4's record layout (see the recorded head)."""
    records = []
    for i in range(count):
        compute = 0.5 + (i % 7) * 0.01
        start = 5000.0 + i * 0.6
        records.append({
            "startEnqMs": start, "endEnqMs": start + 0.004, "startH2dMs": start + 0.1, "endH2dMs": start + 0.1,
            "startComputeMs": start + 0.1, "endComputeMs": start + 0.1 + compute, "startD2hMs": start + 0.1 + compute,
            "endD2hMs": start + 0.1 + compute, "h2dMs": 0, "computeMs": compute, "d2hMs": 0, "latencyMs": compute,
        })  # fmt: skip
    return json.dumps(records).encode()


def standin_files(mode: str) -> dict[str, bytes]:
    """What the stand-in replays: recorded TensorRT 10.14.1 output, and the mode it plays."""
    return {
        "mode": mode.encode(),
        "build.log": (SAMPLES / "trt10.14.1_rtx6000ada_onnx_build_and_run_default.txt").read_bytes(),
        "profile.log": (SAMPLES / "trt10.14.1_rtx6000ada_loadEngine_dumpProfile.txt").read_bytes(),
        "failed.log": (SAMPLES / "trt10.16.0_rtx6000ada_FAILED_custom_plugin_not_found.txt").read_bytes(),
        "layers.json": (SAMPLES / "trt10.16.1_h100_exportLayerInfo_detailed.json").read_bytes(),
        "profile.json": (SAMPLES / "trt10.4.0_rtx3060laptop_exportProfile_alexnet.json").read_bytes(),
        "times.json": standin_times_json(),
    }


def standin_image_tar(mode: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        # Explicit directories: implicit ones are created 0700, closed to a non-root user.
        for directory in ("bin", "usr", "usr/local", "usr/local/bin", "standin"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        _add(tar, "bin/busybox", _static_busybox().read_bytes(), 0o755)
        for applet in BUSYBOX_APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            tar.addfile(info)
        _add(tar, "usr/local/bin/trtexec", STANDIN.read_bytes(), 0o755)
        for name, data in standin_files(mode).items():
            _add(tar, f"standin/{name}", data)
        for directory in ("tmp", "work", "sys", "proc", "dev", "etc"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
    return buffer.getvalue()


def import_standin_images(client, modes=("ok", "failed", "slow", "killed", "noengine", "plugin")) -> dict[str, str]:
    images = {}
    for mode in modes:
        tag = f"standin-trtexec:{mode}"
        client.api.import_image_from_data(
            standin_image_tar(mode), repository="standin-trtexec", tag=mode, changes=["ENV PATH=/usr/local/bin:/bin"]
        )
        images[mode] = tag
    return images
