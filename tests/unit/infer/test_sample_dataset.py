"""``hps prepare --sample-data``: a labelled Parquet sample per ranking model in Criteo's
column names, scored by ``hps predict`` with columns matched by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hps_core.cli.main import main as hps_main
from hps_core.errors import ModelFileError
from hps_core.offline import InferenceModel


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    argv = ["prepare", str(root / "repo"), "--model", "dlrm", "--model", "dlrm_v2",
            "--model", "hps_embedding", "--sample-data", str(root / "data"),
            "--sample-rows", "3000"]  # fmt: skip
    assert hps_main(argv) == 0
    return root


def test_samples_carry_criteos_names_and_types_and_model_drawn_labels(prepared: Path) -> None:
    # An embedding model alone scores nothing: no sample for it.
    assert sorted(p.name for p in (prepared / "data").iterdir()) == [
        "dlrm.parquet", "dlrm_v2.parquet",
    ]  # fmt: skip
    table = pq.read_table(prepared / "data" / "dlrm.parquet")
    assert table.column_names == ["label", *(f"I{i}" for i in range(1, 14)),
                                  *(f"C{i}" for i in range(1, 27))]  # fmt: skip
    assert table.schema.field("label").type == pa.int32()
    assert table.schema.field("I1").type == pa.float32()
    assert table.schema.field("C1").type == pa.int64()
    labels = table.column("label").to_numpy()
    assert set(np.unique(labels)) <= {0, 1} and 0 < labels.mean() < 1
    # DLRM-v2's multi-hot tables are list columns of their hotness (table 20: 100 keys).
    v2 = pq.read_table(prepared / "data" / "dlrm_v2.parquet")
    assert pa.types.is_list(v2.schema.field("C21").type)
    assert len(v2.column("C21")[0].as_py()) == 100


def test_the_model_scores_its_own_sample_better_than_chance(prepared: Path) -> None:
    for name in ("dlrm", "dlrm_v2"):
        model = InferenceModel.from_ps_json(prepared / "repo" / name / "ps.json", name)
        # Labels are drawn from the model's scores: its AUC on them is above chance.
        assert model.evaluate(prepared / "data" / f"{name}.parquet") > 0.6


def test_columns_are_matched_by_name_in_any_order(prepared: Path, tmp_path: Path) -> None:
    table = pq.read_table(prepared / "data" / "dlrm.parquet")
    shuffled = table.select(list(reversed(table.column_names))).append_column(
        "row_id", pa.array(np.arange(table.num_rows))
    )
    pq.write_table(shuffled, tmp_path / "shuffled.parquet")
    model = InferenceModel.from_ps_json(prepared / "repo" / "dlrm" / "ps.json", "dlrm")
    first = model.predict_dataset(prepared / "data" / "dlrm.parquet")
    again = model.predict_dataset(tmp_path / "shuffled.parquet")
    np.testing.assert_array_equal(again.scores, first.scores)
    np.testing.assert_array_equal(again.labels, first.labels)


def test_a_missing_named_column_is_named(prepared: Path, tmp_path: Path) -> None:
    table = pq.read_table(prepared / "data" / "dlrm.parquet").drop_columns(["C7", "I3"])
    pq.write_table(table, tmp_path / "short.parquet")
    model = InferenceModel.from_ps_json(prepared / "repo" / "dlrm" / "ps.json", "dlrm")
    with pytest.raises(ModelFileError, match="missing: I3, C7"):
        model.predict_dataset(tmp_path / "short.parquet")


def test_an_existing_sample_file_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "dlrm.parquet").write_bytes(b"the user's own file")
    argv = ["prepare", str(tmp_path / "repo"), "--model", "dlrm", "--sample-data", str(data)]
    assert hps_main(argv) == 0
    assert (data / "dlrm.parquet").read_bytes() == b"the user's own file"
    assert f"kept {data / 'dlrm.parquet'}: it exists" in capsys.readouterr().out
