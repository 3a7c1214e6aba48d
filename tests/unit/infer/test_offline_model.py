"""The offline API (HugeCTR's ``InferenceModel`` shape): arrays, Parquet datasets, AUC and
``check_out_tensor``, against the float64 reference, on the project's networks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from network_files import OWN
from nn_reference import network_forward
from ranking_reference import (
    embedding_layers,
    encode_hugectr,
    pooled_reference,
    predict_reference,
    random_keys,
)
from ranking_testdata import write_ranking_files
from s3_server import SECRET, upload

from hps_core.cli.main import main as hps_main
from hps_core.errors import ModelFileError, RequestError
from hps_core.offline import DatasetColumns, InferenceModel, auc, dataset_files, iter_dataset
from hps_core.offline import dataset as dataset_module

NETWORKS = ["dcn", "wdl", "dlrm", "deepfm"]


def write_dataset(path: Path, files, dense, keys, labels=None, one_hot=False) -> DatasetColumns:
    """A Parquet file in HugeCTR's column order: label, I1.., then C1.. (one per slot; an
    integer when ``one_hot``, else a list)."""
    columns, names = [], []
    label_names = ()
    if labels is not None:
        columns.append(pa.array(labels.astype(np.float32)))
        names.append("label")
        label_names = ("label",)
    for j in range(dense.shape[1]):
        columns.append(pa.array(dense[:, j]))
        names.append(f"I{j + 1}")
    cats = []
    for t, slots in enumerate(files.slot_nums):
        for s in range(slots):
            values = [sample[t][s] for sample in keys]
            if one_hot:
                columns.append(pa.array([v[0] for v in values], pa.int64()))
            else:
                columns.append(pa.array(values, pa.list_(pa.int64())))
            names.append(f"C{len(cats) + 1}")
            cats.append(names[-1])
    pq.write_table(pa.Table.from_arrays(columns, names=names), path, row_group_size=7)
    return DatasetColumns(label_names, tuple(names[len(label_names) : len(names) - len(cats)]),
                          tuple(cats))  # fmt: skip


def reference(files, dense, keys) -> np.ndarray:
    return predict_reference(
        files.network_file, files.dense_file, files.tables, files.defaults, dense, keys
    )


@pytest.mark.parametrize("name", NETWORKS)
def test_predict_takes_hugectrs_arrays(tmp_path: Path, name: str) -> None:
    files = write_ranking_files(tmp_path / "m", OWN[name], seed=31, max_batch_size=16)
    model = InferenceModel.from_ps_json(files.ps_json)
    rng = np.random.default_rng(32)
    for batch in (1, 9, 16):
        keys = random_keys(rng, batch, files.slot_nums, files.known_keys(), 3, 0.2, 0.1)
        dense = rng.standard_normal((batch, model.layout.dense_dim)).astype(np.float32)
        des, catcolumn, rowindex = encode_hugectr(dense, keys)
        # As HugeCTR's Python API takes them: flat lists.
        got = model.predict(des.ravel().tolist(), catcolumn.ravel().tolist(), rowindex.ravel())
        assert got.shape == (batch, 1) and got.dtype == np.float32
        np.testing.assert_allclose(got, reference(files, dense, keys), rtol=1e-4, atol=1e-5)
    too_many = random_keys(rng, 17, files.slot_nums, files.known_keys())
    with pytest.raises(RequestError, match="more than the 16 allowed"):
        model.predict(*encode_hugectr(np.zeros((17, model.layout.dense_dim)), too_many))
    model.close()


@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("name", ["wdl", "dlrm"])
def test_dataset_predictions_equal_the_reference_and_the_auc(tmp_path, name, one_hot) -> None:
    files = write_ranking_files(tmp_path / "m", OWN[name], seed=33, max_batch_size=8)
    model = InferenceModel.from_ps_json(files.ps_json)
    rng = np.random.default_rng(34)
    n = 45  # several batches of 8 and several row groups of 7
    keys = random_keys(rng, n, files.slot_nums, files.known_keys(), 1 if one_hot else 3)
    dense = rng.standard_normal((n, model.layout.dense_dim)).astype(np.float32)
    labels = (rng.random(n) < 0.4).astype(np.float32)
    write_dataset(tmp_path / "data.parquet", files, dense, keys, labels, one_hot)
    result = model.predict_dataset(tmp_path / "data.parquet", progress=False)
    want = reference(files, dense, keys)
    np.testing.assert_allclose(result.scores, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(result.labels[:, 0], labels)
    assert result.columns.labels == ("label",) and result.columns.dense[0] == "I1"
    assert result.auc() == pytest.approx(auc(labels, want[:, 0]), abs=1e-6)
    assert model.evaluate(tmp_path / "data.parquet") == pytest.approx(result.auc())
    # The last batch holds the last 45 - 5 * 8 = 5 samples: check_out_tensor sees those.
    assert model.check_out_tensor(model.tensor_names[-1]).shape == (5, 1)


def test_records_read_in_several_pieces_cut_into_the_same_batches(tmp_path, monkeypatch) -> None:
    """Files are read READ_ROWS rows at a time (here 20: 2.5 batches of 8), then cut into
    batches; a bad value is still named by its row in the file."""
    monkeypatch.setattr(dataset_module, "READ_ROWS", 20)
    files = write_ranking_files(tmp_path / "m", OWN["dlrm"], seed=49, max_batch_size=8)
    model = InferenceModel.from_ps_json(files.ps_json)
    rng = np.random.default_rng(50)
    n = 45
    keys = random_keys(rng, n, files.slot_nums, files.known_keys(), 1)
    dense = rng.standard_normal((n, model.layout.dense_dim)).astype(np.float32)
    labels = (rng.random(n) < 0.4).astype(np.float32)
    write_dataset(tmp_path / "data.parquet", files, dense, keys, labels, one_hot=True)
    sizes = []
    predict_batch = model.predict_batch

    def counted(batch):
        sizes.append(batch.batch_size)
        return predict_batch(batch)

    monkeypatch.setattr(model, "predict_batch", counted)
    result = model.predict_dataset(tmp_path / "data.parquet", progress=False)
    assert sizes == [8, 8, 8, 8, 8, 5]  # reads of 16 rows (two batches), the last 13
    np.testing.assert_allclose(result.scores, reference(files, dense, keys), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(result.labels[:, 0], labels)
    table = pq.read_table(tmp_path / "data.parquet")
    values = table.column("I2").to_pylist()
    values[37] = None
    pq.write_table(table.set_column(2, "I2", pa.array(values, pa.float32())), tmp_path / "n.pq")
    with pytest.raises(ModelFileError, match=r"n.pq: column 'I2' is null at row 37"):
        model.predict_dataset(tmp_path / "n.pq")


def test_batches_read_ahead_equal_the_batches_read_in_turn(tmp_path, monkeypatch) -> None:
    """What a GPU's scoring iterates (read_ahead over iter_dataset): the same batches, and a
    bad value of a later read raised in its turn, naming its row."""
    monkeypatch.setattr(dataset_module, "READ_ROWS", 20)
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=51, max_batch_size=8)
    model = InferenceModel.from_ps_json(files.ps_json)
    rng = np.random.default_rng(52)
    keys = random_keys(rng, 45, files.slot_nums, files.known_keys(), 2)
    dense = rng.standard_normal((45, model.layout.dense_dim)).astype(np.float32)
    path = tmp_path / "d.parquet"
    columns = write_dataset(path, files, dense, keys, (rng.random(45) < 0.5).astype(np.float32))
    source = dataset_files(path)

    def batches():
        return iter_dataset(source, columns, model.layout, 8)

    ahead = list(dataset_module.read_ahead(batches()))
    in_turn = list(batches())
    assert [b.samples.batch_size for b in ahead] == [8, 8, 8, 8, 8, 5]
    for a, b in zip(ahead, in_turn, strict=True):
        np.testing.assert_array_equal(a.samples.dense, b.samples.dense)
        np.testing.assert_array_equal(a.labels, b.labels)
        for t in range(len(files.slot_nums)):
            np.testing.assert_array_equal(a.samples.flat_keys(t), b.samples.flat_keys(t))
            np.testing.assert_array_equal(a.samples.table_offsets(t), b.samples.table_offsets(t))
    table = pq.read_table(path)
    values = table.column("I2").to_pylist()
    values[41] = None
    pq.write_table(table.set_column(2, "I2", pa.array(values, pa.float32())), path)
    with pytest.raises(ModelFileError, match=r"column 'I2' is null at row 41"):
        list(dataset_module.read_ahead(batches()))


def test_file_list_metadata_and_unlabelled_data(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["dcn"], seed=35, max_batch_size=8)
    model = InferenceModel.from_ps_json(files.ps_json)
    rng = np.random.default_rng(36)
    parts, all_keys, all_dense = [], [], []
    for i, n in enumerate((6, 11)):
        keys = random_keys(rng, n, files.slot_nums, files.known_keys(), 2)
        dense = rng.standard_normal((n, 13)).astype(np.float32)
        columns = write_dataset(tmp_path / f"part{i}.parquet", files, dense, keys)
        parts.append(f"part{i}.parquet")
        all_keys += keys
        all_dense.append(dense)
    (tmp_path / "_file_list.txt").write_text(f"2\n{parts[1]}\n{parts[0]}\n")
    # _metadata.json names the columns; the files' own order does not matter then.
    metadata = {
        "labels": [],
        "conts": [{"col_name": c, "index": i} for i, c in enumerate(columns.dense)],
        "cats": [{"col_name": c, "index": i} for i, c in enumerate(columns.categorical)],
    }
    (tmp_path / "_metadata.json").write_text(json.dumps(metadata))
    result = model.predict_dataset(tmp_path / "_file_list.txt")
    assert result.labels is None
    dense = np.concatenate([all_dense[1], all_dense[0]])
    keys = all_keys[6:] + all_keys[:6]
    np.testing.assert_allclose(result.scores, reference(files, dense, keys), rtol=1e-4, atol=1e-5)
    with pytest.raises(RequestError, match="no label columns"):
        result.auc()


def test_dataset_errors_name_file_column_and_row(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=37, max_batch_size=8)
    model = InferenceModel.from_ps_json(files.ps_json)
    rng = np.random.default_rng(38)
    keys = random_keys(rng, 4, files.slot_nums, files.known_keys(), 2)
    dense = rng.standard_normal((4, 13)).astype(np.float32)
    path = tmp_path / "d.parquet"
    write_dataset(path, files, dense, keys)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["I3"]), tmp_path / "short.parquet")
    # Criteo's names: the missing column is named.
    with pytest.raises(ModelFileError, match=r"short.parquet: columns named as Criteo's .*I3"):
        model.predict_dataset(tmp_path / "short.parquet")
    # Other names: matched by position, so the count is what is wrong.
    renamed = table.drop_columns(["I3"]).rename_columns([f"x{i}" for i in range(40)])
    pq.write_table(renamed, tmp_path / "unnamed.parquet")
    with pytest.raises(ModelFileError, match=r"unnamed.parquet: 40 columns, but model 'rank'"):
        model.predict_dataset(tmp_path / "unnamed.parquet")
    nulls = table.set_column(4, "I5", pa.array([1.0, None, 2.0, 3.0], pa.float32()))
    pq.write_table(nulls, tmp_path / "nulls.parquet")
    with pytest.raises(ModelFileError, match=r"nulls.parquet: column 'I5' is null at row 1"):
        model.predict_dataset(tmp_path / "nulls.parquet")
    text = table.set_column(20, "C8", pa.array(["a", "b", "c", "d"]))
    pq.write_table(text, tmp_path / "text.parquet")
    with pytest.raises(ModelFileError, match=r"categorical column 'C8' must hold integers"):
        model.predict_dataset(tmp_path / "text.parquet")
    # Read by position, a column of the wrong type says how the columns were read.
    unnamed = text.rename_columns([f"x{i}" for i in range(text.num_columns)])
    pq.write_table(unnamed, tmp_path / "text_unnamed.parquet")
    with pytest.raises(ModelFileError) as info:
        model.predict_dataset(tmp_path / "text_unnamed.parquet")
    assert "categorical column 'x20' must hold integers or lists of them, holds string" in str(
        info.value
    )
    assert "read by position as 0 label, 13 dense and 28 categorical" in str(info.value)
    (tmp_path / "bad_list.txt").write_text("3\nd.parquet\n")
    with pytest.raises(ModelFileError, match="says 3 files but lists 1"):
        model.predict_dataset(tmp_path / "bad_list.txt")
    (tmp_path / "empty_list.txt").write_text("0\n")
    with pytest.raises(ModelFileError, match=r"empty_list\.txt: lists no files"):
        model.predict_dataset(tmp_path / "empty_list.txt")
    (tmp_path / "text.txt.parquet").write_text("not parquet")
    with pytest.raises(ModelFileError, match=r"text.txt.parquet: not a readable Parquet file"):
        model.predict_dataset(tmp_path / "text.txt.parquet")
    cut = tmp_path / "cut" / "d.parquet"
    cut.parent.mkdir()
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelFileError, match=r"cut/d.parquet: not a readable Parquet file"):
        model.predict_dataset(cut)
    meta = tmp_path / "meta"
    meta.mkdir()
    (meta / "d.parquet").write_bytes(path.read_bytes())
    (meta / "_metadata.json").write_text("[1, 2]")
    with pytest.raises(ModelFileError, match=r"_metadata.json: not a dataset metadata file"):
        model.predict_dataset(meta)


def wdl_dataset(tmp_path: Path, samples: int, hot: int, seed: int):
    """The zoo's W&D and a Parquet file of ``samples`` samples with ``hot`` keys in every
    slot (list columns): ``(model, path, table)``."""
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=seed, max_batch_size=8)
    rng = np.random.default_rng(seed + 1)
    keys = random_keys(rng, samples, files.slot_nums, files.known_keys(), hot)
    keys = [[[slot[:hot] or [0] * hot for slot in table] for table in sample] for sample in keys]
    dense = rng.standard_normal((samples, 13)).astype(np.float32)
    path = tmp_path / "d.parquet"
    write_dataset(path, files, dense, keys)
    return InferenceModel.from_ps_json(files.ps_json), path, pq.read_table(path)


def test_list_columns_of_every_layout_score_alike(tmp_path: Path) -> None:
    """list, large_list (Polars' default) and fixed_size_list hold the same keys."""
    model, path, table = wdl_dataset(tmp_path, samples=6, hot=1, seed=43)
    want = model.predict_dataset(path).scores
    for kind in (pa.large_list(pa.int64()), pa.list_(pa.int64(), 1)):
        cast = table.cast(pa.schema([
            pa.field(f.name, kind if pa.types.is_list(f.type) else f.type) for f in table.schema
        ]))  # fmt: skip
        pq.write_table(cast, tmp_path / "cast.parquet")
        np.testing.assert_array_equal(model.predict_dataset(tmp_path / "cast.parquet").scores, want)


def test_values_the_server_refuses_are_refused_naming_column_and_row(tmp_path: Path) -> None:
    model, _, table = wdl_dataset(tmp_path, samples=4, hot=2, seed=45)
    for values, kind, word in (
        ([1.0, 2.0, np.nan, 3.0], pa.float32(), "nan"),
        ([1.0, 2.0, -np.inf, 3.0], pa.float32(), "-inf"),
        ([1.0, 2.0, 3e38 * 10, 3.0], pa.float64(), "inf"),  # beyond float32
    ):
        pq.write_table(table.set_column(4, "I5", pa.array(values, kind)), tmp_path / "x.parquet")
        with pytest.raises(ModelFileError) as info:
            model.predict_dataset(tmp_path / "x.parquet")
        assert f"x.parquet: column 'I5' is {word} at row 2" in str(info.value)
        assert "dense features must be finite numbers" in str(info.value)
    column = table.column("C3").to_pylist()
    column[3] = [column[3][0], None]
    nulls = table.set_column(table.schema.get_field_index("C3"), "C3",
                             pa.array(column, pa.list_(pa.int64())))  # fmt: skip
    pq.write_table(nulls, tmp_path / "null_key.parquet")
    with pytest.raises(ModelFileError, match=r"column 'C3' holds a null key at row 3"):
        model.predict_dataset(tmp_path / "null_key.parquet")


def test_check_out_tensor_equals_a_float64_recomputation(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["dlrm"], seed=39, max_batch_size=8)
    model = InferenceModel.from_ps_json(files.ps_json)
    with pytest.raises(RequestError, match="needs a prediction first"):
        model.check_out_tensor("interaction")
    rng = np.random.default_rng(40)
    keys = random_keys(rng, 6, files.slot_nums, files.known_keys(), 1)
    dense = rng.standard_normal((6, 13)).astype(np.float32)
    model.predict(*encode_hugectr(dense, keys))
    layers = embedding_layers(files.network_file)
    pooled = {
        layer["name"]: pooled_reference(layer, files.tables[t], files.defaults[t], keys, t)
        for t, layer in enumerate(layers)
    }
    # The reference interpreter's tensors, in float64, for the same batch.
    flat = np.fromfile(files.dense_file, dtype="<f4")
    expected = network_forward(files.network_file, flat, dense, pooled, keep=True)
    for name in ("bot_fc1", "bot_relu1", "interaction", "top_fc1", "sigmoid"):
        got = model.check_out_tensor(name)
        np.testing.assert_allclose(got, expected[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # The pre-ReLU output differs from the ReLU's: fusion does not hide it.
    assert np.any(model.check_out_tensor("bot_fc1") < 0)
    assert np.all(model.check_out_tensor("bot_relu1") >= 0)
    with pytest.raises(RequestError, match=r"no tensor 'fc9'.*its tensors: dense, "):
        model.check_out_tensor("fc9")


def test_from_files_without_a_ps_json(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=41, max_batch_size=8)
    doc = json.loads(files.ps_json.read_text())["models"][0]
    base = files.ps_json.parent
    model = InferenceModel.from_files(
        files.network_file,
        files.dense_file,
        [base / p for p in doc["sparse_files"]],
        default_values=doc["default_value_for_each_table"],
        max_batch_size=8,
        workdir=tmp_path / "work",
    )
    rng = np.random.default_rng(42)
    keys = random_keys(rng, 5, files.slot_nums, files.known_keys(), 2, unknown=0.2)
    dense = rng.standard_normal((5, 13)).astype(np.float32)
    got = model.predict(*encode_hugectr(dense, keys))
    np.testing.assert_allclose(got, reference(files, dense, keys), rtol=1e-4, atol=1e-5)
    with pytest.raises(RequestError, match="2 embedding layers, 1 sparse files"):
        InferenceModel.from_files(files.network_file, files.dense_file, ["x"])


def test_hps_predict_writes_labels_and_predictions(tmp_path: Path, capsys) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["dcn"], seed=43, max_batch_size=8)
    rng = np.random.default_rng(44)
    keys = random_keys(rng, 30, files.slot_nums, files.known_keys(), 2)
    dense = rng.standard_normal((30, 13)).astype(np.float32)
    labels = (rng.random(30) < 0.5).astype(np.float32)
    write_dataset(tmp_path / "d.parquet", files, dense, keys, labels)
    out = tmp_path / "out" / "pred.parquet"
    assert hps_main(["predict", str(files.ps_json), str(tmp_path / "d.parquet"),
                     "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "scored 30 samples on the CPU" in printed and "AUC " in printed
    table = pq.read_table(out)
    assert table.column_names == ["label", "prediction"]
    np.testing.assert_array_equal(table["label"].to_numpy(), labels)
    np.testing.assert_allclose(
        table["prediction"].to_numpy(), reference(files, dense, keys)[:, 0], rtol=1e-4,
        atol=1e-5,
    )  # fmt: skip
    assert hps_main(["predict", str(files.ps_json), str(tmp_path / "d.parquet"),
                     "--out", str(out)]) == 2  # fmt: skip
    assert "pass --overwrite" in capsys.readouterr().err


def test_an_auc_that_cannot_be_computed_says_why(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=47, max_batch_size=8)
    model = InferenceModel.from_ps_json(files.ps_json, device_id="cpu")  # as --device cpu
    assert model.session.device_id is None
    rng = np.random.default_rng(48)
    keys = random_keys(rng, 4, files.slot_nums, files.known_keys(), 1)
    dense = rng.standard_normal((4, 13)).astype(np.float32)
    labels = np.array([0.0, 1.0, 0.5, 1.0])
    write_dataset(tmp_path / "half.parquet", files, dense, keys, labels=labels)
    with pytest.raises(RequestError, match=r"label column 'label' holds 0.5 at row 2"):
        model.evaluate(tmp_path / "half.parquet")
    table = pq.read_table(tmp_path / "half.parquet")
    pq.write_table(table.slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(RequestError, match="the dataset has no rows"):
        model.evaluate(tmp_path / "empty.parquet")


def test_auc_against_pairs() -> None:
    rng = np.random.default_rng(45)
    labels = (rng.random(300) < 0.3).astype(np.int64)
    scores = np.round(rng.random(300), 1)  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auc(labels, scores) == pytest.approx(pairs / (pos.size * neg.size))
    with pytest.raises(RequestError, match="both classes"):
        auc(np.zeros(4), np.ones(4))
    with pytest.raises(RequestError, match=r"labels of 0 and 1 only: labels holds 2 at row 1"):
        auc(np.array([0, 2]), np.ones(2))


def test_datasets_on_s3_equal_local_ones(tmp_path: Path, s3, capsys) -> None:
    """A dataset folder, a file and a file list on an S3-compatible server (moto, loopback)
    score as the same files on disk; a missing key and a missing bucket are named."""
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=46, max_batch_size=8)
    model = InferenceModel.from_ps_json(files.ps_json)
    rng = np.random.default_rng(47)
    local = tmp_path / "data"
    local.mkdir()
    for i, n in enumerate((9, 4)):
        keys = random_keys(rng, n, files.slot_nums, files.known_keys(), 2)
        dense = rng.standard_normal((n, 13)).astype(np.float32)
        labels = (np.arange(n) % 2).astype(np.float32)
        write_dataset(local / f"part{i}.parquet", files, dense, keys, labels)
    s3.create_dir("bucket")
    for name in ("part0.parquet", "part1.parquet"):
        with s3.open_output_stream(f"bucket/ds/{name}") as out:
            out.write((local / name).read_bytes())
    with s3.open_output_stream("bucket/ds/_SUCCESS") as out:
        out.write(b"")
    with s3.open_output_stream("bucket/list/_file_list.txt") as out:
        out.write(b"2\ns3://bucket/ds/part1.parquet\ns3://bucket/ds/part0.parquet\n")
    want = model.predict_dataset(local)
    got = model.predict_dataset("s3://bucket/ds/")
    np.testing.assert_array_equal(got.scores, want.scores)
    np.testing.assert_array_equal(got.labels, want.labels)
    one = model.predict_dataset("s3://bucket/ds/part1.parquet")
    np.testing.assert_array_equal(one.scores, want.scores[9:])
    listed = model.predict_dataset("s3://bucket/list/_file_list.txt")
    np.testing.assert_array_equal(listed.scores, np.concatenate([want.scores[9:], want.scores[:9]]))
    with pytest.raises(ModelFileError, match=r"s3://bucket/nothing: Parquet file or folder does"):
        model.predict_dataset("s3://bucket/nothing")
    with pytest.raises(ModelFileError, match=r"s3://no-bucket/x"):
        model.predict_dataset("s3://no-bucket/x")
    out = tmp_path / "pred.parquet"
    assert hps_main(["predict", str(files.ps_json), "s3://bucket/ds", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "scored 13 samples" in printed.out
    assert SECRET not in printed.out + printed.err


def test_a_model_on_s3_equals_the_same_files_on_disk(tmp_path: Path, s3, capsys) -> None:
    """sparse_files, dense_file and network_file given as s3:// URIs (read in chunks into the
    host tier, no local copy): the same predictions as the local files; hps check reads them;
    a missing object is named."""
    files = write_ranking_files(tmp_path / "m", OWN["dcn"], seed=48, max_batch_size=8)
    s3.create_dir("models")
    upload(s3, files.ps_json.parent, "models/dcn")
    doc = json.loads(files.ps_json.read_text())
    model = doc["models"][0]
    for key in ("network_file", "dense_file"):
        model[key] = f"s3://models/dcn/{model[key]}"
    model["sparse_files"] = [f"s3://models/dcn/{p}" for p in model["sparse_files"]]
    remote_ps = tmp_path / "remote_ps.json"
    remote_ps.write_text(json.dumps(doc))
    rng = np.random.default_rng(49)
    keys = random_keys(rng, 7, files.slot_nums, files.known_keys(), 2, unknown=0.1)
    dense = rng.standard_normal((7, 13)).astype(np.float32)
    batch = encode_hugectr(dense, keys)
    local = InferenceModel.from_ps_json(files.ps_json).predict(*batch)
    remote = InferenceModel.from_ps_json(remote_ps).predict(*batch)
    np.testing.assert_array_equal(remote, local)
    np.testing.assert_allclose(remote, reference(files, dense, keys), rtol=1e-4, atol=1e-5)
    assert hps_main(["check", str(remote_ps)]) == 0
    assert "s3://models/dcn/" in capsys.readouterr().out
    model["sparse_files"][0] = "s3://models/dcn/nothing_here"
    remote_ps.write_text(json.dumps(doc))
    assert hps_main(["check", str(remote_ps)]) == 1
    err = capsys.readouterr().err
    assert "s3://models/dcn/nothing_here" in err and SECRET not in err
