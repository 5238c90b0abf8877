"""scripts/install_torch.py, `make setup`'s torch: PyTorch's CPU wheel index where it answers,
else pip's own indexes with one line saying so — within seconds, whatever the network does. The
indexes here are loopback servers: one that serves, one that refuses, one that never answers."""

from __future__ import annotations

import socket
import threading
import time
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
    assert install_torch.reachable(silent, timeout_s=0.5) is not None
    assert time.monotonic() - started < 3


def test_pip_gets_the_index_where_it_answers_and_pips_own_indexes_with_one_line_where_not(
    install_torch, index, silent, capsys, monkeypatch
):
    calls = []
    monkeypatch.setattr(install_torch.subprocess, "call", lambda command: calls.append(command) or 0)
    monkeypatch.setattr(install_torch, "PROBE_S", 0.5)
    packages = ["torch==2.13.0", "torchvision==0.28.0"]
    assert install_torch.main(["--python", "py", "--index", index, *packages]) == 0
    assert calls[-1] == ["py", "-m", "pip", "install", "-q", *packages, "--index-url", index]
    assert capsys.readouterr().err == f"setup: torch from {index}\n"

    started = time.monotonic()
    assert install_torch.main(["--python", "py", "--index", silent, *packages]) == 0
    assert time.monotonic() - started < 3  # the probe's half second, not pip's retries
    assert calls[-1] == ["py", "-m", "pip", "install", "-q", *packages]
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"setup: {silent} cannot be reached (no answer in 0.5 s); installing torch==2.13.0 torchvision==0.28.0 from pip's"
    )

    assert install_torch.main(["--python", "py", "--index", "", "torch"]) == 0  # TORCH_INDEX= : pip's own, nothing said
    assert calls[-1] == ["py", "-m", "pip", "install", "-q", "torch"] and capsys.readouterr().err == ""
