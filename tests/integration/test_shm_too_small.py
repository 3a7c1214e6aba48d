"""A ``/dev/shm`` too small for the models is said, with the bytes needed and free and
Docker's ``--shm-size`` fix, instead of every stub dying "not healthy" (issue 47).

``hps serve`` runs in a mount namespace of its own (``unshare --mount``) whose ``/dev/shm`` is
a tmpfs of a fixed size, as ``docker run --shm-size`` gives a container: the host tiers and
the Python backend's regions both go there, and vanish with the namespace. A model's own
check (its segment's pages allocated before they are filled) is served by tritonserver with
``HPS_SHM_DIR`` on a small tmpfs. Skipped, saying why, where mounting is not permitted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from private_shm import mounted_tmpfs

from hps_core.cli.main import main as hps_main
from hps_core.cli.serve import report_unavailable_models
from hps_core.config import load_ps_config
from hps_core.footprint import model_footprint
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.host_table import host_layout

pytestmark = pytest.mark.integration

DIM = 16
MiB = 2**20
_READY = re.compile(r"ready on HTTP http://(\S+),")


def _write_repo(root: Path, rows: dict[str, int]) -> tuple[Path, dict[str, np.ndarray]]:
    """One embedding model per entry of ``rows`` (one table of that many rows, two
    instances); the repository and each model's vectors (key k is row k)."""
    rng = np.random.default_rng(47)
    models, vectors = [], {}
    for name, n in rows.items():
        vectors[name] = rng.standard_normal((n, DIM), dtype=np.float32)
        write_sparse_table(root / "data" / name, np.arange(n, dtype=np.int64), vectors[name])
        models.append({
            "model": name, "sparse_files": [f"data/{name}"], "embedding_vecsize_per_table": [DIM],
            "default_value_for_each_table": [0.0],
            "maxnum_catfeature_query_per_table_per_sample": [4], "max_batch_size": 4,
            "deployed_device_list": [0],
        })  # fmt: skip
    (root / "ps.json").write_text(json.dumps({"supportlonglong": True, "models": models}))
    argv = ["repo", str(root / "ps.json"), str(root / "repo"), "--instances", "2"]
    assert hps_main(argv) == 0
    return root / "repo", vectors


def _lookup(url: str, model: str, keys: list[int]) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    inputs = [httpclient.InferInput("KEYS", [1, len(keys)], "INT64"),
              httpclient.InferInput("NUMKEYS", [1, 1], "INT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(np.array([keys], np.int64))
    inputs[1].set_data_from_numpy(np.array([[len(keys)]], np.int32))
    return client.infer(model, inputs).as_numpy("OUTPUT0").reshape(len(keys), DIM)


def _serve_with_shm(repo: Path, size: str, log: Path) -> subprocess.Popen[str]:
    """``hps serve`` in a mount namespace whose /dev/shm is a tmpfs of ``size``."""
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
    mount = f'mount -t tmpfs -o size={size},mode=1777 tmpfs /dev/shm && exec "$@"'
    ports = [f"--{service}-port=0" for service in ("http", "grpc", "metrics")]
    command = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh",
        sys.executable, "-m", "hps_core.cli.main", "serve", "--no-keep-host-tiers",
        "--model-repository", str(repo), *ports,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "HPS_SHM_DIR"}  # the namespace's /dev/shm
    with log.open("w") as err:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, env=env)


def _needed_bytes(repo: Path, models: list[str]) -> tuple[int, int]:
    """Host-tier bytes of ``models`` (from their files) and their instances' regions."""
    host = 0
    for model in models:
        config = load_ps_config(repo / model / "ps.json")
        host += model_footprint(config, config.model(model)).host
    return host, 2 * len(models) * MiB


def test_hps_serve_refuses_a_small_dev_shm_and_serves_once_it_is_larger(
    tmp_path: Path, triton_installation
) -> None:
    # Issue 47's case: 3 models of 2 instances, 16.5 MiB of shared memory, 12 MiB there.
    repo, vectors = _write_repo(tmp_path, {"emb_0": 50_000, "emb_1": 50_000, "emb_2": 50_000})
    host, regions = _needed_bytes(repo, ["emb_0", "emb_1", "emb_2"])
    assert host == 3 * host_layout(50_000, DIM).nbytes
    needed = host + regions

    proc = _serve_with_shm(repo, "12m", tmp_path / "small.log")
    out, _ = proc.communicate(timeout=120)
    err = (tmp_path / "small.log").read_text()
    assert proc.returncode == 2, err
    assert "ready on HTTP" not in out
    assert err == (
        f"error: /dev/shm is too small for the models of {repo}: the host tiers of 3 tables not "
        f"yet in shared memory ({host:,} bytes) and the Python backend's regions of 6 model "
        f"instances ({regions:,} bytes, shm-default-byte-size 1,048,576 each): {needed:,} bytes "
        f"({needed / MiB:.1f} MiB) needed, 12,582,912 bytes (12.0 MiB) free of 12.0 MiB; give "
        f"the server more shared memory: docker run --shm-size=1g ..., or mount -o "
        f"remount,size=1G /dev/shm\n"
    )

    proc = _serve_with_shm(repo, "64m", tmp_path / "large.log")
    try:
        assert proc.stdout is not None
        url = next((m.group(1) for line in proc.stdout if (m := _READY.search(line))), None)
        log = (tmp_path / "large.log").read_text()
        assert url is not None, f"hps serve never got ready:\n{log}"
        assert "too small" not in log
        for name, rows in vectors.items():
            keys = [0, 7, 49_999]
            np.testing.assert_array_equal(_lookup(url, name, keys), rows[keys])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0


def test_a_table_too_large_for_the_folder_fails_its_model_alone_saying_why(
    tmp_path: Path, triton_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No hps serve check here: each model finds out as it builds its table.
    repo, vectors = _write_repo(tmp_path, {"big": 80_000, "small": 2_000})
    big_bytes = host_layout(80_000, DIM).nbytes
    with mounted_tmpfs(tmp_path / "shm", "4m") as folder:
        monkeypatch.setenv("HPS_SHM_DIR", str(folder))
        server = triton_server(repo, strict_models=False)
        url = server.http_url.removeprefix("http://")
        np.testing.assert_array_equal(_lookup(url, "small", [1, 1999]), vectors["small"][[1, 1999]])
        states = server.model_states()
        assert states["small"].ready and not states["big"].ready
        reason = states["big"].reason
        where = tmp_path / "data" / "big"
        assert (
            f"SharedMemoryFullError: {folder} is too small for the host tier of {where} (80,000 "
            f"rows of dim 16): {big_bytes:,} bytes ({big_bytes / MiB:.1f} MiB) needed, "
        ) in reason, reason
        assert f"free of 4.0 MiB; free space in {folder}" in reason, reason
        assert "not healthy" not in reason  # the stub lived to say why
        summary = report_unavailable_models(states)[-1]
        assert summary == (
            "hps serve: 1 of 2 models serve; give the server the shared memory its error above "
            "says and restart"
        )
        server.stop()
