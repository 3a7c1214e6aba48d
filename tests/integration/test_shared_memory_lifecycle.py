"""No shared memory outlives the server: after a clean stop, and after ``kill -9``.

Each test serves tables written for it, so its segments have names no other test shares, in a
segment folder of its own under /dev/shm: any server that opens its tiers sweeps the stale
segments of its folder, so a server of a test running beside this one in /dev/shm itself would
remove the ``kill -9`` leftovers before this test looks at them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from private_shm import python_backend_regions

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.server.process import TritonServer, process_group_members
from hps_core.tiers.host_table import segment_name
from hps_core.tiers.shm_segment import PREFIX, shm_dir

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def private_segment_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on /dev/shm for this test's segments, given to the servers via ``HPS_SHM_DIR``."""
    folder = Path(tempfile.mkdtemp(prefix="hps-test-", dir="/dev/shm"))
    monkeypatch.setenv("HPS_SHM_DIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _write_repo(root: Path, seed: int) -> tuple[Path, list[str]]:
    rng = np.random.default_rng(seed)
    names = []
    for t, dim in enumerate((4, 8)):
        keys = rng.choice(2**40, 500, replace=False).astype(np.int64)
        write_sparse_table(root / f"t{t}", keys, rng.standard_normal((500, dim), np.float32))
        names.append(segment_name(root / f"t{t}", dim))
    ps = {
        "supportlonglong": True,
        "models": [
            {
                "model": "emb",
                "sparse_files": ["t0", "t1"],
                "embedding_vecsize_per_table": [4, 8],
                "default_value_for_each_table": [0.0, 0.0],
                "maxnum_catfeature_query_per_table_per_sample": [4, 4],
                "deployed_device_list": [0],
            }
        ],
    }
    (root / "ps.json").write_text(json.dumps(ps))
    assert hps_main(["repo", str(root / "ps.json"), str(root / "repo"), "--instances", "2"]) == 0
    return root / "repo", names


def _files_of(names: list[str]) -> list[str]:
    return sorted(p.name for p in shm_dir().glob(f"{PREFIX}*") if any(n in p.name for n in names))


def _lookup_once(server: TritonServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url.split("//")[-1])
    inputs = [
        httpclient.InferInput("KEYS", [1, 2], "INT64"),
        httpclient.InferInput("NUMKEYS", [1, 2], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([[1, 2]], np.int64))
    inputs[1].set_data_from_numpy(np.array([[1, 1]], np.int32))
    assert client.infer("emb", inputs).as_numpy("OUTPUT0").shape == (1, 12)


def test_clean_stop_leaves_nothing(tmp_path: Path, triton_server) -> None:
    repo, names = _write_repo(tmp_path, seed=1)
    server = triton_server(repo)
    regions = server._shm_prefix
    _lookup_once(server)
    # One data file per table while serving, shared by both instances.
    assert len([f for f in _files_of(names) if f.endswith(".data")]) == 2
    server.stop()
    assert _files_of(names) == []
    assert python_backend_regions(regions) == []


def test_kill_9_leftovers_are_removed_by_the_next_start(tmp_path: Path, triton_server) -> None:
    repo_a, names_a = _write_repo(tmp_path / "a", seed=2)
    repo_b, names_b = _write_repo(tmp_path / "b", seed=3)
    server_a = triton_server(repo_a)
    _lookup_once(server_a)
    # The whole process group dies at once: nobody runs finalize or any cleanup.
    os.killpg(server_a.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while process_group_members(server_a.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_group_members(server_a.pid)
    assert len(_files_of(names_a)) == 6, "kill -9 should have left server A's segments"

    # A new server on other tables removes A's leftovers when its model opens its tiers.
    server_b = triton_server(repo_b)
    _lookup_once(server_b)
    assert _files_of(names_a) == []
    assert len(_files_of(names_b)) == 6
    server_b.stop()
    assert _files_of(names_b) == []
