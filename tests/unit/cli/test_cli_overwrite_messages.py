"""Refusals to replace files name the command-line flag ``--overwrite`` (and ``overwrite=True``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hps_core
from hps_core.cli.main import main
from hps_core.errors import ModelFileError
from hps_core.export.dlrm_arch import DlrmArch
from hps_core.export.dlrm_files import write_dlrm_model
from hps_core.formats.sparse import read_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table

HINT = "pass --overwrite (overwrite=True) to replace"


def _table(path: Path, rows: int = 4, dim: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.permutation(rows).astype(np.int64)
    vectors = rng.standard_normal((rows, dim), dtype=np.float32)
    write_sparse_table(path, keys, vectors)
    return keys, vectors


def test_hugectr_to_parquet_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _table(tmp_path / "t")
    out = tmp_path / "t.parquet"
    out.write_bytes(b"old")
    argv = ["convert", "hugectr-to-parquet", str(tmp_path / "t"), str(out)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {out}: already exists; {HINT} it\n"
    assert out.read_bytes() == b"old"
    assert main([*argv, "--overwrite"]) == 0


def test_parquet_to_hugectr_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys, _ = _table(tmp_path / "source", rows=5)
    parquet = tmp_path / "s.parquet"
    assert main(["convert", "hugectr-to-parquet", str(tmp_path / "source"), str(parquet)]) == 0
    _table(tmp_path / "t", rows=3)
    capsys.readouterr()
    argv = ["convert", "parquet-to-hugectr", str(parquet), str(tmp_path / "t")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 't' / 'key'}: already exists; refusing")
    assert err.endswith(f"; {HINT} it\n")
    assert main([*argv, "--overwrite"]) == 0
    np.testing.assert_array_equal(read_sparse_table(tmp_path / "t", 2)[0], keys)


def test_dlrm_export_names_the_flag(tmp_path: Path) -> None:
    (tmp_path / "ps.json").write_text("{}")
    arch = DlrmArch(4, (10,), (3, 4), (2, 1))
    with pytest.raises(ModelFileError) as err:
        # Existing files are refused before any tensor is looked at.
        write_dlrm_model(tmp_path, "m", arch, {}, [lambda a, b: np.zeros((b - a, 4), np.float32)])
    assert str(err.value) == (
        f"refusing to overwrite existing model files; {HINT} them:\n  {tmp_path / 'ps.json'}"
    )


def test_no_message_names_the_argument_alone() -> None:
    # "pass overwrite" named the Python argument only; the command line spells it --overwrite.
    package = Path(hps_core.__file__).parent
    offenders = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "pass overwrite" in line
    ]
    assert offenders == []
