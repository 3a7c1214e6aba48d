"""Table files rewritten in place while a model serves, and stubs killed under load.

The demo lookup model (two CPU instances) is served from an operator's ps.json whose tables lie
outside the model repository, as ``hps repo`` serves a training job's output: Triton never sees
those files, so a load of the unchanged model folder alone would change nothing. Client threads
send lookups continuously and check every answer against the table files: each must equal the
rows of the files as they were before the rewrite, or as they are after it, nothing else.

- ``hps reload`` after ``emb_vector`` of table 0 is overwritten in place (same size, new
  values): every answer sent before it equals the old files, every answer sent after it the
  new ones, none fails; the unchanged table is attached again, not rebuilt.
- A stub killed after the rewrite, with no reload: the stub watchdog's restart serves the files
  as they are (the host tier is built from them), which the model did not serve before, and
  says so: an ERROR line naming the table and the file, and ``hps_files_changed_at_restart``.
- A stub killed under load: Triton 2.51 keeps the dead stub's model version loaded for good
  and never waits for its stubs, so they stay its zombies while it runs; the stop unloads
  every model and ends the server without its exit timeout ("Exit timeout expired"), and no
  process, zombie, ``/dev/shm`` entry or load record is left.
"""

from __future__ import annotations

import compileall
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from private_shm import private_shm_dir, python_backend_regions

from hps_core.cli.main import main
from hps_core.demo.embedding import NAME, TABLES, write_embedding_demo
from hps_core.formats.sparse import VECTOR_FILE
from hps_core.server.control import ControlInfo, write_control_file
from hps_core.server.process import TritonServer, process_group_members
from hps_core.server.stub_watchdog import stub_processes
from hps_core.tiers.shm_segment import remove_stale_segments
from hps_core.triton_repo import ServingOptions

pytestmark = pytest.mark.integration

KEYS_PER_TABLE = 26  # the demo's maxnum_catfeature_query_per_table_per_sample
RECOVERY_S = 30.0
RELEASE_S = 45.0  # a reload to the old stub's release: at most the watchdog's max_wait_s (30 s)


def _tables_now(tables: Path) -> list[np.ndarray]:
    """The vectors of each demo table as its files hold them now (keys are 0..rows-1)."""
    return [
        np.fromfile(tables / f"table{i}" / VECTOR_FILE, dtype="<f4").reshape(rows, dim)
        for i, (rows, dim) in enumerate(TABLES)
    ]


class Load:
    """Client threads that send lookups until stopped and check every answer.

    Args:
        url: the server's gRPC address.
        versions: name -> each table's vectors; every answer must equal one version's rows.
        threads: how many clients.
    """

    def __init__(self, url: str, versions: dict[str, list[np.ndarray]], threads: int = 3) -> None:
        self.versions = versions
        self.answers: list[tuple[float, float, str]] = []  # (sent, answered, version)
        self.failures: list[str] = []
        self._done = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(url, seed)) for seed in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, url: str, seed: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        rng = np.random.default_rng(seed)
        while not self._done.is_set():
            keys = [rng.integers(0, rows, KEYS_PER_TABLE) for rows, _ in TABLES]
            sent = time.monotonic()
            try:
                got = infer(client, keys)
            except Exception as exc:  # any failure counts, whatever raised it
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            for name, vectors in self.versions.items():
                if np.array_equal(got, expected(vectors, keys)):
                    self.answers.append((sent, time.monotonic(), name))
                    break
            else:
                self.failures.append(f"answer equals no version of the files, keys {keys}")

    def stop(self) -> None:
        """Stop the clients and wait for them."""
        self._done.set()
        for thread in self._threads:
            thread.join()

    def sent(self, after: float = 0.0, before: float = float("inf")) -> set[str]:
        """The versions answered to requests sent in ``(after, before)``."""
        return {v for sent, _, v in self.answers if after < sent < before}


def infer(client: grpcclient.InferenceServerClient, keys: list[np.ndarray]) -> np.ndarray:
    flat = np.concatenate(keys)[None, :].astype(np.int64)
    numkeys = np.array([[len(k) for k in keys]], dtype=np.int32)
    inputs = [
        grpcclient.InferInput("KEYS", list(flat.shape), "INT64"),
        grpcclient.InferInput("NUMKEYS", list(numkeys.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(flat)
    inputs[1].set_data_from_numpy(numkeys)
    return client.infer(NAME, inputs).as_numpy("OUTPUT0")[0]


def expected(vectors: list[np.ndarray], keys: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([vectors[t][k].reshape(-1) for t, k in enumerate(keys)])


@pytest.fixture
def served(triton_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``(server, tables folder, shared-memory folder)``: the demo model from a ps.json beside
    its tables, outside the repository, served as ``hps serve`` runs it (watchdog on, control
    file written, its repository's bytecode compiled as after a first start)."""
    monkeypatch.setenv("HPS_RUNTIME_DIR", str(tmp_path / "run"))
    shm = private_shm_dir(tmp_path, monkeypatch)
    training = write_embedding_demo(tmp_path / "training", ServingOptions())
    repo = tmp_path / "repo"
    assert main(["repo", str(training / "ps.json"), str(repo), "--instances", "2"]) == 0
    assert compileall.compile_dir(repo, quiet=1)
    server = triton_server(
        repo, startup_timeout_s=180, stub_watchdog=True,
        on_stopped=[lambda _: remove_stale_segments()],
    )  # fmt: skip
    write_control_file(
        server.ports.http,
        ControlInfo(os.getpid(), server.http_url, server.control_token, None, str(repo)),
    )
    return server, training / "data", shm


def rewrite_in_place(tables: Path) -> list[np.ndarray]:
    """Overwrite table 0's vectors in place (same file, same size, new values); the tables as
    they are then."""
    old = _tables_now(tables)
    with open(tables / "table0" / VECTOR_FILE, "r+b") as f:
        f.write((old[0] * np.float32(-2.0) + np.float32(1.0)).astype("<f4").tobytes())
    new = _tables_now(tables)
    assert not np.array_equal(new[0], old[0]) and np.array_equal(new[1], old[1])
    return new


def _log(server: TritonServer) -> str:
    assert server.log_path is not None
    return server.log_path.read_text()


def _model_stubs(server: TritonServer) -> list[int]:
    return sorted(pid for pid, model in stub_processes(server.pid).items() if model == NAME)


def test_a_reload_serves_tables_rewritten_in_place_from_then_on(served, capsys) -> None:
    server, tables, _ = served
    old = _tables_now(tables)
    load = Load(server.grpc_url, {"old": old})
    time.sleep(1.0)
    new = rewrite_in_place(tables)
    load.versions["new"] = new
    written = time.monotonic()
    time.sleep(1.5)  # served meanwhile: still the old rows (the host tier holds its own copy)
    capsys.readouterr()
    started = time.monotonic()
    code = main(["reload", NAME, "--http-port", str(server.ports.http), "--timeout", "120"])
    switched = time.monotonic()
    out, err = capsys.readouterr()
    time.sleep(1.0)
    load.stop()

    assert code == 0, err
    assert not load.failures, load.failures[:3]
    seconds = float(re.search(rf"model '{NAME}': loaded in ([0-9.]+) s", out).group(1))
    assert seconds > 0.5, out  # a load that happened (Triton skips one of an unchanged folder)
    assert load.sent(before=started) == {"old"}, "the old rows until the reload"
    assert load.sent(after=written, before=started) == {"old"}, "a rewrite alone changes nothing"
    assert load.sent(after=switched) == {"new"}, "the new rows from the reload on"
    assert server.stub_reloads == []  # the old instances' exit is no crash
    print(f"\n{len(load.answers)} answers checked; {out.strip()}")

    # Each instance read the rewritten table again; the other was attached again, not rebuilt.
    log = _log(server)
    assert re.search(
        rf"model '{NAME}' version 1: read again 1 file changed since its last load: "
        rf"table 'table0' \(sparse_files\[0\]\): {re.escape(str(tables / 'table0'))}/emb_vector",
        log,
    ), log[-3000:]
    assert len(re.findall(r"host tier: built \S+/table0 ", log)) == 2
    assert len(re.findall(r"host tier: built \S+/table1 ", log)) == 1
    assert "hps ERROR" not in log


def test_a_restart_after_files_changed_without_a_reload_serves_them_and_says_so(served) -> None:
    server, tables, _ = served
    old = _tables_now(tables)
    load = Load(server.grpc_url, {"old": old})
    time.sleep(1.0)
    load.versions["new"] = rewrite_in_place(tables)
    time.sleep(1.5)
    stubs = _model_stubs(server)
    assert len(stubs) == 2
    killed = time.monotonic()
    os.kill(stubs[0], signal.SIGKILL)
    deadline = killed + RECOVERY_S
    while not server.stub_reloads and time.monotonic() < deadline:
        time.sleep(0.2)
    recovered = time.monotonic()
    time.sleep(1.5)
    load.stop()

    assert server.stub_reloads == [NAME]
    print(
        f"\n{len(load.answers)} answers checked, {len(load.failures)} failed (dead stub); "
        f"the new rows {recovered - killed:.1f} s after the kill"
    )
    assert load.sent(before=killed) == {"old"}, "no reload: the old rows until the stub died"
    assert load.sent(after=recovered) == {"new"}, "the restart serves the files as they are"
    # Requests routed to the dead stub fail until the restart; no answer is wrong.
    assert all("not healthy" in f for f in load.failures), load.failures[:3]

    # Said loudly: an ERROR naming the table and the file, and a gauge per new instance.
    log = _log(server)
    lines = re.findall(r"hps ERROR (model .*)", log)
    assert len(lines) == 2, lines  # one per restarted instance
    for said in lines:
        assert f"model '{NAME}' version 1" in said and "restarted after a stub process" in said
        assert f"table 'table0' (sparse_files[0]): {tables / 'table0'}/emb_vector: modif" in said
        assert "table1" not in said and f"hps reload {NAME}" in said
    gauge = re.compile(r'hps_files_changed_at_restart\{[^}]*instance="([^"]+)"[^}]*\} (\S+)')
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with urllib.request.urlopen(server.metrics_url, timeout=10) as reply:
            found = dict(gauge.findall(reply.read().decode()))
        if len(found) == 2:
            break
        time.sleep(0.5)
    assert sorted(found.values()) == ["1", "1"], found


def test_killed_stubs_leave_nothing_and_the_stop_ends_without_the_exit_timeout(served) -> None:
    server, tables, shm = served
    records = server._load_records
    assert records is not None and records.is_dir()
    regions = server._shm_prefix
    load = Load(server.grpc_url, {"files": _tables_now(tables)})
    time.sleep(1.0)
    stubs = _model_stubs(server)
    os.kill(stubs[0], signal.SIGKILL)
    killed = time.monotonic()
    deadline = killed + RECOVERY_S + RELEASE_S
    while time.monotonic() < deadline and not (
        server._watchdog is not None and server._watchdog.released
    ):
        time.sleep(0.2)
    time.sleep(1.0)
    load.stop()
    assert server._watchdog is not None and server._watchdog.released == [stubs[1]]
    assert all("not healthy" in f for f in load.failures), load.failures[:3]
    assert load.sent(after=killed + 1) == {"files"}

    # While Triton runs, the stubs of the version it never unloads stay its zombies (only it
    # may wait for them): the killed one and the one the watchdog released. Nothing else.
    zombies = {
        c.pid for c in psutil.Process(server.pid).children() if c.status() == psutil.STATUS_ZOMBIE
    }
    assert zombies == set(stubs)
    assert len(_model_stubs(server)) == 2  # the new instances

    started = time.monotonic()
    assert server.stop() == 0
    took = time.monotonic() - started
    log = _log(server)
    assert "Exit timeout expired" not in log and "failed to stop server" not in log, log[-2000:]
    assert took < 5.0, f"the stop took {took:.1f} s: Triton's exit timeout was waited for"
    print(
        f"\n{len(load.answers)} answers checked, {len(load.failures)} failed (dead stub); "
        f"zombies while serving: {sorted(zombies)}; stop took {took:.1f} s"
    )
    assert not process_group_members(server.pid)
    deadline = time.monotonic() + 20  # orphaned zombies are the init process's to reap
    while any(psutil.pid_exists(p) for p in stubs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(psutil.pid_exists(p) for p in stubs)
    assert list(shm.iterdir()) == [] and python_backend_regions(regions) == []
    assert not records.exists()
