"""Online updates under a bounded overlay: a ModelUpdater applying a stream of new keys with
a small ps.json ``volatile_db.overflow_margin`` keeps the overlay within its bound (each
policy), serves the rows it holds, and evicted keys fall to the default vector (no tier below
holds them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from updates_testlib import rows

from hps_core.config import OverflowPolicy, parse_ps_config
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.lookup import ModelLookup
from hps_core.tiers.backing import table_tag
from hps_core.tiers.overlay import OverlayStore
from hps_core.updates.apply import ModelUpdater

pytestmark = pytest.mark.timeout(120)

DIM, DEFAULT, MARGIN, PARTS = 8, -0.5, 100, 2
TAG = table_tag("m", "t0")


@pytest.mark.parametrize("policy", list(OverflowPolicy), ids=lambda p: p.value)
def test_many_new_keys_keep_the_overlay_bounded(tmp_path: Path, policy: OverflowPolicy) -> None:
    keys, vectors = rows(500, DIM, seed=3)
    write_sparse_table(tmp_path / "t0", keys, vectors)
    ps = {
        "supportlonglong": True,
        "volatile_db": {
            "type": "hash_map",
            "num_partitions": PARTS,
            "overflow_margin": MARGIN,
            "overflow_policy": policy.value,
            "overflow_resolution_target": 0.8,
        },
        "update_source": {"type": "kafka_message_queue", "brokers": "127.0.0.1:9"},
        "models": [
            {
                "model": "m",
                "sparse_files": ["t0"],
                "embedding_table_names": ["t0"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [DEFAULT],
                "maxnum_catfeature_query_per_table_per_sample": [4],
                "embedding_vecsize_per_table": [DIM],
            }
        ],
    }
    cfg = parse_ps_config(ps, tmp_path)
    model_lookup = ModelLookup(cfg, cfg.models[0])
    updater = ModelUpdater(model_lookup, settle_s=0)
    try:
        overlay = model_lookup.table(0).host.lower_store("overlay").store
        assert isinstance(overlay, OverlayStore) and overlay.margin == MARGIN
        rng = np.random.default_rng(5)
        for i in range(60):
            # 50 new keys (about 25 a partition, below the 80 a shrink leaves) and 10 of the
            # file's keys, which are written in place and never reach the overlay.
            new, new_vectors = rows(50, DIM, seed=100 + i, start=10_000 + 50 * i)
            known = rng.choice(keys, 10, replace=False)
            message = np.concatenate([new, known])
            updater.apply(
                TAG, message, np.concatenate([new_vectors, np.ones((10, DIM), np.float32)])
            )
            assert max(overlay.partition_sizes(TAG)) <= MARGIN
            assert overlay.rows(TAG) <= MARGIN * PARTS
            assert overlay.allocated(TAG) <= MARGIN * PARTS + 50
            # Held keys answer their new rows, evicted ones the default. Under evict_oldest
            # the message's keys are the newest and all stay; under evict_least_used they
            # have no use yet, so the earlier keys these lookups used may outlast them.
            held = np.isin(new, overlay.keys(TAG))
            got = model_lookup.lookup(0, new)
            np.testing.assert_array_equal(got[held], new_vectors[held])
            assert (got[~held] == DEFAULT).all()
            assert held.all() or policy is not OverflowPolicy.EVICT_OLDEST
        stats = updater.stats
        assert stats.messages == 60 and stats.overlay_rows == 3000 and stats.host_rows == 600
        assert overlay.evictions == 3000 - overlay.rows(TAG) > 2000
        # The evictions reach the table's counters (hps_tier_evictions_total{tier="overlay"}).
        assert model_lookup.table(0).host.tier_counters().overlay_evictions == overlay.evictions
        (counters,) = model_lookup.counters()
        assert counters.tier_overlay_evictions == overlay.evictions
        # The first messages' keys were evicted: no tier below holds them, so the default.
        first, _ = rows(50, DIM, seed=100, start=10_000)
        if policy is OverflowPolicy.EVICT_OLDEST:
            assert model_lookup.lookup(0, first).tolist() == [[DEFAULT] * DIM] * 50
    finally:
        updater.close()
        model_lookup.close()
