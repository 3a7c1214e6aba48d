"""A served model switched to a new version under load: no request fails, nothing is left.

The demo lookup model (two CPU instances) serves version 1 while client threads send requests
and check every answer against the files of version 1 or 2. Version 2 (changed rows in new
sparse files) is added with ``hps repo --version 2`` and loaded with ``hps reload`` through the
control file ``hps serve`` writes. Afterwards: every request succeeded, requests sent after the
switch get version 2's rows, the stub watchdog did not mistake the old stubs' exit for a crash,
version 1's stubs and host-tier segments are gone while the server still runs, and nothing is
left once it stops.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from private_shm import private_shm_dir, python_backend_regions

from hps_core.cli.main import main
from hps_core.demo.embedding import NAME, TABLES, table_vectors, write_embedding_demo
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.server.control import ControlInfo, write_control_file
from hps_core.server.stub_watchdog import stub_versions
from hps_core.tiers.host_table import segment_name
from hps_core.tiers.shm_segment import SharedSegment, remove_stale_segments
from hps_core.triton_repo import InstanceGroup, ServingOptions

pytestmark = pytest.mark.integration

CHANGED = (5_000, 1_000)  # version 2 changes the first rows of each table
KEYS_PER_TABLE = 26  # the demo's maxnum_catfeature_query_per_table_per_sample
RELEASE_S = 20.0


def _v2_vectors(index: int) -> tuple[np.ndarray, np.ndarray]:
    keys, vectors = table_vectors(index)
    vectors = vectors.copy()
    vectors[: CHANGED[index]] += np.float32(1.0)
    return keys, vectors


def _expected(tables: list[tuple[np.ndarray, np.ndarray]], keys: list[np.ndarray]) -> np.ndarray:
    # The demo's keys are 0..rows-1: a key is its row.
    return np.concatenate([tables[t][1][k].reshape(-1) for t, k in enumerate(keys)])


def _infer(client: grpcclient.InferenceServerClient, keys: list[np.ndarray]) -> np.ndarray:
    flat = np.concatenate(keys)[None, :].astype(np.int64)
    numkeys = np.array([[len(k) for k in keys]], dtype=np.int32)
    inputs = [
        grpcclient.InferInput("KEYS", list(flat.shape), "INT64"),
        grpcclient.InferInput("NUMKEYS", list(numkeys.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(flat)
    inputs[1].set_data_from_numpy(numkeys)
    return client.infer(NAME, inputs).as_numpy("OUTPUT0")[0]


def _draw(rng: np.random.Generator) -> list[np.ndarray]:
    # Half changed rows, half unchanged, per table.
    out = []
    for (rows, _), changed in zip(TABLES, CHANGED, strict=True):
        half = KEYS_PER_TABLE // 2
        out.append(
            np.concatenate([rng.integers(0, changed, half), rng.integers(changed, rows, half)])
        )
    return out


def _segment_files(sparse_dirs: list[Path]) -> list[Path]:
    return [
        SharedSegment(segment_name(path, dim)).data_path
        for path, (_, dim) in zip(sparse_dirs, TABLES, strict=True)
    ]


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_switch_to_a_new_version_under_load(
    triton_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("HPS_RUNTIME_DIR", str(tmp_path / "run"))
    repo = tmp_path / "repo"
    folder = write_embedding_demo(
        repo, ServingOptions(instances=(InstanceGroup(count=2, kind="KIND_CPU"),))
    )
    v1_tables = [table_vectors(i) for i in range(len(TABLES))]
    v2_tables = [_v2_vectors(i) for i in range(len(TABLES))]
    v1_dirs = [folder / "data" / f"table{i}" for i in range(len(TABLES))]
    v2_dirs = [tmp_path / "retrained" / f"table{i}" for i in range(len(TABLES))]
    shm = private_shm_dir(tmp_path, monkeypatch)  # the server's host-tier segments

    # As hps serve runs it: watchdog and model control on, its control file written.
    server = triton_server(
        repo, startup_timeout_s=180, stub_watchdog=True,
        on_stopped=[lambda _: remove_stale_segments()],
    )  # fmt: skip
    regions = server._shm_prefix
    write_control_file(
        server.ports.http,
        ControlInfo(os.getpid(), server.http_url, server.control_token, None, str(repo)),
    )
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rng = np.random.default_rng(7)
    keys = _draw(rng)
    np.testing.assert_array_equal(_infer(client, keys), _expected(v1_tables, keys))
    v1_stubs = {pid for pid, (model, v) in stub_versions(server.pid).items() if model == NAME}
    assert len(v1_stubs) == 2 and all(v == 1 for _, v in stub_versions(server.pid).values())
    assert all(path.exists() for path in _segment_files(v1_dirs))

    # Version 2: retrained sparse files, its own ps.json, same serving options.
    for path, (k, v) in zip(v2_dirs, v2_tables, strict=True):
        write_sparse_table(path, k, v)
    ps = json.loads((folder / "ps.json").read_text())
    ps["models"][0]["sparse_files"] = [str(p) for p in v2_dirs]
    ps2 = tmp_path / "retrained" / "ps.json"
    ps2.write_text(json.dumps(ps))
    config_before = (folder / "config.pbtxt").read_text()
    assert main(["repo", str(ps2), str(repo), "--version", "2"]) == 0
    assert (folder / "config.pbtxt").read_text() == config_before
    assert json.loads((folder / "2" / "ps.json").read_text())["models"][0]["sparse_files"] == [
        str(p) for p in v2_dirs
    ]

    # Load from three client threads; each answer must be all version 1 or all version 2.
    failures: list[str] = []
    answers: list[tuple[float, float, int]] = []  # (sent, answered, version)
    done = threading.Event()

    def load(seed: int) -> None:
        own = grpcclient.InferenceServerClient(server.grpc_url)
        gen = np.random.default_rng(seed)
        while not done.is_set():
            k = _draw(gen)
            sent = time.monotonic()
            try:
                got = _infer(own, k)
            except Exception as exc:  # any failure counts, whatever raised it
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if np.array_equal(got, _expected(v2_tables, k)):
                answers.append((sent, time.monotonic(), 2))
            elif np.array_equal(got, _expected(v1_tables, k)):
                answers.append((sent, time.monotonic(), 1))
            else:
                failures.append(f"answer equals neither version for keys {k}")

    workers = [threading.Thread(target=load, args=(seed,)) for seed in range(3)]
    for worker in workers:
        worker.start()
    time.sleep(1.0)
    capsys.readouterr()
    reload_started = time.monotonic()
    code = main(["reload", NAME, "--http-port", str(server.ports.http), "--timeout", "120"])
    switched = time.monotonic()
    out, err = capsys.readouterr()
    time.sleep(1.0)
    done.set()
    for worker in workers:
        worker.join()

    assert code == 0, err
    assert f"model '{NAME}': loaded in" in out and "serving version 2" in out, out
    assert "older versions unloaded" in out, out
    assert not failures, failures[:3]
    before = [v for sent, _, v in answers if sent < reload_started]
    after = [v for sent, _, v in answers if sent > switched]
    assert before and set(before) == {1}, "version 1 served before the reload"
    assert after and set(after) == {2}, "only version 2 after the switch"
    assert server._watchdog is not None and server._watchdog.reloads == []
    print(f"\n{len(answers)} requests, none failed; {out.strip()}")

    # Responses equal version 2's files, on every row that changed and others.
    for start in range(0, CHANGED[0], KEYS_PER_TABLE * 40):
        k = [
            np.arange(start, start + KEYS_PER_TABLE) % TABLES[0][0],
            np.arange(start, start + KEYS_PER_TABLE) % TABLES[1][0],
        ]
        np.testing.assert_array_equal(_infer(client, k), _expected(v2_tables, k))

    # Version 1 is released while the server runs: its stubs and its segments are gone.
    assert _wait(lambda: not v1_stubs & set(stub_versions(server.pid)), RELEASE_S)
    assert all(not Path(f"/proc/{pid}").exists() for pid in v1_stubs)
    served = stub_versions(server.pid)
    assert sorted(v for m, v in served.values() if m == NAME) == [2, 2], served
    assert _wait(lambda: not any(p.exists() for p in _segment_files(v1_dirs)), RELEASE_S)
    assert all(path.exists() for path in _segment_files(v2_dirs))
    states = {(s.model, s.version): s.state for s in server.version_states()}
    assert states[(NAME, 2)] == "READY" and states.get((NAME, 1)) != "READY", states

    server.stop()
    assert not stub_versions(server.pid)
    assert list(shm.iterdir()) == [] and python_backend_regions(regions) == []
