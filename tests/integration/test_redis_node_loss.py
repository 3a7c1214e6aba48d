"""A Redis node lost under load, served by a real tritonserver over a real three-node cluster.

The model's ps.json keeps its tables in the cluster alone (``volatile_db`` of type
``redis_cluster``, no ``persistent_db``): the layout in which HugeCTR answers a lost node's keys
with default vectors, status OK. Four gRPC clients keep requesting keys the tables hold and keys
they lack while one of the three masters is killed and, seconds later, started again empty;
every answer is compared with the sparse files.

- Without online updates, the files answer what the node held: no request fails, none is
  wrong, the node's rows are written back and its partitions refilled without a reload.
- With online updates, the cluster may hold keys the files lack: a key of the down node that
  the files lack fails its request ``UNAVAILABLE`` naming the node; no answer is wrong.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hps_core.cli.main import main as hps_main
from hps_core.config import parse_ps_config
from hps_core.tiers.backing import table_tag
from hps_core.tiers.redis_store import RedisClusterStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
from checked_load import CheckedLoad, TableTruth, random_truth
from kafka_broker import kafka_broker
from redis_cluster import SECRET, RedisCluster, redis_cluster

pytestmark = pytest.mark.integration

MODEL = "lost_node"
TABLES = (("t0", 20000, 8, -1.5), ("t1", 4000, 16, 0.25))  # name, rows, dim, default


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    yield from redis_cluster(password=SECRET)


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    yield from kafka_broker()


def write_model(root: Path, cluster: RedisCluster, model: str, updates: dict | None):
    """Sparse files and a repository of ``model`` whose tables live in the cluster alone."""
    rng = np.random.default_rng(len(model))
    truths = []
    for name, rows, dim, default in TABLES:
        truth = random_truth(rng, rows, dim, default)
        truth.write(root / name)
        truths.append(truth)
    ps = {
        "supportlonglong": True,
        "volatile_db": {
            "type": "redis_cluster", "address": cluster.address, "password": SECRET,
            "num_partitions": 6, "max_batch_size": 1000,
        },
        "models": [{
            "model": model,
            "sparse_files": [name for name, *_ in TABLES],
            "embedding_table_names": [name for name, *_ in TABLES],
            "embedding_vecsize_per_table": [dim for _, _, dim, _ in TABLES],
            "default_value_for_each_table": [default for *_, default in TABLES],
            "maxnum_catfeature_query_per_table_per_sample": [64, 64],
            "max_batch_size": 16,
            "deployed_device_list": [0],
        }],
    }  # fmt: skip
    if updates is not None:
        ps["update_source"] = updates
    (root / "ps.json").write_text(json.dumps(ps))
    assert hps_main(["repo", str(root / "ps.json"), str(root / "repo"), "--instances", "2"]) == 0
    return root / "repo", truths


def cluster_counts(root: Path, model: str) -> list[int]:
    """Rows each table holds in the cluster, read by a client of its own."""
    config = parse_ps_config(json.loads((root / "ps.json").read_text()), root)
    with RedisClusterStore(config.volatile_db) as store:
        return [store.count(table_tag(model, name)) for name, *_ in TABLES]


def metric(server, name: str, label: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


def victim(cluster: RedisCluster) -> int:
    """The port of a master that holds some of the tables' partitions (all of them do)."""
    return sorted(cluster.processes)[1]


def test_a_lost_node_is_answered_from_the_files_and_refilled_without_a_reload(
    tmp_path: Path, cluster: RedisCluster, triton_server
) -> None:
    repo, truths = write_model(tmp_path, cluster, MODEL, updates=None)
    server = triton_server(repo)
    rows = [len(t.keys) for t in truths]
    assert cluster_counts(tmp_path, MODEL) == rows
    port = victim(cluster)
    with CheckedLoad(server.grpc_url, MODEL, [truths], threads=4) as load:
        load.wait_requests(100)
        cluster.kill(port)
        try:
            load.wait_requests(300)
            down = load.snapshot()
        finally:
            cluster.restart(port)  # empty: the nodes save nothing
        # The node came back empty; the refill (checked in the log below) may be done by now.
        deadline = time.monotonic() + 60
        while cluster_counts(tmp_path, MODEL) != rows:  # refilled from the files, no reload
            assert time.monotonic() < deadline, cluster_counts(tmp_path, MODEL)
            time.sleep(0.5)
        load.wait_requests(200)
        tally = load.stop()
    assert tally.wrong == 0 and tally.failed == 0, tally.summary()
    assert down.total >= 300 and tally.total >= 600
    time.sleep(1.2)  # counters are published twice a second
    assert metric(server, "hps_tier_hits_total", 'tier="model_files"') > 0
    assert metric(server, "hps_tier_refilled_keys_total", "") > 0
    assert metric(server, "hps_tier_unanswered_keys_total", "") == 0
    log = Path(server.log_file).read_text()
    # Once per instance (a process each) when the node goes, once when it is back.
    assert 1 <= log.count(f"Redis node 127.0.0.1:{port} failed") <= 2, log[-3000:]
    assert 1 <= log.count(f"Redis node 127.0.0.1:{port} answers again") <= 2
    # Other failures (the node answers CLUSTERDOWN while it rejoins): a line a minute per
    # table and instance at most.
    assert log.count("those keys go to the tiers below") <= 2 * len(TABLES)
    assert "the Redis cluster lacks" in log and "refilled" in log


def test_with_updates_a_lost_nodes_unknown_keys_fail_and_no_answer_is_wrong(
    tmp_path: Path, cluster: RedisCluster, broker: str, triton_server
) -> None:
    updates = {"type": "kafka_message_queue", "brokers": broker, "poll_timeout_ms": 50}
    model = MODEL + "_updated"
    repo, truths = write_model(tmp_path, cluster, model, updates=updates)
    server = triton_server(repo)
    port = victim(cluster)
    with CheckedLoad(server.grpc_url, model, [truths], threads=4, unknown_share=0.2) as load:
        load.wait_requests(100)
        assert load.snapshot().failed == 0
        cluster.kill(port)
        try:
            load.wait_requests(200)
        finally:
            cluster.restart(port)
        back = time.monotonic()
        time.sleep(2.0)  # the node is tried again within retry_after
        load.wait_requests(200)
        tally = load.stop()
    assert tally.wrong == 0, tally.summary()
    assert 0 < tally.failed < tally.total, tally.summary()
    # Named by the node while it is down; while it rejoins, by what the cluster answered.
    assert all("tier unavailable" in r and "redis_cluster" in r for r in tally.reasons)
    named = sum(n for r, n in tally.reasons.items() if f"node 127.0.0.1:{port}" in r)
    assert named >= tally.failed // 2, tally.reasons
    assert tally.last_failed < back + 2.0, tally.summary()  # answered again once it is back
    time.sleep(1.2)
    assert metric(server, "hps_requests_failed_total", 'reason="unavailable"') == tally.failed
    assert metric(server, "hps_tier_unanswered_keys_total", "") > 0
    _ = TableTruth  # the type of `truths`
