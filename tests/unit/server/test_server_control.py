"""Model control for the operator: control files, the load request, ``hps reload``, ``hps models``.

A stand-in for Triton's repository API (HTTP, token header required) answers the load and
the index; the real switch under load is tests/integration/test_version_switch.py.
"""

from __future__ import annotations

import http.server
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from hps_core.cli.main import main
from hps_core.cli.models import format_index
from hps_core.load_record import RELOAD_PARAMETER, is_restart
from hps_core.server.control import (
    HEADER,
    ControlError,
    ControlInfo,
    control_path,
    load_model,
    read_control_file,
    remove_control_file,
    runtime_dir,
    version_states,
    write_control_file,
)

TOKEN = "0123abcd"


class FakeRepositoryApi(http.server.BaseHTTPRequestHandler):
    """Triton's load and index, version 1 of ``m`` unloading after a load of version 2."""

    loads: ClassVar[list[str]] = []
    bodies: ClassVar[list[dict]] = []
    index_calls: ClassVar[int] = 0

    def do_POST(self) -> None:
        if self.headers.get(HEADER) != TOKEN:
            return self._reply(403, {"error": "This API is restricted"})
        if self.path == "/v2/repository/models/broken/load":
            return self._reply(400, {"error": "failed to load 'broken': no ps.json"})
        if self.path.endswith("/load"):
            type(self).loads.append(self.path.split("/")[-2])
            length = int(self.headers.get("Content-Length", 0))
            type(self).bodies.append(json.loads(self.rfile.read(length) or b"{}"))
            return self._reply(200, None)
        if self.path == "/v2/repository/index":
            cls = type(self)
            cls.index_calls += 1
            entries = [{"name": "m", "version": "2", "state": "READY"}, {"name": "broken"}]
            if cls.loads:  # old version: unloading at first, then gone
                old = "UNLOADING" if cls.index_calls < 3 else "UNAVAILABLE"
                entries.append({"name": "m", "version": "1", "state": old, "reason": "unloaded"})
            return self._reply(200, entries)
        return self._reply(404, {"error": "not found"})

    def _reply(self, code: int, body: object) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_api() -> Iterator[str]:
    FakeRepositoryApi.loads = []
    FakeRepositoryApi.bodies = []
    FakeRepositoryApi.index_calls = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeRepositoryApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "run"
    monkeypatch.setenv("HPS_RUNTIME_DIR", str(path))
    return path


def test_control_file_is_private_and_round_trips(run_dir: Path) -> None:
    info = ControlInfo(os.getpid(), "http://127.0.0.1:8000", TOKEN)
    path = write_control_file(8000, info)
    assert path == run_dir / "serve-8000.json" == control_path(8000)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_control_file(8000) == info
    remove_control_file(path, pid=os.getpid() + 1)  # another server's file: kept
    assert path.exists()
    remove_control_file(path, pid=os.getpid())
    assert not path.exists() and not run_dir.exists()  # the empty folder goes too


def test_a_folder_others_can_read_is_refused(run_dir: Path) -> None:
    run_dir.mkdir(mode=0o755)
    run_dir.chmod(0o755)
    with pytest.raises(ControlError, match="must belong to you with mode 0700"):
        runtime_dir()


def test_missing_or_stale_control_file(run_dir: Path) -> None:
    with pytest.raises(ControlError, match="no hps serve with model control on HTTP port 8123"):
        read_control_file(8123)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone = int(done.stdout)
    path = write_control_file(8123, ControlInfo(gone, "http://127.0.0.1:8123", TOKEN))
    with pytest.raises(ControlError, match=f"pid {gone}\\) has exited; removed the file"):
        read_control_file(8123)
    assert not path.exists()


def test_load_and_index_carry_the_token(fake_api: str) -> None:
    assert load_model(fake_api, TOKEN, "m") >= 0
    assert FakeRepositoryApi.loads == ["m"]
    states = {(s.model, s.version): s.state for s in version_states(fake_api, TOKEN)}
    assert states == {("m", 2): "READY", ("m", 1): "UNLOADING"}
    with pytest.raises(ControlError, match="Triton answered 403: This API is restricted"):
        load_model(fake_api, "wrong", "m")
    with pytest.raises(ControlError, match=r"answered 400: failed to load 'broken': no ps\.json"):
        load_model(fake_api, TOKEN, "broken")


def test_hps_reload_waits_for_the_old_version(fake_api: str, capsys, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\nparameters { key: "ps_json" value { '
        'string_value: "ps.json" } }\n'
    )
    write_control_file(8000, ControlInfo(os.getpid(), fake_api, TOKEN, None, str(repo)))
    assert main(["reload", "m", "--http-port", "8000"]) == 0
    out = capsys.readouterr().out
    assert "model 'm': loaded in" in out and "serving version 2" in out
    assert "model 'm': older versions unloaded" in out
    assert TOKEN not in out
    # Loaded with the folder's config.pbtxt, marked as a load someone asked for: Triton loads
    # it even when the folder did not change, and its instances read changed files again.
    [body] = FakeRepositoryApi.bodies
    config = json.loads(body["parameters"]["config"])
    marker = config["parameters"].pop(RELOAD_PARAMETER)["string_value"]
    assert marker.startswith("load-") and not is_restart(marker)
    assert config == {
        "name": "m", "backend": "python", "max_batch_size": 8,
        "parameters": {"ps_json": {"string_value": "ps.json"}},
    }  # fmt: skip


def test_hps_reload_needs_the_repository_in_the_control_file(fake_api: str, capsys) -> None:
    write_control_file(8000, ControlInfo(os.getpid(), fake_api, TOKEN))  # an older hps serve's
    assert main(["reload", "m", "--http-port", "8000"]) == 1
    assert "names no model repository" in capsys.readouterr().err
    assert FakeRepositoryApi.loads == []


def test_hps_reload_reports_a_failed_load(fake_api: str, capsys, tmp_path: Path) -> None:
    write_control_file(8000, ControlInfo(os.getpid(), fake_api, TOKEN, None, str(tmp_path)))
    assert main(["reload", "broken", "--http-port", "8000", "--no-wait"]) == 1
    err = capsys.readouterr().err
    assert "model 'broken': load failed, the serving version stays" in err
    assert "no ps.json" in err


def test_hps_reload_of_a_model_the_repository_lacks_names_those_it_has(
    fake_api: str, capsys, tmp_path: Path
) -> None:
    write_control_file(8000, ControlInfo(os.getpid(), fake_api, TOKEN, None, str(tmp_path)))
    assert main(["reload", "nosuch", "--http-port", "8000", "--no-wait"]) == 1
    err = capsys.readouterr().err
    assert "model 'nosuch' is not in the served repository; it has: broken, m" in err
    assert FakeRepositoryApi.loads == []


def test_hps_reload_without_a_server(capsys) -> None:
    assert main(["reload", "m", "--http-port", "8124"]) == 1
    assert "no hps serve with model control on HTTP port 8124" in capsys.readouterr().err


def test_hps_models_lists_the_index_with_its_states(fake_api: str, capsys) -> None:
    write_control_file(8000, ControlInfo(os.getpid(), fake_api, TOKEN))
    assert main(["models", "--http-port", "8000"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == ["broken  -  not loaded", "m       2  READY"]
    assert TOKEN not in out


def test_hps_models_without_a_server(capsys) -> None:
    assert main(["models", "--http-port", "8124"]) == 1
    assert "no hps serve with model control on HTTP port 8124" in capsys.readouterr().err


def test_index_lines_keep_a_reason_without_its_stack_frames() -> None:
    entries = [
        {"name": "wdl", "version": "1", "state": "UNAVAILABLE",
         "reason": "Internal: ModuleNotFoundError: No module named 'x'\n\nAt:\n  model.py(1)\n"},
        {"name": "badcfg"},  # Triton could not read its config
        {"name": "dcn", "version": "10", "state": "READY"},
        {"name": "dcn", "version": "9", "state": "UNAVAILABLE", "reason": "unloaded"},
    ]  # fmt: skip
    assert format_index(entries) == [
        "badcfg   -  not loaded",
        "dcn      9  UNAVAILABLE: unloaded",
        "dcn     10  READY",
        "wdl      1  UNAVAILABLE: Internal: ModuleNotFoundError: No module named 'x'",
    ]


def test_hps_serve_publishes_the_control_file_until_it_stops(
    fake_triton, model_repository: Path, run_dir: Path
) -> None:
    env = {**fake_triton.environ("ok"), "HPS_RUNTIME_DIR": str(run_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hps_core.cli.main", "serve", "--no-keep-host-tiers",
         "--model-repository", str(model_repository), "--http-port", "0", "--grpc-port", "0",
         "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        for line in proc.stdout:
            if "hps serve: ready" in line:
                break
        [path] = run_dir.glob("serve-*.json")
        info = json.loads(path.read_text())
        assert info["pid"] == proc.pid and info["http_url"] in line
        assert info["repository"] == str(model_repository.resolve())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        (launch,) = fake_triton.launches()
        restricted = [a for a in launch["argv"] if a.startswith("--http-restricted-api=")]
        assert restricted == [f"--http-restricted-api=model-repository:{HEADER}={info['token']}"]
    finally:
        proc.send_signal(2)
        proc.wait(timeout=20)
    assert not run_dir.exists()
