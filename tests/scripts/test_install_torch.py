"""scripts/install_torch.py, `make setup`'s torch: PyTorch's CPU wheel index where it answers,
else pip's own indexes with one line saying so — within seconds, whatever the network does. The
indexes here are loopback servers: one that serves, one that refuses, one that never answers."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@pytest.fixture(scope="module")
def install_torch(import_script):
    return import_script("install_torch")


class _Index(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the standard library's name)
        self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
        self.end_headers()
        self.wfile.write(b"<html></html>")

    def log_message(self, *args):
        pass


@pytest.fixture
def index():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()


@pytest.fixture
def silent():
    """A port that accepts connections and never answers (a firewall that drops, a hung proxy)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/whl/cpu"
    listener.close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_index_that_serves_torch_is_reachable_and_others_say_why_not_within_the_probe(install_torch, index, silent):
    assert install_torch.reachable(index) is None
    assert install_torch.reachable(index.replace("/whl/cpu", "/whl/nothing")) == "HTTP 404"
    assert "refused" in install_torch.reachable(f"http://127.0.0.1:{closed_port()}/whl/cpu").lower()
    started = time.monotonic()
    assert install_torch.reachable(silent, timeout_s=0.5) == "no answer in 0.5 s"
    assert time.monotonic() - started < 3


def test_a_socket_that_times_out_first_is_worded_as_the_probe_that_gave_up(install_torch, monkeypatch):
    """The socket's time-out and the probe's own race on a silent index; a loaded host lets either win."""

    def times_out(url, timeout):
        raise urllib.error.URLError(TimeoutError("timed out"))

    monkeypatch.setattr(install_torch.urllib.request, "urlopen", times_out)
    assert install_torch.reachable("http://127.0.0.1:9/whl/cpu", timeout_s=0.5) == "no answer in 0.5 s"

    def read_times_out(url, timeout):
        raise TimeoutError("The read operation timed out")

    monkeypatch.setattr(install_torch.urllib.request, "urlopen", read_times_out)
    assert install_torch.reachable("http://127.0.0.1:9/whl/cpu", timeout_s=2) == "no answer in 2 s"


def test_pip_gets_the_index_where_it_answers_and_pips_own_indexes_with_one_line_where_not(
    install_torch, index, silent, capsys, monkeypatch
):
    calls = []
    monkeypatch.setattr(install_torch.subprocess, "call", lambda command: calls.append(command) or 0)
    # A serving index gets the whole probe (a loaded CI host may take over half a second to answer
    # a loopback request); the silent one half a second, for a test of seconds.
    monkeypatch.setattr(install_torch, "PROBE_S", 10.0)
    monkeypatch.setattr(install_torch, "nvidia_gpu", lambda: None)
    monkeypatch.setattr(install_torch, "installed_torch", lambda python: None)  # nothing said after pip
    packages = ["torch==2.13.0", "torchvision==0.28.0"]
    assert install_torch.main(["--python", "py", "--index", index, *packages]) == 0
    assert calls[-1] == ["py", "-m", "pip", "install", "-q", *packages, "--index-url", index]
    assert capsys.readouterr().err == f"setup: torch from {index}\n"

    monkeypatch.setattr(install_torch, "PROBE_S", 0.5)
    started = time.monotonic()
    assert install_torch.main(["--python", "py", "--index", silent, *packages]) == 0
    assert time.monotonic() - started < 3  # the probe's half second, not pip's retries
    assert calls[-1] == ["py", "-m", "pip", "install", "-q", *packages]
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"setup: the default torch index {silent} cannot be reached (no answer in 0.5 s); installing torch==2.13.0 "
        "torchvision==0.28.0 from pip's own indexes instead"
    )

    assert install_torch.main(["--python", "py", "--index", "", "torch"]) == 0  # TORCH_INDEX= : pip's own, nothing said
    assert calls[-1] == ["py", "-m", "pip", "install", "-q", "torch"] and capsys.readouterr().err == ""


PAIR = ["torch==2.13.0", "torchvision==0.28.0"]


@pytest.fixture
def pip(install_torch, monkeypatch):
    """pip and the machine stubbed: the pip commands run, a machine without a GPU, torch as pip left it."""
    calls = []
    monkeypatch.setattr(install_torch.subprocess, "call", lambda command: calls.append(command) or 0)
    monkeypatch.setattr(install_torch, "PROBE_S", 10.0)  # a serving index answers well within it, however loaded the host
    monkeypatch.setattr(install_torch, "nvidia_gpu", lambda: None)
    monkeypatch.setattr(install_torch, "installed_torch", lambda python: ("2.13.0+cpu", None))
    monkeypatch.setattr(install_torch, "torchvision_fails", lambda python: None)
    return calls


def test_an_index_the_user_named_is_used_or_the_set_up_fails(install_torch, pip, index, silent, capsys, monkeypatch):
    monkeypatch.setattr(install_torch, "PROBE_S", 0.5)
    assert install_torch.main(["--python", "py", "--index", silent, "--named", *PAIR]) == 1
    assert pip == []  # nothing installed from another index
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR TORCH_INDEX={silent} cannot be reached (no answer in 0.5 s): the set-up stops rather than install")
    assert "\nTIP check the URL and the network" in err
    monkeypatch.setattr(install_torch, "PROBE_S", 10.0)
    assert install_torch.main(["--python", "py", "--index", index, "--named", *PAIR]) == 0
    assert pip[-1][-2:] == ["--index-url", index]
    assert capsys.readouterr().err == f"setup: torch from {index}\nsetup: torch 2.13.0+cpu (the CPU build); torchvision imports beside it\n"


def test_a_gpu_machine_keeps_its_cuda_torch_or_gets_one(install_torch, pip, index, capsys, monkeypatch):
    monkeypatch.setattr(install_torch, "nvidia_gpu", lambda: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    monkeypatch.setattr(install_torch, "installed_torch", lambda python: ("2.13.0+cu128", "12.8"))
    assert install_torch.main(["--python", "py", "--index", index, *PAIR]) == 0
    assert pip == []
    assert "setup: keeping torch 2.13.0+cu128, the CUDA 12.8 build already installed (GPU 0: NVIDIA H100" in capsys.readouterr().err

    monkeypatch.setattr(install_torch, "installed_torch", lambda python: ("2.13.0+cpu", None))
    assert install_torch.main(["--python", "py", "--index", index, *PAIR]) == 0
    assert pip[-1] == ["py", "-m", "pip", "install", "-q", *PAIR]  # pip's own indexes: PyPI's Linux torch is the CUDA build
    assert "the CUDA build of torch from pip's own indexes" in capsys.readouterr().err


def test_a_pair_that_does_not_import_is_said_after_the_install(install_torch, pip, index, capsys, monkeypatch):
    monkeypatch.setattr(install_torch, "torchvision_fails", lambda python: "RuntimeError: operator torchvision::nms does not exist")
    assert install_torch.main(["--python", "py", "--index", index, *PAIR]) == 0
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("setup: WARNING torch 2.13.0+cpu (the CPU build) with a torchvision that does not import beside it")
    assert "timm models work, torchvision's own ops do not; `pipeline doctor` prints the command that fixes the pair" in last
