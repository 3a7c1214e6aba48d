"""The lookup cascade served by a real tritonserver: a CPU-instance `hps` model whose ps.json
keeps 30% of the rows in the shared host tier (``initial_cache_rate: 0.3``) and every row in
RocksDB. Served vectors equal the sparse files, unknown keys get the default, RocksDB is
filled once for both instances, and the metrics endpoint shows each tier's hits."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.factory import LOAD_LOCK

pytestmark = pytest.mark.integration

MODEL = "cascade"
DIM = 16
DEFAULT = -0.75
ROWS = 5000
MAX_QUERY = 64
MAX_BATCH = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, module_triton_server):
    root = tmp_path_factory.mktemp("cascade")
    rng = np.random.default_rng(17)
    keys = rng.choice(np.arange(-(10**12), 10**12, 7919), ROWS, replace=False).astype(np.int64)
    vectors = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    write_sparse_table(root / "data" / "t0", keys, vectors)
    ps = {
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map", "initial_cache_rate": 0.3},
        "persistent_db": {"type": "rocks_db", "path": str(root / "rocksdb"), "num_threads": 2},
        "models": [
            {
                "model": MODEL,
                "sparse_files": ["data/t0"],
                "embedding_table_names": ["t0"],
                "embedding_vecsize_per_table": [DIM],
                "default_value_for_each_table": [DEFAULT],
                "maxnum_catfeature_query_per_table_per_sample": [MAX_QUERY],
                "max_batch_size": MAX_BATCH,
                "deployed_device_list": [0],
            }
        ],
    }
    (root / "ps.json").write_text(json.dumps(ps))
    repo = root / "repo"
    assert hps_main(["repo", str(root / "ps.json"), str(repo), "--instances", "2"]) == 0
    server = module_triton_server(repo)
    yield server, keys, vectors, root


def _infer(server, keys: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url.split("//")[-1])
    inputs = [
        httpclient.InferInput("KEYS", [1, len(keys)], "INT64"),
        httpclient.InferInput("NUMKEYS", [1, 1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(keys[None].astype(np.int64))
    inputs[1].set_data_from_numpy(np.array([[len(keys)]], np.int32))
    return client.infer(MODEL, inputs).as_numpy("OUTPUT0")[0].reshape(len(keys), DIM)


def _metric(text: str, name: str, label: str) -> float:
    # Summed over instances: each instance publishes its own series.
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


def test_every_key_equals_the_files_and_unknown_keys_the_default(served) -> None:
    server, keys, vectors, _ = served
    step = MAX_QUERY * MAX_BATCH
    for start in range(0, ROWS, step):  # the shared 30% and the RocksDB 70% alike
        np.testing.assert_array_equal(
            _infer(server, keys[start : start + step]), vectors[start : start + step]
        )
    unknown = np.array([1, 2, 3, -(10**15)], np.int64)  # never multiples of 7919 offsets
    mixed = np.concatenate([keys[-3:], unknown, keys[:2]])
    got = _infer(server, mixed)
    np.testing.assert_array_equal(got[:3], vectors[-3:])
    assert (got[3:7] == DEFAULT).all()
    np.testing.assert_array_equal(got[7:], vectors[:2])


def test_rocksdb_is_loaded_once_and_its_hits_reach_the_metrics_endpoint(served) -> None:
    server, keys, _, root = served
    # Rows past the first 30% of the file are only in RocksDB.
    for _ in range(3):
        _infer(server, np.concatenate([keys[:5], keys[-20:], [1, 2]]))
        time.sleep(0.6)  # counters are published twice a second
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    rocks = _metric(text, "hps_tier_hits_total", 'tier="rocks_db"')
    host = _metric(text, "hps_tier_hits_total", 'tier="host"')
    default = _metric(text, "hps_tier_hits_total", 'tier="default"')
    assert rocks >= 20 and host >= 5 and default >= 2, text[-3000:]
    assert _metric(text, "hps_tier_errors_total", 'tier="rocks_db"') == 0
    log = Path(server.log_file).read_text() if server.log_file else ""
    assert log.count("persistent tier: loaded") == 1, log[-3000:]  # two instances, one load
    assert not (root / "rocksdb" / LOAD_LOCK).exists()
