"""``hps prepare``: the default repository's hps_embedding model, data written only once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hps_core import HPS
from hps_core.cli.main import main
from hps_core.demo import ZOO_MODELS
from hps_core.demo import embedding as demo
from hps_core.formats.sparse import KEY_FILE, VECTOR_FILE, read_sparse_table

DATA_FILES = [f"data/table{i}/{name}" for i in range(2) for name in (KEY_FILE, VECTOR_FILE)]


def file_state(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every data file: equal only if nothing rewrote it."""
    return {
        name: ((folder / name).stat().st_ino, (folder / name).stat().st_mtime_ns)
        for name in DATA_FILES
    }


@pytest.fixture
def prepared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["prepare", str(tmp_path / "repo"), "--model", demo.NAME]) == 0
    folder = tmp_path / "repo" / demo.NAME
    assert capsys.readouterr().out.splitlines() == [f"ready: {folder}"]
    return folder


def test_writes_the_model_folder_and_its_data(prepared: Path) -> None:
    for name in ("config.pbtxt", "1/model.py", "ps.json", "warmup/keys", "warmup/numkeys"):
        assert (prepared / name).is_file(), name
    ps = json.loads((prepared / "ps.json").read_text())
    [model] = ps["models"]
    assert model["model"] == demo.NAME
    assert model["sparse_files"] == ["data/table0", "data/table1"]
    assert model["embedding_vecsize_per_table"] == [dim for _, dim in demo.TABLES]
    for i, (rows, dim) in enumerate(demo.TABLES):
        table = prepared / "data" / f"table{i}"
        assert (table / KEY_FILE).stat().st_size == rows * 8
        assert (table / VECTOR_FILE).stat().st_size == rows * dim * 4
        keys, vectors = read_sparse_table(table, dim)
        np.testing.assert_array_equal(keys, np.arange(rows))
        expected_keys, expected_vectors = demo.table_vectors(i)
        np.testing.assert_array_equal(keys, expected_keys)
        np.testing.assert_array_equal(vectors, expected_vectors)
        assert vectors.std() > 0.5  # real random data, not zeros


def test_data_is_deterministic() -> None:
    for i in range(len(demo.TABLES)):
        first, second = demo.table_vectors(i), demo.table_vectors(i)
        np.testing.assert_array_equal(first[1], second[1])
    # Each table has its own stream, not a copy of table 0's.
    assert not np.array_equal(demo.table_vectors(0)[1][:8, :16], demo.table_vectors(1)[1][:8, :16])


def test_second_run_keeps_the_data_files(
    prepared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = file_state(prepared)
    assert main(["prepare", str(prepared.parent), "--model", demo.NAME]) == 0
    assert capsys.readouterr().out.splitlines() == [f"ready: {prepared}"]
    assert file_state(prepared) == before


def test_files_the_user_changed_are_kept_and_named(
    prepared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = prepared / "config.pbtxt"
    edited = config.read_text().replace("count: 2", "count: 1")
    assert edited != config.read_text()
    config.write_text(edited)
    (prepared / "1" / "model.py").unlink()  # a missing file is written again
    assert main(["prepare", str(prepared.parent), "--model", demo.NAME]) == 0
    assert config.read_text() == edited
    assert (prepared / "1" / "model.py").is_file()
    assert capsys.readouterr().out.splitlines() == [
        f"kept {config}: it differs from the default (remove it and run hps prepare again to "
        "write the default)",
        f"ready: {prepared}",
    ]


def test_damaged_table_is_written_again(prepared: Path) -> None:
    before = file_state(prepared)
    with open(prepared / "data/table1" / VECTOR_FILE, "r+b") as f:
        f.truncate(1000)
    assert main(["prepare", str(prepared.parent), "--model", demo.NAME]) == 0
    after = file_state(prepared)
    assert {k: v for k, v in after.items() if "table0" in k} == {
        k: v for k, v in before.items() if "table0" in k
    }
    _, vectors = read_sparse_table(prepared / "data/table1", demo.TABLES[1][1])
    np.testing.assert_array_equal(vectors, demo.table_vectors(1)[1])


def test_prepared_model_serves_its_rows(prepared: Path, shm_path: Path) -> None:
    hps = HPS(prepared / "ps.json")
    keys = np.array([0, 1, 99_999, 100_000, -1], dtype=np.int64)
    _, vectors = demo.table_vectors(0)
    values = hps.lookup(keys, demo.NAME, 0)
    np.testing.assert_array_equal(values[:3], vectors[[0, 1, 99_999]])
    np.testing.assert_array_equal(values[3:], np.zeros((2, 16), np.float32))
    hps.close()
    assert list(shm_path.iterdir()) == []


def test_unknown_model_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["prepare", str(tmp_path), "--model", "nope"])
    assert info.value.code == 2
    assert not (tmp_path / demo.NAME).exists()


def test_the_committed_default_repository_is_what_prepare_writes(tmp_path: Path) -> None:
    """model_repository/ holds what ``hps prepare`` writes (config.pbtxt from the contracts'
    declarations, ps.json, model.py, warm-up requests), not a hand-edited copy."""
    committed = Path(__file__).resolve().parents[3] / "model_repository"
    assert main(["prepare", str(tmp_path / "repo")]) == 0
    written = tmp_path / "repo"
    names = sorted(p.name for p in committed.iterdir() if p.is_dir())
    assert names == sorted(p.name for p in written.iterdir() if p.is_dir())
    for name in names:
        files = [
            p.relative_to(committed / name)
            for p in (committed / name).rglob("*")
            if p.is_file()
            # Tables (git-ignored, written by set-up) and bytecode of a server that ran here.
            and not {"data", "__pycache__"} & set(p.relative_to(committed / name).parts)
        ]
        assert files, name
        for file in files:
            assert (written / name / file).read_bytes() == (committed / name / file).read_bytes(), (
                f"{name}/{file}"
            )


def test_zoo_help_lists_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    zoo = text[text.index("--zoo") :]
    assert all(name in zoo for name in ZOO_MODELS), zoo
