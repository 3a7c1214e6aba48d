"""Dynamic caches shared by processes on one GPU (CUDA IPC; hps_core.cache.ipc_group).

Processes are spawned, so each has its own CUDA context like Triton's stubs. Vectors are a
function of their keys, so every process checks every hit exactly while the others insert
and evict in the same sets.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shared_cache_workers as workers  # noqa: E402

from hps_core.cache.ipc_files import cuda_event_files  # noqa: E402
from hps_core.cache.layout import EMPTY_KEY  # noqa: E402
from hps_core.formats.sparse_writer import write_sparse_table  # noqa: E402
from hps_core.hps import HPS  # noqa: E402
from hps_core.lookup import LookupOptions  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
TIMEOUT_S = 300


@pytest.fixture(autouse=True)
def _private_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HPS_SHM_DIR", str(tmp_path / "shm"))
    yield
    HPS.close_all()


def _segment_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "shm").glob("*gpucache*"))


def test_processes_share_one_cache_and_every_hit_is_exact(tmp_path: Path) -> None:
    group, cache = workers.open_cache("hammer")
    assert group.lead and cache.created_here and cache.shared
    start, results = SPAWN.Event(), SPAWN.Queue()
    procs = [
        SPAWN.Process(target=workers.hammer, args=("hammer", seed, 150, start, results))
        for seed in range(3)
    ]
    for proc in procs:
        proc.start()
    start.set()
    reports = [results.get(timeout=TIMEOUT_S) for _ in procs]
    for proc in procs:
        proc.join(TIMEOUT_S)
        assert proc.exitcode == 0
        assert cuda_event_files(proc.pid) == []  # CUDA's event file went with the process
    for seed, wrong, hits, lead in reports:
        assert wrong == 0, f"process {seed}: {wrong} hits returned another key's vector"
        assert hits > 0 and not lead
    # What the others inserted is in this process's view of the cache, consistent.
    state = cache.export_state()
    for s in range(workers.NUM_SETS):
        stored = state.keys[s][state.keys[s] != EMPTY_KEY]
        assert len(stored) == len(np.unique(stored)), f"set {s} holds a key twice"
    occupied = state.keys.ravel() != EMPTY_KEY
    assert occupied.all()  # 150 rounds x 3 processes fill every slot
    np.testing.assert_array_equal(
        state.values[occupied], workers.vectors(state.keys.ravel()[occupied])
    )
    del cache
    group.close()
    assert _segment_files(tmp_path) == []


def test_cache_outlives_the_process_that_built_it(tmp_path: Path) -> None:
    keys = np.arange(1, 2001, dtype=np.int64)
    joined, done = SPAWN.Event(), SPAWN.Queue()
    proc = SPAWN.Process(target=workers.lead_then_leave, args=("outlive", keys, joined, done))
    proc.start()
    assert done.get(timeout=TIMEOUT_S) is True  # the child built the group
    group, cache = workers.open_cache("outlive")
    assert not group.lead and not cache.created_here
    joined.set()
    proc.join(TIMEOUT_S)
    assert proc.exitcode == 0
    out, hit = cache.query(cupy.asarray(keys))
    assert bool(hit.all())
    np.testing.assert_array_equal(out.get(), workers.vectors(keys))
    more = np.arange(3000, 3100, dtype=np.int64)
    cache.replace(more, workers.vectors(more))
    out, hit = cache.query(cupy.asarray(more))
    assert bool(hit.all())
    np.testing.assert_array_equal(out.get(), workers.vectors(more))
    del cache, out, hit
    group.close()
    assert _segment_files(tmp_path) == []


def test_model_lookups_of_two_processes_share_caches(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    keys = rng.choice(2**40, 4000, replace=False).astype(np.int64)
    write_sparse_table(tmp_path / "t0", keys, rng.standard_normal((4000, 16)).astype(np.float32))
    ps = {
        "supportlonglong": True,
        "models": [
            {
                "model": "m",
                "sparse_files": ["t0"],
                "embedding_vecsize_per_table": [16],
                "default_value_for_each_table": [0.0],
                "maxnum_catfeature_query_per_table_per_sample": [10],
                "deployed_device_list": [0],
                "gpucache": True,
                "gpucacheper": 0.5,
            }
        ],
    }
    (tmp_path / "ps.json").write_text(json.dumps(ps))
    hps = HPS(tmp_path / "ps.json")
    lookup = hps.model("m", 0, LookupOptions(share_caches=True, share_scope="shared-test"))
    wanted = keys[:1000]
    np.testing.assert_array_equal(lookup.lookup(0, wanted).get(), hps.lookup(wanted, "m", 0))
    assert lookup.shares_caches and lookup.lead
    results = SPAWN.Queue()
    args = (str(tmp_path / "ps.json"), "shared-test", wanted, results)
    proc = SPAWN.Process(target=workers.lookup_session, args=args)
    proc.start()
    shares, lead, hits = results.get(timeout=TIMEOUT_S)
    proc.join(TIMEOUT_S)
    assert proc.exitcode == 0
    assert shares and not lead
    assert hits == len(wanted)  # inserted by this process, hit in the other
