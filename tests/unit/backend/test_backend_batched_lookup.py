"""What ``execute`` does with a batch, without Triton: parse each request, batch the keys per
table, look them up once, split the vectors back; each answer must equal that request alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hps_core.config import parse_ps_config
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.lookup import ModelLookup
from triton_backend.hps_contract import HpsContract, batch_tables, split_outputs

DIMS = (3, 1, 8)
DEFAULTS = (0.0, -1.0, 0.5)


def reference_output(tables: list[dict[int, np.ndarray]], request: list[np.ndarray]):
    """OUTPUT0 of one request, key by key from dicts of the file rows."""
    flat: list[float] = []
    for t, keys in enumerate(request):
        for k in keys.tolist():
            row = tables[t].get(k)
            flat.extend([DEFAULTS[t]] * DIMS[t] if row is None else row.tolist())
    return np.array([flat], dtype=np.float32)


def test_batched_lookup_equals_each_request_alone(tmp_path: Path, shm_path: Path) -> None:
    rng = np.random.default_rng(41)
    tables = []
    for t, dim in enumerate(DIMS):
        keys = rng.permutation(np.arange(500, dtype=np.int64) * 3)
        vectors = rng.standard_normal((500, dim), dtype=np.float32)
        write_sparse_table(tmp_path / f"t{t}", keys, vectors)
        tables.append({k: v for k, v in zip(keys.tolist(), vectors, strict=True)})
    config = parse_ps_config(
        {
            "supportlonglong": True,
            "models": [
                {
                    "model": "m",
                    "sparse_files": [f"t{t}" for t in range(len(DIMS))],
                    "deployed_device_list": [0],
                    "default_value_for_each_table": list(DEFAULTS),
                    "maxnum_catfeature_query_per_table_per_sample": [3, 1, 5],
                    "embedding_vecsize_per_table": list(DIMS),
                    "max_batch_size": 4,
                }
            ],
        },
        tmp_path,
    )
    model = config.models[0]
    contract = HpsContract.from_model(model)
    lookup = ModelLookup(config, model)
    for _ in range(30):
        parsed = []
        for _ in range(int(rng.integers(1, 6))):
            counts = [int(rng.integers(0, m + 1)) for m in contract.max_keys]
            counts[0] = max(counts[0], 1)
            keys = rng.integers(-10, 1600, sum(counts), dtype=np.int64)  # hits and misses
            parsed.append(contract.parse(keys[None], np.array([counts], np.int32)))
        outputs = split_outputs(lookup.lookup_tables(batch_tables(parsed)), parsed)
        for request, out in zip(parsed, outputs, strict=True):
            np.testing.assert_array_equal(out, reference_output(tables, request))
    lookup.close()
    assert list(shm_path.iterdir()) == []
