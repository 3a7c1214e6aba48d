"""The host tier's bytes in :mod:`hps_core.footprint` against the segment a real
SharedHostTable allocates, and the lower tiers' payload per ps.json database section."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiers_testdata import make_keys, one_model_ps, random_vectors

from hps_core.config import parse_ps_config
from hps_core.footprint import model_footprint, payload_bytes, table_footprint
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.host_table import SharedHostTable, held_rows, host_layout


def write_table(folder: Path, rng: np.random.Generator, rows: int, dim: int) -> None:
    write_sparse_table(folder, make_keys(rng, rows, "wide"), random_vectors(rng, rows, dim))


# 1 row, powers of two, and row counts that are not (the bucket directory's size changes).
SIZES = [(1, 1), (1, 16), (2, 4), (7, 3), (64, 8), (1000, 1), (1000, 33), (4097, 16)]


@pytest.mark.parametrize(("rows", "dim"), SIZES, ids=str)
def test_host_bytes_are_the_segment_size(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator, rows: int, dim: int
) -> None:
    write_table(tmp_path / "t0", rng, rows, dim)
    config = parse_ps_config(one_model_ps(dim=dim), tmp_path)
    model = config.models[0]
    computed = table_footprint(config, model, model.tables[0], rows)
    table = SharedHostTable(tmp_path / "t0", dim)
    try:
        (data,) = shm_path.glob("*.data")
        assert computed.host == table.nbytes == data.stat().st_size
        assert computed.host_rows == table.rows == rows
        assert computed.precision == "fp32"
        # What the GPU pipeline copies of the index (hps_core.infer.gpu.bank): its arrays.
        hashes, starts, positions = table.index_arrays()
        assert table.layout.index_nbytes == hashes.nbytes + starts.nbytes + positions.nbytes
    finally:
        table.close()
    # Read from the files' sizes when no rows are given: the same numbers.
    assert model_footprint(config, model).tables[0] == computed


@pytest.mark.parametrize("fraction", [0.0, 0.25, 1.0])
def test_a_partial_host_tier_is_sized_for_the_rows_it_holds(
    tmp_path: Path, shm_path: Path, rng: np.random.Generator, fraction: float
) -> None:
    """Below RocksDB the host tier holds the first initial_cache_rate of the rows, in a
    segment sized for those alone (host_layout): the footprint reports what is allocated."""
    rows, dim = 1001, 4
    write_table(tmp_path / "t0", rng, rows, dim)
    doc = one_model_ps(
        dim=dim,
        volatile_db={"type": "hash_map", "initial_cache_rate": fraction},
        persistent_db={"type": "rocks_db", "path": str(tmp_path / "rocks")},
    )
    config = parse_ps_config(doc, tmp_path)
    computed = table_footprint(config, config.models[0], config.models[0].tables[0], rows)
    table = SharedHostTable(tmp_path / "t0", dim, fraction=fraction)
    try:
        (data,) = shm_path.glob("*.data")
        assert computed.host == table.nbytes == data.stat().st_size
        assert computed.host == host_layout(rows, dim, fraction).nbytes
        assert computed.host_rows == held_rows(rows, fraction)
        if fraction < 1:
            assert computed.host < host_layout(rows, dim).nbytes
        assert computed.host_rows == table.rows
        assert computed.rocks_db == payload_bytes(rows, dim) == rows * (8 + 4 * dim)
        assert computed.redis_cluster is None
    finally:
        table.close()


def test_lower_tiers_report_the_rows_they_are_filled_with(tmp_path: Path) -> None:
    rows, dim = 1000, 8
    sections = {
        "volatile_db": {
            "type": "redis_cluster",
            "address": "127.0.0.1:7000",
            "initial_cache_rate": 0.3,
        },
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks")},
    }
    config = parse_ps_config(one_model_ps(dim=dim, **sections), tmp_path)
    table = table_footprint(config, config.models[0], config.models[0].tables[0], rows)
    assert table.redis_cluster == 300 * (8 + 4 * dim)  # the first 30 % of the rows
    assert table.rocks_db == rows * (8 + 4 * dim)
    assert table.host_rows == 0  # Redis is the volatile level: no local copy is filled
    assert set(table.tier_bytes()) == {"host", "gpu_cache", "redis_cluster", "rocks_db"}
    # Without a persistent tier the cluster holds every row (the rate is ignored).
    del sections["persistent_db"]
    config = parse_ps_config(one_model_ps(dim=dim, **sections), tmp_path)
    table = table_footprint(config, config.models[0], config.models[0].tables[0], rows)
    assert (table.redis_cluster, table.rocks_db) == (rows * (8 + 4 * dim), None)


@pytest.mark.parametrize(("precision", "row_bytes"), [("fp16", 16), ("int8", 16), ("fp8", 12)])
def test_store_compressed_databases_hold_the_stored_rows(
    tmp_path: Path, precision: str, row_bytes: int
) -> None:
    """dim 8: fp16 16 bytes; int8 8 codes, a scale and a bias; fp8 8 codes and a scale. The
    FP32 layout (the default) takes 32 bytes whatever the table's precision."""
    rows, dim = 1000, 8
    redis = {"type": "redis_cluster", "address": "127.0.0.1:7000", "initial_cache_rate": 0.3}
    rocks = {"type": "rocks_db", "path": str(tmp_path / "rocks")}
    for compressed, size in ((True, row_bytes), (False, 4 * dim)):
        ps = one_model_ps(
            dim=dim,
            volatile_db={**redis, "store_compressed": compressed},
            persistent_db={**rocks, "store_compressed": compressed},
        )
        ps["models"][0]["storage_precision"] = precision
        config = parse_ps_config(ps, tmp_path)
        table = table_footprint(config, config.models[0], config.models[0].tables[0], rows)
        assert table.redis_cluster == 300 * (8 + size)
        assert table.rocks_db == rows * (8 + size)
