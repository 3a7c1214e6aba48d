"""A table left in Redis and RocksDB under an earlier ``store_compressed`` setting: servers
name it when they open the table and leave it (a server with the old setting may still read
it); ``hps prune`` lists and removes it with its load marker, and the copy servers read keeps
answering."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from quant_reference import reference_decoded
from redis_cluster import SECRET, RedisCluster, redis_cluster
from tiers_testdata import make_keys, one_model_ps, random_vectors

from hps_core.cli.main import main
from hps_core.config import parse_ps_config
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.quant import RowFormat
from hps_core.tiers.backing import table_tag
from hps_core.tiers.factory import open_table_tiers
from hps_core.tiers.unread_copies import UnreadCopy, find_unread_copies

pytestmark = pytest.mark.timeout(180)

TAG = table_tag("pruned", "t0")
DIM, ROWS = 8, 400


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    yield from redis_cluster(password=SECRET)


def write_ps(root: Path, cluster: RedisCluster, compressed: bool) -> Path:
    ps = one_model_ps(
        DIM, 0.5,
        volatile_db={
            "type": "redis_cluster", "address": cluster.address, "password": SECRET,
            "num_partitions": 3, "initial_cache_rate": 0.5, "store_compressed": compressed,
        },
        persistent_db={
            "type": "rocks_db", "path": str(root / "db"), "store_compressed": compressed,
        },
    )  # fmt: skip
    ps["models"][0]["model"] = "pruned"
    ps["models"][0]["storage_precision"] = "fp16"
    path = root / f"ps_{'compressed' if compressed else 'plain'}.json"
    path.write_text(json.dumps(ps))
    return path


def lookup(root: Path, ps: Path, keys: np.ndarray) -> np.ndarray:
    config = parse_ps_config(json.loads(ps.read_text()), root)
    table = open_table_tiers(config, "pruned", config.models[0].tables[0])
    try:
        return table.lookup(keys)[0]
    finally:
        table.close()


def test_a_copy_of_an_earlier_setting_is_named_at_open_and_removed_by_prune(
    tmp_path: Path, cluster: RedisCluster, caplog: pytest.LogCaptureFixture, capsys
) -> None:
    rng = np.random.default_rng(3)
    keys, vectors = make_keys(rng, ROWS, "wide"), random_vectors(rng, ROWS, DIM)
    write_sparse_table(tmp_path / "t0", keys, vectors)
    want = reference_decoded(RowFormat("fp16", DIM), vectors)
    compressed = write_ps(tmp_path, cluster, compressed=True)
    np.testing.assert_array_equal(lookup(tmp_path, compressed, keys), want)

    plain = write_ps(tmp_path, cluster, compressed=False)
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        np.testing.assert_array_equal(lookup(tmp_path, plain, keys), want)
    named = [r.getMessage() for r in caplog.records if "hps prune" in r.getMessage()]
    assert len(named) == 2, named
    assert f"volatile_db '{cluster.address}' also holds '{TAG}@fp16'" in named[0]
    assert f"persistent_db '{tmp_path / 'db'}' also holds '{TAG}@fp16'" in named[1]

    config = parse_ps_config(json.loads(plain.read_text()), tmp_path)
    assert find_unread_copies(config) == [
        UnreadCopy("volatile_db", f"{TAG}@fp16", TAG, ROWS // 2),
        UnreadCopy("persistent_db", f"{TAG}@fp16", TAG, None),
    ]
    assert main(["prune", str(plain), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would remove volatile_db table '{TAG}@fp16', 200 rows (read: '{TAG}')" in out
    assert out.endswith("2 unread copies found\n")
    assert len(find_unread_copies(config)) == 2
    assert main(["prune", str(plain)]) == 0
    assert capsys.readouterr().out.endswith("2 unread copies removed\n")
    assert find_unread_copies(config) == []

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        np.testing.assert_array_equal(lookup(tmp_path, plain, keys), want)
    assert not [r for r in caplog.records if "hps prune" in r.getMessage()]
    # Switched back, the compressed copies load afresh (their markers went with them), and
    # now the FP32 ones are the unread copies.
    np.testing.assert_array_equal(lookup(tmp_path, compressed, keys), want)
    config = parse_ps_config(json.loads(compressed.read_text()), tmp_path)
    assert [(c.database, c.name) for c in find_unread_copies(config)] == [
        ("volatile_db", TAG),
        ("persistent_db", TAG),
    ]


def test_prune_of_an_unknown_model_is_refused(tmp_path: Path, cluster: RedisCluster, capsys):
    ps = write_ps(tmp_path, cluster, compressed=False)
    assert main(["prune", str(ps), "--model", "nope"]) == 2
    assert 'no model named "nope"; known models: "pruned"' in capsys.readouterr().err
