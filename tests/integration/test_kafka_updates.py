"""Online updates over Kafka served by two real tritonservers: one tansu broker, two servers
(one instance each, separate repositories over the same sparse files, so one shared host
tier on this machine), one ``hps publish --changed`` of rows that changed (existing keys) and
rows that are new. Both servers answer the new values within a bound; a server restarted
while more updates are published answers those and the earlier ones (new keys included: its
overlay is rebuilt by the replay); the update counters reach the metrics endpoint.

On GPU instances (where CUDA is usable) each server's GPU cache holds the whole table once
the first requests have run; after the update, both answer the changed rows from their GPU
caches (the cache-hit counters rise by every key asked, the miss counters not at all):
updates reach the GPU caches, which HugeCTR's never do.

With the table stored in int8 (``storage_precision``) every answer is the reference
quantiser's row of the published FP32 vector (tests/quant_reference.py): in the shared tier
rewritten in place, in each server's overlay (rebuilt compressed by the replay) and in the GPU
caches alike."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from instance_kinds import INSTANCE_KINDS
from kafka_broker import FAST_GROUP_OPTIONS, kafka_broker
from quant_reference import reference_decoded

from hps_core.cli.main import main as hps_main
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.infer.model_io import KAFKA_OPTIONS_PARAMETER
from hps_core.quant import RowFormat
from hps_core.triton_repo import read_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "updated"
DIM = 16
DEFAULT = -0.25
ROWS = 2000
MAX_QUERY = 256
VISIBLE_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def broker():
    yield from kafka_broker()


def _repository(root: Path, data: Path, brokers: str, kind: str, storage: str, table: str) -> Path:
    """A repository of its own (own ps.json: own consumer group) over the shared files; on
    GPU instances a GPU cache for the whole table, filled by the first lookups. The table's
    name (and so its topic, ``hps_et.<model>.<table>``) is the test case's own: a server
    replays its topic from the start, and must not meet another case's updates there."""
    root.mkdir(parents=True)
    ps = {
        "supportlonglong": True,
        "update_source": {
            "type": "kafka_message_queue",
            "brokers": brokers,
            "poll_timeout_ms": 50,
            "failure_backoff_ms": 20,
        },
        "models": [
            {
                "model": MODEL,
                "sparse_files": [str(data)],
                "embedding_table_names": [table],
                "embedding_vecsize_per_table": [DIM],
                "default_value_for_each_table": [DEFAULT],
                "maxnum_catfeature_query_per_table_per_sample": [MAX_QUERY],
                "max_batch_size": 1,
                "deployed_device_list": [0],
                "gpucacheper": 1.0,
                "hit_rate_threshold": 2.0,  # above 1: misses inserted before the answer
                "storage_precision": storage,
            }
        ],
    }
    (root / "ps.json").write_text(json.dumps(ps))
    repo = root / "repo"
    command = ["repo", str(root / "ps.json"), str(repo), "--instances", "1", "--kind", kind]
    assert hps_main(command) == 0
    # tansu assigns a group's partitions after half the session timeout: keep it short.
    for path in repo.glob("*/config.pbtxt"):
        config = read_config(path)
        config.parameters[KAFKA_OPTIONS_PARAMETER].string_value = json.dumps(FAST_GROUP_OPTIONS)
        write_config(path, config)
    return repo


def _infer(server, keys: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url.split("//")[-1])
    inputs = [
        httpclient.InferInput("KEYS", [1, len(keys)], "INT64"),
        httpclient.InferInput("NUMKEYS", [1, 1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(keys[None].astype(np.int64))
    inputs[1].set_data_from_numpy(np.array([[len(keys)]], np.int32))
    return client.infer(MODEL, inputs).as_numpy("OUTPUT0")[0].reshape(len(keys), DIM)


def _quantised(reference: dict[int, np.ndarray], storage: str) -> dict[int, np.ndarray]:
    """What a table stored in ``storage`` answers for rows holding ``reference``."""
    rows = reference_decoded(RowFormat(storage, DIM), np.stack(list(reference.values())))
    return dict(zip(reference, rows, strict=True))


def _answers(server, reference: dict[int, np.ndarray], keys: np.ndarray) -> bool:
    want = np.stack([reference.get(k, np.full(DIM, DEFAULT, np.float32)) for k in keys.tolist()])
    got = np.concatenate(
        [_infer(server, keys[i : i + MAX_QUERY]) for i in range(0, len(keys), MAX_QUERY)]
    )
    return bool(np.array_equal(got, want))


def _wait_for(servers, reference, keys) -> float:
    start = time.monotonic()
    pending = list(servers)
    while pending:
        pending = [s for s in pending if not _answers(s, reference, keys)]
        if pending and time.monotonic() - start > VISIBLE_WITHIN_S:
            pytest.fail(f"{len(pending)} server(s) did not answer the update in time")
        time.sleep(0.05)
    return time.monotonic() - start


def _publish(broker: str, table: str, old: Path, new: Path) -> None:
    args = ["publish", "--brokers", broker, "--model", MODEL, "--table", table, "--linger-ms", "5"]
    assert hps_main([*args, "--changed", str(old), str(new)]) == 0


def _metric(server, name: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
    )


def _cache_counts(server, key: np.ndarray) -> np.ndarray:
    """The server's GPU cache (hits, misses) so far, after one lookup of ``key``: counters are
    published twice a second."""
    _infer(server, key)
    time.sleep(1.0)
    return np.array(
        [_metric(server, "hps_cache_hits_total"), _metric(server, "hps_cache_misses_total")]
    )


@pytest.mark.parametrize("storage", ["fp32", "int8"])
@pytest.mark.parametrize("kind", INSTANCE_KINDS)
def test_two_servers_serve_published_updates_and_resume_after_a_restart(
    broker: str, tmp_path: Path, triton_server, kind: str, storage: str
) -> None:
    rng = np.random.default_rng(23)
    keys = rng.choice(np.arange(-(10**12), 10**12, 7919), ROWS, replace=False).astype(np.int64)
    vectors = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    write_sparse_table(tmp_path / "data" / "t0", keys, vectors)
    reference = dict(zip(keys.tolist(), vectors, strict=True))
    table = f"t0_{kind.lower()}_{storage}"
    repos = [
        _repository(tmp_path / f"server{i}", tmp_path / "data" / "t0", broker, kind, storage, table)
        for i in (0, 1)
    ]
    servers = [triton_server(repo, startup_timeout_s=180) for repo in repos]
    probe = np.concatenate([keys[:300], np.arange(1, 601, 2, dtype=np.int64)])
    for server in servers:  # the files; new keys get the default
        assert _answers(server, _quantised(reference, storage), probe)

    # Update 1: 200 changed rows and 300 new keys (odd numbers, never multiples of 7919).
    new_keys = np.arange(1, 601, 2, dtype=np.int64)
    changed = {k: vectors[i] + 1 for i, k in enumerate(keys[:200].tolist())}
    changed.update({k: np.full(DIM, k, np.float32) for k in new_keys.tolist()})
    after1 = {**reference, **changed}
    write_sparse_table(
        tmp_path / "v1",
        np.array(list(after1), np.int64),
        np.stack(list(after1.values())).astype(np.float32),
    )
    _publish(broker, table, tmp_path / "data" / "t0", tmp_path / "v1")
    served1 = _quantised(after1, storage)
    delay = _wait_for(servers, served1, probe)
    assert delay < VISIBLE_WITHIN_S
    if kind == "KIND_GPU":  # the changed rows come from each server's GPU cache
        existing = keys[:300]  # 200 changed, 100 not; all cached by the probes above
        for server in servers:
            before = _cache_counts(server, keys[:1])
            assert _answers(server, served1, existing)
            hits, misses = _cache_counts(server, keys[:1]) - before
            assert (hits, misses) == (len(existing) + 1, 0)

    # Server 1 stops; update 2 is published while it is down; it starts again.
    servers[1].stop()
    more_new = np.arange(1001, 1201, 2, dtype=np.int64)
    after2 = {**after1, **{k: after1[k] * 2 for k in keys[100:300].tolist()}}
    after2.update({k: np.full(DIM, -k, np.float32) for k in more_new.tolist()})
    write_sparse_table(
        tmp_path / "v2",
        np.array(list(after2), np.int64),
        np.stack(list(after2.values())).astype(np.float32),
    )
    _publish(broker, table, tmp_path / "v1", tmp_path / "v2")
    restarted = triton_server(repos[1], startup_timeout_s=180)
    everything = np.concatenate([probe, more_new])
    served2 = _quantised(after2, storage)
    _wait_for([servers[0], restarted], served2, everything)
    time.sleep(1.0)  # counters are published twice a second
    for server in (servers[0], restarted):
        assert _answers(server, served2, everything)
    assert _metric(servers[0], "hps_update_keys_total") >= len(changed) + 300
    assert _metric(servers[0], "hps_update_errors_total") == 0
    assert _metric(restarted, "hps_update_messages_total") >= 2  # replayed update 1 too
    assert _metric(servers[0], "hps_tier_hits_total") > 0
