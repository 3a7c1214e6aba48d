"""``hps convert`` reads its input from S3 (an S3-compatible server on a loopback port): a
Parquet table folder into a sparse model folder, a sparse model folder into Parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3_server import s3_server, upload

from hps_core.cli.main import main
from hps_core.formats.sparse import read_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):
    yield from s3_server(monkeypatch)


def test_convert_both_ways_from_s3(tmp_path: Path, s3) -> None:
    rng = np.random.default_rng(3)
    keys = rng.permutation(10_000).astype(np.int64)[:300]
    vectors = rng.standard_normal((300, 4)).astype(np.float32)
    local = tmp_path / "parquet"
    local.mkdir()
    for part, rows in enumerate((slice(0, 200), slice(200, 300))):
        table = pa.table({"key": keys[rows], "vector": list(vectors[rows])})
        pq.write_table(table, local / f"part-{part}.parquet")
    write_sparse_table(tmp_path / "sparse", keys, vectors)
    s3.create_dir("tables")
    upload(s3, local, "tables/emb_parquet")
    upload(s3, tmp_path / "sparse", "tables/emb_sparse")

    out = tmp_path / "from_s3"
    assert main(["convert", "parquet-to-hugectr", "s3://tables/emb_parquet/", str(out)]) == 0
    got_keys, got_vectors = read_sparse_table(out)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_vectors, vectors)

    back = tmp_path / "back.parquet"
    assert main(["convert", "hugectr-to-parquet", "s3://tables/emb_sparse", str(back)]) == 0
    table = pq.read_table(back)
    np.testing.assert_array_equal(table["key"].to_numpy(), keys)
    np.testing.assert_array_equal(np.stack(table["vector"].to_numpy(zero_copy_only=False)), vectors)
