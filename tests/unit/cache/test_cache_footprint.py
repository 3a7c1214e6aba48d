"""GPU tier bytes in :mod:`hps_core.footprint` against the arrays the caches allocate (the
NumPy twin has the CUDA cache's arrays; a static table is built in NumPy)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from cache_twin import NumpyDynamicCache

from hps_core.cache import StaticTable, num_sets_for
from hps_core.cache.layout import WAYS, cache_capacity_rows, slot_bytes
from hps_core.cache.static_table import static_table_nbytes
from hps_core.config import parse_ps_config
from hps_core.footprint import table_footprint


def ps_config(tmp_path: Path, dim: int, **model: object):
    doc = {
        "supportlonglong": True,
        "models": [
            {
                "model": "m",
                "sparse_files": ["t0"],
                "deployed_device_list": [0],
                "default_value_for_each_table": [0.0],
                "maxnum_catfeature_query_per_table_per_sample": [2],
                "embedding_vecsize_per_table": [dim],
                **model,
            }
        ],
    }
    return parse_ps_config(doc, tmp_path)


def cache_arrays_nbytes(cache: NumpyDynamicCache) -> int:
    state = cache.export_state()
    return state.keys.nbytes + state.stamps.nbytes + state.values.nbytes


SIZES = [(1, 1), (1, 16), (63, 4), (64, 4), (65, 4), (1000, 1), (1000, 33), (4097, 16)]


@pytest.mark.parametrize(("rows", "dim"), SIZES, ids=str)
@pytest.mark.parametrize("gpucacheper", [0.0, 0.2, 0.5, 1.0])
def test_dynamic_cache_bytes_are_its_arrays(
    tmp_path: Path, rows: int, dim: int, gpucacheper: float
) -> None:
    config = ps_config(tmp_path, dim, gpucacheper=gpucacheper)
    model = config.models[0]
    computed = table_footprint(config, model, model.tables[0], rows)
    # What ModelLookup asks make_cache for, turned into sets as make_cache does.
    num_sets = num_sets_for(cache_capacity_rows(gpucacheper, rows))
    assert num_sets == max(1, math.ceil(math.ceil(gpucacheper * rows) / WAYS))
    cache = NumpyDynamicCache(num_sets, dim)
    assert computed.gpu_cache == cache_arrays_nbytes(cache) == slot_bytes(num_sets, dim).nbytes
    assert computed.gpu_cache_rows == cache.capacity
    assert computed.gpu_static == 0
    assert computed.gpu_index == 0  # no network_file: no GPU ranking pipeline


def test_dynamic_cache_bytes_stay_right_after_inserts(tmp_path: Path) -> None:
    cache = NumpyDynamicCache(3, 5)
    before = cache_arrays_nbytes(cache)
    keys = np.arange(500, dtype=np.int64)
    cache.replace(keys, np.ones((500, 5), np.float32))
    assert cache_arrays_nbytes(cache) == before == slot_bytes(3, 5).nbytes


@pytest.mark.parametrize(("rows", "dim"), [(1, 1), (2, 3), (7, 4), (64, 8), (1000, 33), (4097, 16)])
def test_static_table_bytes_are_its_arrays(tmp_path: Path, rows: int, dim: int) -> None:
    config = ps_config(tmp_path, dim, embedding_cache_type="static")
    model = config.models[0]
    computed = table_footprint(config, model, model.tables[0], rows)
    keys = np.arange(rows, dtype=np.int64) * 3 - 7
    table = StaticTable(keys, np.ones((rows, dim), np.float32))
    hashes, starts = table.index_arrays()
    assert computed.gpu_static == table.nbytes == static_table_nbytes(rows, dim)
    assert table.nbytes == hashes.nbytes + starts.nbytes + table._values.nbytes
    assert (computed.gpu_cache, computed.gpu_cache_rows, computed.gpu_index) == (0, 0, 0)


def test_use_static_table_and_no_gpu_cache(tmp_path: Path) -> None:
    config = ps_config(tmp_path, 4, use_static_table=True)
    table = table_footprint(config, config.models[0], config.models[0].tables[0], 100)
    assert table.gpu_static == static_table_nbytes(100, 4) and table.gpu_cache == 0
    config = ps_config(tmp_path, 4, gpucache=False)
    table = table_footprint(config, config.models[0], config.models[0].tables[0], 100)
    assert table.gpu == 0
    assert set(table.tier_bytes()) == {"host"}


def test_ranking_models_count_the_gpu_copy_of_the_row_index(tmp_path: Path) -> None:
    (tmp_path / "net.json").write_text("{}")
    config = ps_config(tmp_path, 4, network_file="net.json")
    table = table_footprint(config, config.models[0], config.models[0].tables[0], 1000)
    # 1001 hashes, 257 int32 bucket starts and 1000 int32 row positions: what CacheBank
    # copies to the GPU.
    assert table.gpu_index == 8 * 1001 + 4 * 257 + 4 * 1000
    assert table.gpu == table.gpu_cache + table.gpu_index
    # A static table has its own index: no copy of the host tier's.
    config = ps_config(tmp_path, 4, network_file="net.json", use_static_table=True)
    table = table_footprint(config, config.models[0], config.models[0].tables[0], 1000)
    assert table.gpu_index == 0 and table.gpu == table.gpu_static
