"""TritonServer lifecycle against the stand-in tritonserver of conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from hps_core.server.ports import listening_ports, pick_free_ports
from hps_core.server.process import (
    DEFAULT_EXIT_TIMEOUT_S,
    ServerError,
    ServerStartError,
    TritonServer,
    process_group_members,
)


def _live(pids: list[int]) -> list[int]:
    """Pids that exist and are not zombies, asked pid by pid (not by process group)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _server(fake_triton, model_repository: Path, tmp_path: Path, **options) -> TritonServer:
    options.setdefault("log_file", tmp_path / "server.log")
    options.setdefault("startup_timeout_s", 20)
    return TritonServer(model_repository, installation=fake_triton.installation, **options)


def test_start_passes_options_and_environment(fake_triton, model_repository, tmp_path, monkeypatch):
    monkeypatch.setenv("HPS_FAKE_UNSET", "present")
    server = _server(
        fake_triton,
        model_repository,
        tmp_path,
        log_verbose=2,
        env={"HPS_FAKE_SET": "yes", "HPS_FAKE_UNSET": None},
        extra_args=["--model-control-mode=explicit"],
    )
    with server:
        ports = server.ports
        assert len({ports.http, ports.grpc, ports.metrics}) == 3
        assert server.http_url == f"http://127.0.0.1:{ports.http}"
        assert server.grpc_url == f"127.0.0.1:{ports.grpc}"
        assert server.metrics_url == f"http://127.0.0.1:{ports.metrics}/metrics"
        with urllib.request.urlopen(server.http_url + "/v2/health/ready", timeout=5) as resp:
            assert resp.status == 200
    (launch,) = fake_triton.launches()
    argv = launch["argv"]
    assert argv[0] == str(fake_triton.installation.tritonserver)
    assert tuple(argv) == server.command
    expected = {
        f"--model-repository={model_repository.resolve()}",
        f"--backend-directory={fake_triton.installation.backend_directory}",
        f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--log-verbose=2",
        f"--exit-timeout-secs={DEFAULT_EXIT_TIMEOUT_S}",
    }
    assert expected <= set(argv)
    assert argv[-1] == "--model-control-mode=explicit"  # extra args come last and unchanged
    env = launch["env"]
    # The stub runs the first python3 on PATH: it must be this interpreter's folder.
    assert env["PATH"].split(":")[0] == str(Path(sys.prefix) / "bin")
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(
        fake_triton.installation.stub_library_dirs[0]
    )
    assert env["HPS_FAKE_SET"] == "yes"
    assert env["HPS_FAKE_UNSET"] is None


def test_user_exit_timeout_replaces_the_default(fake_triton, model_repository, tmp_path):
    server = _server(fake_triton, model_repository, tmp_path, extra_args=["--exit-timeout-secs=9"])
    with server:
        pass
    argv = fake_triton.launches()[0]["argv"]
    assert [a for a in argv if a.startswith("--exit-timeout-secs")] == ["--exit-timeout-secs=9"]


def test_stop_kills_the_whole_process_group(fake_triton, model_repository, tmp_path):
    stopped_seen: list[list[int]] = []
    server = _server(fake_triton, model_repository, tmp_path)
    server.on_stopped.append(lambda s: stopped_seen.append(process_group_members(pgid)))
    server.start()
    pgid = server.pid
    members = process_group_members(pgid)
    assert pgid in members and len(members) >= 2  # the server and its "stub"
    assert _live(members) == members
    assert server.is_running
    code = server.stop()
    assert code == 0  # the fake exits 0 on SIGTERM; its stub ignored SIGTERM
    assert _live(members) == []
    assert stopped_seen == [[]]  # callbacks run once, after every process is gone
    assert not server.is_running and server.returncode == 0
    assert server.pid == pgid  # still known after stop, to inspect the group
    assert server.stop() == 0  # idempotent; callbacks not run again
    assert len(stopped_seen) == 1


def test_server_ignoring_sigterm_is_killed_after_stop_timeout(
    fake_triton, model_repository, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_MODE", "ignore_term")
    server = _server(fake_triton, model_repository, tmp_path, stop_timeout_s=0.5)
    server.start()
    members = process_group_members(server.pid)
    started = time.monotonic()
    assert server.stop() == -9
    assert time.monotonic() - started < 5
    assert _live(members) == []


def test_shared_memory_regions_with_the_server_prefix_are_removed(
    fake_triton, model_repository, tmp_path
):
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    with _server(fake_triton, model_repository, tmp_path) as server:
        option = next(a for a in server.command if "shm-region-prefix-name=" in a)
        prefix = option.split("shm-region-prefix-name=")[1]
        region = Path("/dev/shm") / f"{prefix}fake-region"
        assert region.exists()
    assert not region.exists()


def test_early_exit_raises_with_log_tail(fake_triton, model_repository, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "exit")
    server = _server(fake_triton, model_repository, tmp_path)
    with pytest.raises(ServerStartError) as info:
        server.start()
    message = str(info.value)
    assert "exited with code 3 before it was ready" in message
    assert "No module named 'nothere'" in message
    assert str(server.log_path) in message
    assert not info.value.port_conflict
    assert server.returncode == 3 and not server.is_running


def test_http_ready_alone_is_not_ready(fake_triton, model_repository, tmp_path, monkeypatch):
    # Like Triton when its metrics port is taken: HTTP says ready, then the server exits.
    monkeypatch.setenv("FAKE_MODE", "metrics_bind_fails")
    http, grpc, metrics = pick_free_ports(3)
    server = _server(
        fake_triton,
        model_repository,
        tmp_path,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
    )
    with pytest.raises(ServerStartError, match="exited with code 1"):
        server.start()
    assert len(fake_triton.launches()) == 1  # fixed ports: no retry


def test_disabled_metrics_are_not_waited_for(fake_triton, model_repository, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "no_metrics")
    server = _server(
        fake_triton, model_repository, tmp_path, extra_args=["--allow-metrics", "false"]
    )
    with server:
        assert server.ports.metrics not in listening_ports(server.pid)
        assert server.ports.grpc in listening_ports(server.pid)


def test_port_conflict_retries_with_new_ports(fake_triton, model_repository, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "port_taken_once")
    with _server(fake_triton, model_repository, tmp_path) as server:
        assert server.is_running
    first, second = fake_triton.launches()
    assert first["argv"] != second["argv"]  # fresh ports for the second attempt


def test_startup_timeout_stops_the_server(fake_triton, model_repository, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "never_ready")
    server = _server(fake_triton, model_repository, tmp_path, startup_timeout_s=1.0)
    with pytest.raises(ServerStartError, match=r"not ready after 1 s"):
        server.start()
    assert not server.is_running
    assert server.returncode == 0  # stopped with SIGTERM, not left running


def test_log_to_stdout(fake_triton, model_repository, tmp_path, capfd):
    server = _server(fake_triton, model_repository, tmp_path, log_file=None, log_to_stdout=True)
    with server:
        assert server.log_path is None
    assert "fake tritonserver starting" in capfd.readouterr().out


def test_default_log_file_is_created(fake_triton, model_repository, tmp_path):
    server = _server(fake_triton, model_repository, tmp_path, log_file=None)
    with server:
        pass
    try:
        assert "fake tritonserver starting" in server.log_tail()
    finally:
        server.log_path.unlink()


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"extra_args": ["--http-port=9000"]}, "--http-port is set by the launcher"),
        ({"extra_args": ["--backend-directory", "/x"]}, "--backend-directory is set by"),
        ({"extra_args": ["--allow-http=false"]}, "--allow-http must stay on"),
        ({"grpc_port": 70000}, "TritonServer.grpc_port: 70000 is not a TCP port"),
        ({"log_verbose": -1}, "TritonServer.log_verbose: -1 is negative"),
        ({"startup_timeout_s": 0}, "TritonServer.startup_timeout_s"),
        ({"log_to_stdout": True}, "log_file and log_to_stdout exclude each other"),
    ],
)
def test_invalid_options_are_refused(fake_triton, model_repository, tmp_path, options, fragment):
    server = _server(fake_triton, model_repository, tmp_path, **options)
    with pytest.raises(ServerError, match=fragment.replace("-", r"\-")):
        server.start()
    assert fake_triton.launches() == []


def test_missing_model_repository(fake_triton, tmp_path):
    server = _server(fake_triton, tmp_path / "nowhere", tmp_path)
    with pytest.raises(ServerError, match="nowhere: model repository is not a directory"):
        server.start()


def test_ports_before_start_is_an_error(fake_triton, model_repository, tmp_path):
    server = _server(fake_triton, model_repository, tmp_path)
    with pytest.raises(ServerError, match="has not been started"):
        _ = server.http_url
    assert server.stop() is None and server.pid is None


def test_start_twice_is_refused(fake_triton, model_repository, tmp_path):
    with (
        _server(fake_triton, model_repository, tmp_path) as server,
        pytest.raises(ServerError, match="already running"),
    ):
        server.start()


def test_several_servers_in_a_row_and_side_by_side(fake_triton, model_repository, tmp_path):
    pgids = []
    for i in range(3):
        with (
            _server(fake_triton, model_repository, tmp_path, log_file=tmp_path / f"a{i}.log") as a,
            _server(fake_triton, model_repository, tmp_path, log_file=tmp_path / f"b{i}.log") as b,
        ):
            assert set(vars(a.ports).values()).isdisjoint(vars(b.ports).values())
            pgids += [a.pid, b.pid]
    assert all(process_group_members(pgid) == [] for pgid in pgids)


def test_wildcard_host_is_reached_through_loopback(fake_triton, model_repository, tmp_path):
    wildcard = _server(fake_triton, model_repository, tmp_path, host="0.0.0.0")
    with wildcard:
        assert wildcard.http_url.startswith("http://127.0.0.1:")
        assert "--http-address=0.0.0.0" in wildcard.command


def test_backend_regions_of_exited_launchers_are_removed(tmp_path: Path) -> None:
    """The Python backend's regions carry their launcher's pid: after a launcher's kill -9
    (its tritonserver dies with it) the next launch removes them, and only them."""
    from hps_core.server.process import remove_stale_backend_regions

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(done.stdout)
    ns = os.stat("/proc/self/ns/pid").st_ino
    names = [
        f"triton_python_backend_shm_region_hps{ns}n{dead}p1a2b3c4d_dlrm_0_0",
        f"triton_python_backend_shm_region_hps{ns}n{os.getpid()}p00ff00ff_dlrm_0_0",
        # Another container sharing /dev/shm: its pids are not ours to judge.
        f"triton_python_backend_shm_region_hps{ns + 1}n{dead}p1a2b3c4d_dlrm_0_0",
        "triton_python_backend_shm_region_1",  # another server's own prefix
        "triton_python_backend_shm_region_hps0123456789ab_x",  # no pid: left alone
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert remove_stale_backend_regions(tmp_path) == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


def test_each_server_gets_a_folder_of_load_records_removed_at_its_stop(
    fake_triton, model_repository, tmp_path
):
    server = _server(fake_triton, model_repository, tmp_path)
    with server:
        folder = Path(fake_triton.launches()[0]["env"]["HPS_LOAD_RECORDS"])
        assert folder.is_dir() and folder.name.startswith("hps-triton-loads-")
        assert f"n{os.getpid()}p" in folder.name  # its launcher, as the regions name it
    assert not folder.exists()


def test_load_records_of_exited_launchers_are_removed(tmp_path: Path) -> None:
    from hps_core.server.process import remove_stale_load_records

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(done.stdout)
    ns = os.stat("/proc/self/ns/pid").st_ino
    names = [
        f"hps-triton-loads-{ns}n{dead}pab12",
        f"hps-triton-loads-{ns}n{os.getpid()}pcd34",
        f"hps-triton-loads-{ns + 1}n{dead}pef56",  # another container's
    ]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "dlrm.1.json").write_text("{}")
    assert remove_stale_load_records(tmp_path) == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


@pytest.mark.parametrize(
    ("args", "seconds"),
    [((), DEFAULT_EXIT_TIMEOUT_S), (("--exit-timeout-secs=9",), 9.0),
     (("--exit-timeout-secs", "12"), 12.0), (("--exit-timeout-secs=x",), DEFAULT_EXIT_TIMEOUT_S)],
)  # fmt: skip
def test_the_exit_timeout_a_stranded_stop_waits_at_most(args, seconds) -> None:
    from hps_core.server.process import _exit_timeout

    assert _exit_timeout(args) == seconds
