"""Which tables take online updates (``update_filters``, as HugeCTR subscribes its databases'
update sources): the filters in effect for each pair of databases, the tables they pick, a
model whose tables none of them match starting no Kafka consumer (saying so once), and a
model following only its matching tables over a tansu broker: rows published to the other
table are never applied, every answer is the files' or the published row."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka_broker import FAST_GROUP_OPTIONS
from updates_testlib import rows

from hps_core.config import PSConfig, parse_ps_config
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.lookup import ModelLookup
from hps_core.tiers.backing import table_tag
from hps_core.updates import UpdateProducer
from hps_core.updates.apply import ModelUpdates, update_filters, updated_tables

pytestmark = pytest.mark.timeout(120)

ROWS, DIM, DEFAULT = 500, 8, -0.5
HASH_MAP = {"type": "hash_map"}
ROCKS = {"type": "rocks_db"}
DISABLED = {"type": "disabled"}


def two_table_config(
    root: Path, model: str = "m", brokers: str = "127.0.0.1:9", **sections: Any
) -> PSConfig:
    """A ps.json of one model with tables t0 and t1 and a Kafka update source; ``sections``
    replace top-level sections (``volatile_db``, ``persistent_db``, ``update_source``)."""
    for t in (0, 1):
        if not (root / f"t{t}").exists():
            write_sparse_table(root / f"t{t}", *rows(ROWS, DIM, seed=t))
    ps = {
        "supportlonglong": True,
        "update_source": {
            "type": "kafka_message_queue",
            "brokers": brokers,
            "poll_timeout_ms": 100,
            "failure_backoff_ms": 20,
        },
        "models": [
            {
                "model": model,
                "sparse_files": ["t0", "t1"],
                "embedding_table_names": ["t0", "t1"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [DEFAULT, DEFAULT],
                "maxnum_catfeature_query_per_table_per_sample": [4, 4],
                "embedding_vecsize_per_table": [DIM, DIM],
            }
        ],
        **sections,
    }
    return parse_ps_config(ps, root)


@pytest.mark.parametrize(
    ("volatile", "persistent", "want"),
    [
        (HASH_MAP, DISABLED, ("^hps_.+$",)),
        (
            {**HASH_MAP, "update_filters": ["a"]},
            {**ROCKS, "update_filters": ["b", "a"]},
            ("a", "b"),
        ),
        ({**DISABLED, "update_filters": ["a"]}, ROCKS, ("^hps_.+$",)),
        ({**DISABLED, "update_filters": ["a"]}, DISABLED, ("a",)),
        ({**HASH_MAP, "update_filters": []}, {**DISABLED, "update_filters": ["b"]}, ()),
    ],
)
def test_the_filters_of_the_databases_updates_reach(
    tmp_path: Path, volatile: dict, persistent: dict, want: tuple[str, ...]
) -> None:
    """volatile_db's unless it is disabled in favour of RocksDB; persistent_db's with RocksDB."""
    persistent = {"path": str(tmp_path / "rocks"), **persistent}
    config = two_table_config(tmp_path, volatile_db=volatile, persistent_db=persistent)
    assert update_filters(config) == want


def test_the_tables_a_model_updates_are_those_the_filters_match(tmp_path: Path) -> None:
    pick_t1 = {"update_filters": ["^hps_et\\.m\\.t1$"]}
    assert updated_tables(two_table_config(tmp_path), "m") == ["hps_et.m.t0", "hps_et.m.t1"]
    assert updated_tables(two_table_config(tmp_path, volatile_db=pick_t1), "m") == ["hps_et.m.t1"]
    searched = {"update_filters": ["\\.t0"]}  # searched in the topic, as librdkafka's regexes
    assert updated_tables(two_table_config(tmp_path, volatile_db=searched), "m") == ["hps_et.m.t0"]
    no_source = two_table_config(tmp_path, update_source={"type": "null"})
    assert updated_tables(no_source, "m") == []


def test_a_model_with_no_table_to_update_starts_no_consumer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens at the ps.json's brokers: a consumer made anyway would fail loudly."""
    config = two_table_config(tmp_path, volatile_db={"update_filters": ["^hps_et\\.other\\."]})
    lookup = ModelLookup(config, config.models[0])
    caplog.set_level(logging.INFO, logger="hps_core")
    try:
        assert ModelUpdates.start(lookup, "m.instance") is None
    finally:
        lookup.close()
    assert [r.getMessage() for r in caplog.records] == [
        "model m: no Kafka consumer: none of its tables takes online updates (update_filters "
        "^hps_et\\.other\\. match none of hps_et.m.t0, hps_et.m.t1)"
    ]


def test_only_the_tables_the_filters_match_receive_updates(
    broker: str, model: str, tmp_path: Path
) -> None:
    filters = {"update_filters": [f"^hps_et\\.{model}\\.t1$"]}
    config = two_table_config(tmp_path, model, broker, volatile_db=filters)
    lookup = ModelLookup(config, config.models[0])
    updates = ModelUpdates.start(
        lookup, f"{model}.instance", kafka_options=FAST_GROUP_OPTIONS, settle_s=0
    )
    assert updates is not None
    keys, vectors = rows(ROWS, DIM, seed=0)  # t0's rows; t1 has the same keys
    new = vectors + 1
    try:
        assert updates.consumer.topics == [table_tag(model, "t1")]
        with UpdateProducer(broker, linger_ms=5) as producer:
            producer.publish(model, "t0", keys, new)  # nobody here follows t0
            producer.publish(model, "t1", keys, new)
        deadline = time.monotonic() + 30
        while updates.stats.keys_applied < ROWS:
            assert time.monotonic() < deadline, updates.stats
            time.sleep(0.05)
        time.sleep(0.5)  # long enough for a (wrong) t0 message to be applied as well
        np.testing.assert_array_equal(lookup.lookup(1, keys), new)
        np.testing.assert_array_equal(lookup.lookup(0, keys), vectors)
        assert updates.stats.messages_applied == updates.updater.stats.messages
        assert updates.updater.tags == [table_tag(model, "t1")]
    finally:
        updates.stop()
        lookup.close()
