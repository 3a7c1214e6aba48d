"""A restarted server re-attaches the host tiers its last run kept, while the files are the same.

An embedding model of two tables (two CPU instances) is served by a tritonserver launched as
``hps serve`` launches it (``keep_host_tiers``). At its stop the host tiers stay in shared
memory; the next start attaches them (its log says ``attached to``, never ``built``) and
answers every key as the files say. Once a table's files are rewritten, the next start builds
that table again and removes the copy of the old files; a server told not to keep them leaves
nothing behind.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hps_core.cli.main import main
from hps_core.cli.shm_space import check_repository_fits
from hps_core.tiers.shm_segment import PREFIX, remove_stale_segments

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from checked_load import CheckedLoad, TableTruth, random_truth
from private_shm import private_shm_dir

pytestmark = pytest.mark.integration

MODEL = "kept"


def write_model(root: Path) -> tuple[Path, list[TableTruth]]:
    rng = np.random.default_rng(11)
    truths = [random_truth(rng, 30000, 16, -1.0), random_truth(rng, 5000, 8, 0.5)]
    for i, truth in enumerate(truths):
        truth.write(root / f"t{i}")
    ps = {
        "supportlonglong": True,
        "models": [{
            "model": MODEL, "sparse_files": ["t0", "t1"], "embedding_table_names": ["t0", "t1"],
            "embedding_vecsize_per_table": [16, 8], "default_value_for_each_table": [-1.0, 0.5],
            "maxnum_catfeature_query_per_table_per_sample": [64, 64], "max_batch_size": 16,
            "deployed_device_list": [0],
        }],
    }  # fmt: skip
    (root / "ps.json").write_text(json.dumps(ps))
    assert main(["repo", str(root / "ps.json"), str(root / "repo"), "--instances", "2"]) == 0
    return root / "repo", truths


def serve_and_check(triton_server, repo: Path, truths: list[TableTruth], keep: bool) -> str:
    """Start, check 200 answers against the files, stop; return the server's log."""
    server = triton_server(
        repo, keep_host_tiers=keep, on_stopped=[lambda _: remove_stale_segments()]
    )
    with CheckedLoad(server.grpc_url, MODEL, [truths], threads=2) as load:
        load.wait_requests(200)
    tally = load.tally
    assert tally.failed == 0 and tally.wrong == 0, tally.summary()
    server.stop()
    assert server.log_path is not None
    return server.log_path.read_text()


def kept(shm: Path) -> list[str]:
    return sorted(p.name for p in shm.glob(f"{PREFIX}*.source"))


def test_a_restart_attaches_the_kept_host_tiers_until_the_files_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, triton_server
) -> None:
    shm = private_shm_dir(tmp_path, monkeypatch)
    repo, truths = write_model(tmp_path)
    log = serve_and_check(triton_server, repo, truths, keep=True)
    assert log.count("host tier: built") == 2  # once per table, by the first instance
    assert len(kept(shm)) == 2  # both tables stay for a restart

    started = time.monotonic()
    log = serve_and_check(triton_server, repo, truths, keep=True)
    assert "host tier: built" not in log and log.count("host tier: attached to") == 4, log
    assert time.monotonic() - started < 60

    # Table 1 rewritten while no server runs: built again from the new files, the old copy
    # removed; table 0 attached as before.
    rng = np.random.default_rng(12)
    new = TableTruth(truths[1].keys, rng.standard_normal((5000, 8)).astype(np.float32), 0.5)
    new.write(tmp_path / "t1")
    log = serve_and_check(triton_server, repo, [truths[0], new], keep=True)
    assert log.count("host tier: built") == 1 and f"built {tmp_path / 't1'}" in log, log
    assert len(kept(shm)) == 2

    # A start that rebuilds (hps serve --rebuild-host-tiers) drops what was kept first.
    check_repository_fits(repo, rebuild=True)
    assert kept(shm) == []
    log = serve_and_check(triton_server, repo, [truths[0], new], keep=False)
    assert log.count("host tier: built") == 2
    assert list(shm.iterdir()) == []  # not kept: nothing left behind
