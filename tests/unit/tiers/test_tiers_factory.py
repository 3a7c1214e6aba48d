"""check_tiers_available / open_table_tiers: which ps.json tiers open, and how the others fail
(the cascade below the shared tier: test_tiers_cascade.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiers_testdata import make_keys, one_model_ps, random_vectors

from hps_core.config import PSConfig, parse_ps_config
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.factory import check_tiers_available, open_table_tiers


def config(tmp_path: Path, **sections: Any) -> PSConfig:
    return parse_ps_config(one_model_ps(**sections), tmp_path)


def test_kafka_update_source_opens_a_cascade_with_the_overlay(
    tmp_path: Path, shm_path: Path
) -> None:
    keys = np.arange(5, dtype=np.int64)
    write_sparse_table(tmp_path / "t0", keys, np.ones((5, 4), np.float32))
    cfg = config(tmp_path, update_source={"type": "kafka_message_queue"})
    check_tiers_available(cfg)  # online updates are available now
    table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    try:
        assert table.has_lower_tiers and table.shared.writable
        assert [tier.store.kind for tier in table.lower] == ["overlay"]
    finally:
        table.close()
    assert list(shm_path.iterdir()) == []


@pytest.mark.parametrize(
    "volatile",
    [None, {"type": "hash_map"}, {"type": "parallel_hash_map"}, {"type": "disabled"}, {}],
    ids=["absent", "hash_map", "parallel", "disabled", "no-type"],
)
def test_host_memory_tiers_open_the_shared_table(
    tmp_path: Path, shm_path: Path, volatile: dict | None
) -> None:
    rng = np.random.default_rng(5)
    keys = make_keys(rng, 100, "wide")
    vectors = random_vectors(rng, 100, 4)
    write_sparse_table(tmp_path / "t0", keys, vectors)
    sections = {} if volatile is None else {"volatile_db": volatile}
    cfg = config(tmp_path, **sections, persistent_db={"type": "disabled"})
    check_tiers_available(cfg)
    table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    absent = next(k for k in range(10) if k not in set(keys.tolist()))
    values, found = table.lookup(np.concatenate([keys[:10], [absent]]))
    np.testing.assert_array_equal(values[:10], vectors[:10])
    assert found.tolist() == [True] * 10 + [False]
    assert values[-1].tolist() == [0.5] * 4  # default_value_for_each_table
    table.close()
    assert list(shm_path.iterdir()) == []


def test_partial_initial_cache_rate_is_warned_and_every_row_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = np.arange(50, dtype=np.int64)
    vectors = random_vectors(np.random.default_rng(6), 50, 4)
    write_sparse_table(tmp_path / "t0", keys, vectors)
    cfg = config(tmp_path, volatile_db={"type": "hash_map", "initial_cache_rate": 0.25})
    with caplog.at_level(logging.WARNING, logger="hps_core"):
        table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    assert "volatile_db.initial_cache_rate=0.25 ignored" in caplog.text
    values, found = table.lookup(keys)
    assert found.all()
    np.testing.assert_array_equal(values, vectors)
    table.close()
