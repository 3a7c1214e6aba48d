"""A stand-in ``tritonserver`` for testing the launcher without Triton.

It speaks just enough of Triton's contract for the launcher: the same command-line options,
``/v2/health/ready`` over HTTP, listening gRPC and metrics sockets, a child "stub" process in
its process group, and Triton's exit behaviour. ``FAKE_MODE`` picks a misbehaviour.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hps_core.server.install import BACKEND_FILES, STUB_NAME, TritonInstallation

FAKE_TRITONSERVER = r"""
import http.server, json, os, signal, socket, subprocess, sys, threading

opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
mode = os.environ.get("FAKE_MODE", "ok")
record = os.environ["FAKE_RECORD"]
with open(record, "a") as f:
    names = ("PATH", "LD_LIBRARY_PATH", "HPS_FAKE_SET", "HPS_FAKE_UNSET", "HPS_LOAD_RECORDS")
    env = {k: os.environ.get(k) for k in names}
    f.write(json.dumps({"argv": sys.argv, "env": env}) + "\n")
with open(record) as f:
    launches = len(f.readlines())
print("fake tritonserver starting", flush=True)

if mode == "exit":
    print("E model_lifecycle.cc] failed to load 'broken': No module named 'nothere'", flush=True)
    sys.exit(3)
if mode == "port_taken_once" and launches == 1:
    address = opts["http-address"] + ":" + opts["http-port"]
    print(f"E failed to start HTTP service: Socket '{address}' already in use", flush=True)
    sys.exit(1)
if mode == "ignore_term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

prefix = opts.get("backend-config", "").partition("shm-region-prefix-name=")[2]
if prefix and os.path.isdir("/dev/shm"):
    open(f"/dev/shm/{prefix}fake-region", "wb").close()

# A model "stub" that survives its server's SIGTERM, like a hung model process.
subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])

listeners = []
for service in ("grpc", "metrics"):
    if service == "metrics" and mode in ("no_metrics", "metrics_bind_fails"):
        continue
    sock = socket.socket()
    sock.bind((opts[service + "-address"], int(opts[service + "-port"])))
    sock.listen()
    listeners.append(sock)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/v2/health/ready" and mode != "never_ready"
        self.send_response(200 if ok else 400)
        self.end_headers()
    def do_POST(self):  # the repository index: one model, loaded (none in "no_models")
        models = [] if mode == "no_models" else [{"name": "m", "version": "1", "state": "READY"}]
        body = json.dumps(models).encode()
        ok = self.path == "/v2/repository/index"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body) if ok else 0))
        self.end_headers()
        if ok:
            self.wfile.write(body)
    def log_message(self, *args):
        pass

server = http.server.HTTPServer((opts["http-address"], int(opts["http-port"])), Handler)
if mode == "crash_later":
    threading.Timer(1.0, lambda: os._exit(4)).start()
if mode == "metrics_bind_fails":
    # Triton answers ready on HTTP, then fails to bind the metrics port and exits.
    def fail():
        print("E failed to start Metrics service: Socket already in use", flush=True)
        os._exit(1)
    threading.Timer(1.0, fail).start()
server.serve_forever()
"""


@dataclass(frozen=True)
class FakeTriton:
    """A fake installation plus the file where each launch records its argv and env."""

    installation: TritonInstallation
    record: Path
    root: Path

    def launches(self) -> list[dict]:
        """Return one ``{"argv": [...], "env": {...}}`` per launch so far."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def environ(self, mode: str = "ok") -> dict[str, str]:
        """Environment for a child ``hps`` process that should find this fake."""
        return {
            **os.environ,
            "TRITONSERVER": str(self.installation.tritonserver),
            "TRITON_BACKEND_DIR": str(self.installation.backend_directory),
            "FAKE_MODE": mode,
            "FAKE_RECORD": str(self.record),
        }


@pytest.fixture
def fake_triton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTriton:
    """A fake Triton laid out like an NGC image, selected for this test's process."""
    root = tmp_path / "opt" / "tritonserver"
    binary = root / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!{sys.executable}\n{FAKE_TRITONSERVER}")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    python_dir = root / "backends" / "python"
    python_dir.mkdir(parents=True)
    for name in BACKEND_FILES:
        (python_dir / name).write_text("")
    (python_dir / STUB_NAME).write_bytes(b"\0NEEDED libpython%d.%d.so.1.0\0" % sys.version_info[:2])
    libdir = tmp_path / "libpython"
    libdir.mkdir()
    record = tmp_path / "launches.jsonl"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    monkeypatch.setenv("FAKE_MODE", "ok")
    installation = TritonInstallation(
        tritonserver=binary,
        backend_directory=root / "backends",
        cache_directory=None,
        stub_library_dirs=(libdir,),
        source="fake",
    )
    return FakeTriton(installation=installation, record=record, root=root)


@pytest.fixture
def model_repository(tmp_path: Path) -> Path:
    """An empty model repository folder."""
    path = tmp_path / "models"
    path.mkdir()
    return path
