"""``hps convert parquet-to-hugectr`` / ``hugectr-to-parquet`` through the real entry point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from formats_testdata import RandomTable

from hps_core.cli.main import main
from hps_core.formats.sparse import read_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table


def _parquet(path: Path, keys: np.ndarray, vectors: np.ndarray, names: tuple[str, str]) -> Path:
    flat = pa.array(vectors.ravel())
    offsets = pa.array(np.arange(len(keys) + 1, dtype=np.int32) * vectors.shape[1])
    table = pa.table({names[0]: keys, names[1]: pa.ListArray.from_arrays(offsets, flat)})
    pq.write_table(table, path)
    return path


def test_parquet_to_hugectr_prints_a_summary(
    tmp_path: Path, random_table: RandomTable, capsys: pytest.CaptureFixture[str]
) -> None:
    keys, vectors = random_table(50, 6)
    source = _parquet(tmp_path / "emb.parquet", keys, vectors, ("id", "emb"))
    out = tmp_path / "model" / "0_sparse_model"
    argv = ["convert", "parquet-to-hugectr", str(source), str(out)]
    code = main([*argv, "--key-column", "id", "--vector-column", "emb", "--dim", "6"])

    assert code == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out == (
        f"wrote 50 rows x dim 6 to {out} (1600 bytes: key 400, emb_vector 1200)\n"
    )
    got_keys, got_vectors = read_sparse_table(out, 6)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_vectors, vectors)


def test_hugectr_to_parquet_prints_a_summary(
    tmp_path: Path, random_table: RandomTable, capsys: pytest.CaptureFixture[str]
) -> None:
    keys, vectors = random_table(20, 3)
    write_sparse_table(tmp_path / "t", keys, vectors)
    out = tmp_path / "emb.parquet"

    assert main(["convert", "hugectr-to-parquet", str(tmp_path / "t"), str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"wrote 20 rows x dim 3 from {tmp_path / 't'} (400 bytes) to {out} "
        f"({out.stat().st_size} bytes)"
    ]
    table = pq.read_table(out)
    np.testing.assert_array_equal(table.column("key").to_numpy(), keys)
    flat = table.column("vector").combine_chunks().flatten().to_numpy()
    np.testing.assert_array_equal(flat.reshape(20, 3), vectors)


def test_bad_input_gives_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "key").write_bytes(b"\0" * 80)
    (folder / "emb_vector").write_bytes(b"\0" * 4 * 25)

    code = main(["convert", "hugectr-to-parquet", str(folder), str(tmp_path / "o.parquet")])
    assert code != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"error: {folder / 'emb_vector'}: emb_vector holds 25 floats for 10 keys (2.50 per key), "
        f"not a whole positive number per key; {folder / 'key'} or emb_vector is truncated or "
        f"belongs to another table\n"
    )
    assert not (tmp_path / "o.parquet").exists()

    code = main(["convert", "parquet-to-hugectr", str(tmp_path / "none"), str(tmp_path / "x")])
    assert code != 0
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'none'}: Parquet file or folder does not exist\n"
    )


def test_existing_output_needs_overwrite(
    tmp_path: Path, random_table: RandomTable, capsys: pytest.CaptureFixture[str]
) -> None:
    keys, vectors = random_table(5, 2)
    source = _parquet(tmp_path / "e.parquet", keys, vectors, ("key", "vector"))
    write_sparse_table(tmp_path / "t", *random_table(3, 2))
    argv = ["convert", "parquet-to-hugectr", str(source), str(tmp_path / "t")]

    assert main(argv) != 0
    assert "already exists; refusing to overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    np.testing.assert_array_equal(read_sparse_table(tmp_path / "t", 2)[0], keys)


@pytest.mark.parametrize("dim", ["0", "-3", "x"])
def test_dim_must_be_a_positive_integer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dim: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "hugectr-to-parquet", str(tmp_path), "o.parquet", "--dim", dim])
    assert exit_info.value.code == 2
    assert "--dim" in capsys.readouterr().err
