"""RankingSession: lookup + pooling + dense network against the float64 reference, on the
project's four networks (and HugeCTR's, where they are here) with random tables and multi-hot,
empty and unknown-key samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from network_files import NETWORKS, OWN, network_id
from nn_testdata import network_text
from ranking_reference import predict_reference, random_keys
from ranking_testdata import to_sparse_batch, write_ranking_files

from hps_core.errors import RequestError
from hps_core.infer import RankingSession, SparseBatch, concat_batches, split_samples


def random_dense(rng: np.random.Generator, batch: int, dim: int) -> np.ndarray:
    return (0.5 * rng.standard_normal((batch, dim))).astype(np.float32)


@pytest.mark.parametrize("network", NETWORKS, ids=network_id)
def test_predictions_equal_the_reference(tmp_path: Path, network: Path) -> None:
    files = write_ranking_files(tmp_path / "model", network, seed=5)
    session = RankingSession.open(files.ps_json, files.name)
    rng = np.random.default_rng(6)
    dense_dim = session.layout.dense_dim
    for batch, max_hot in ((1, 1), (5, 3), (40, 2)):
        keys = random_keys(
            rng, batch, files.slot_nums, files.known_keys(), max_hot, empty=0.2, unknown=0.1
        )
        dense = random_dense(rng, batch, dense_dim)
        got = session.predict(to_sparse_batch(dense, keys))
        want = predict_reference(
            files.network_file, files.dense_file, files.tables, files.defaults, dense, keys
        )
        assert got.dtype == np.float32 and got.shape == want.shape == (batch, 1)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("network", OWN.values(), ids=network_id)
def test_fixed_hotness_batches_equal_the_reference(tmp_path: Path, network: Path) -> None:
    """A batch whose every slot holds h keys (per table) comes without offsets and is pooled
    by a reshape (a view for h = 1); the same keys with offsets go through pool_embeddings.
    The networks' embeddings include sum and mean combiners (DCN's is mean)."""
    files = write_ranking_files(tmp_path / "model", network, seed=8)
    session = RankingSession.open(files.ps_json, files.name)
    rng = np.random.default_rng(9)
    for batch, hot in ((1, 1), (7, 3), (33, 2)):
        hotness = [1 if t % 2 else hot for t in range(len(files.slot_nums))]
        keys = random_keys(rng, batch, files.slot_nums, files.known_keys(), hotness, unknown=0.1)
        # Every slot holds exactly its table's hotness (random_keys draws 1..max_hot keys).
        keys = [
            [
                [(slot * hotness[t])[: hotness[t]] for slot in table]
                for t, table in enumerate(sample)
            ]
            for sample in keys
        ]
        matrix = np.array([[k for table in s for slot in table for k in slot] for s in keys])
        widths = [n * h for n, h in zip(files.slot_nums, hotness, strict=True)]
        dense = random_dense(rng, batch, session.layout.dense_dim)
        fixed = SparseBatch.from_sample_keys(dense, matrix, widths, hotness)
        want = predict_reference(
            files.network_file, files.dense_file, files.tables, files.defaults, dense, keys
        )
        np.testing.assert_allclose(session.predict(fixed), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(
            session.predict(fixed), session.predict(to_sparse_batch(dense, keys))
        )


def test_tables_follow_embedding_layer_file_order(tmp_path: Path) -> None:
    """The W&D file lists deep_data before wide_data but defines the wide embedding first (as
    HugeCTR's wdl_1gpu.json does): table 0 is the wide table (2 slots, vector size 1)."""
    files = write_ranking_files(tmp_path / "wdl", OWN["wdl"], seed=8)
    layout = RankingSession.open(files.ps_json, files.name).layout
    assert [(t.layer, t.slot_num, t.vec_size) for t in layout.tables] == [
        ("wide_embedding", 2, 1),
        ("deep_embedding", 26, 16),
    ]


class RecordingLookup:
    """Wraps a lookup and records every call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[int, list[int]]] = []

    def _record(self, table_ids, keys) -> None:
        for table_id, table_keys in zip(table_ids, keys, strict=True):
            self.calls.append((table_id, table_keys.tolist()))

    def lookup_many(self, table_ids, keys):
        self._record(table_ids, keys)
        return self.inner.lookup_many(table_ids, keys)

    def lookup_rows_many(self, table_ids, keys):
        self._record(table_ids, keys)
        return self.inner.lookup_rows_many(table_ids, keys)


def test_batches_join_into_one_lookup_per_table(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "wdl", OWN["wdl"], seed=9)
    opened = RankingSession.open(files.ps_json, files.name)
    recorder = RecordingLookup(opened.lookup)
    session = RankingSession(opened.layout, recorder, opened.executor)
    rng = np.random.default_rng(10)
    parts: list[SparseBatch] = []
    keys_of_parts = []
    for size in (3, 1, 6):
        keys = random_keys(rng, size, files.slot_nums, files.known_keys(), 3, empty=0.3)
        parts.append(to_sparse_batch(random_dense(rng, size, 13), keys))
        keys_of_parts.append(keys)
    joined = concat_batches(parts)
    scores = session.predict(joined)
    assert [table for table, _ in recorder.calls] == [0, 1]
    for t, (_, looked_up) in enumerate(recorder.calls):
        assert looked_up == [k for keys in keys_of_parts for s in keys for sl in s[t] for k in sl]
    recorder.calls.clear()
    for part, piece in zip(parts, split_samples(scores, [3, 1, 6]), strict=True):
        np.testing.assert_allclose(piece, session.predict(part), rtol=1e-6, atol=1e-7)


def test_unused_embedding_layer_is_not_looked_up(tmp_path: Path) -> None:
    layers = [
        {"name": "used", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "a",
         "top": "used", "sparse_embedding_hparam": {"embedding_vec_size": 4, "combiner": "sum"}},
        {"name": "unused", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "b",
         "top": "unused", "sparse_embedding_hparam": {"embedding_vec_size": 2, "combiner": "sum"}},
        {"type": "Reshape", "bottom": "used", "top": "flat", "leading_dim": 12},
        {"type": "Concat", "bottom": ["flat", "dense"], "top": "cat"},
        {"type": "InnerProduct", "bottom": "cat", "top": "out", "fc_param": {"num_output": 2}},
    ]  # fmt: skip
    network = tmp_path / "net.json"
    network.write_text(network_text(layers, dense_dim=5, sparse=(("a", 3, 1), ("b", 2, 1))))
    files = write_ranking_files(tmp_path / "model", network, seed=12)
    opened = RankingSession.open(files.ps_json, files.name)
    assert opened.layout.label_dim == 2
    recorder = RecordingLookup(opened.lookup)
    session = RankingSession(opened.layout, recorder, opened.executor)
    rng = np.random.default_rng(13)
    keys = random_keys(rng, 4, files.slot_nums, files.known_keys(), 2)
    dense = random_dense(rng, 4, 5)
    got = session.predict(to_sparse_batch(dense, keys))
    assert [table for table, _ in recorder.calls] == [0]
    want = predict_reference(
        files.network_file, files.dense_file, files.tables, files.defaults, dense, keys
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_batch_that_does_not_fit_is_a_request_error(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=14)
    session = RankingSession.open(files.ps_json, files.name)
    rng = np.random.default_rng(15)
    good = to_sparse_batch(
        random_dense(rng, 2, 13), random_keys(rng, 2, files.slot_nums, files.known_keys())
    )
    bad = {
        "2 tables": SparseBatch(good.dense, good.keys[:1], good.row_offsets[:1]),
        "dense features": SparseBatch(good.dense[:, :12], good.keys, good.row_offsets),
        "row offsets": SparseBatch(good.dense, good.keys, (good.row_offsets[0][:-1],) * 2),
    }
    for words, batch in bad.items():
        with pytest.raises(RequestError, match=words):
            session.predict(batch)


def test_empty_table_keys_pool_to_zeros(tmp_path: Path) -> None:
    files = write_ranking_files(tmp_path / "m", OWN["dcn"], seed=16)
    session = RankingSession.open(files.ps_json, files.name)
    keys = [[[[] for _ in range(26)]] for _ in range(3)]
    dense = random_dense(np.random.default_rng(17), 3, 13)
    got = session.predict(to_sparse_batch(dense, keys))
    want = predict_reference(
        files.network_file, files.dense_file, files.tables, files.defaults, dense, keys
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert json.loads(files.ps_json.read_text())["models"][0]["model"] == files.name


def test_a_slot_off_a_fixed_length_inputs_hotness_is_scored_as_given_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    network = json.loads(OWN["dcn"].read_text())
    data = next(layer for layer in network["layers"] if layer["type"] == "Data")
    data["sparse"][0].update(is_fixed_length=True, nnz_per_slot=2)
    (tmp_path / "fixed.json").write_text(json.dumps(network))
    files = write_ranking_files(tmp_path / "m", tmp_path / "fixed.json", seed=18, max_hot=2)
    session = RankingSession.open(files.ps_json, files.name)
    assert session.layout.hotness == (2,)
    rng = np.random.default_rng(19)
    known = files.known_keys()[0]
    keys = [[[list(rng.choice(known, 2)) for _ in range(26)]] for _ in range(4)]
    dense = random_dense(rng, 4, 13)
    with caplog.at_level("WARNING", logger="hps_core"):
        session.predict(to_sparse_batch(dense, keys))
    assert not caplog.records  # every slot holds its 2 keys

    keys[2][0][5] = keys[2][0][5][:1]  # sample 2, slot 5: one key
    keys[3][0][0] = [*keys[3][0][0], known[0]]  # sample 3, slot 0: three
    with caplog.at_level("WARNING", logger="hps_core"):
        got = session.predict(to_sparse_batch(dense, keys))
    (record,) = caplog.records
    assert (
        f"model '{files.name}' table 0 ('sparse_embedding1'): slot 5 of sample 2 of a batch "
        "holds 1 key, but the network's fixed-length input has 2 in every slot (2 of the "
        "batch's 4 samples differ); "
        "scored as given" in record.getMessage()
    )
    want = predict_reference(
        files.network_file, files.dense_file, files.tables, files.defaults, dense, keys
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("given", "mixed", "want"),
    [(None, False, "fp32"), (None, True, "fp16"), ("fp32", True, "fp32"), ("tf32", False, "tf32")],
)
def test_the_dense_precision_defaults_to_the_ps_jsons_use_mixed_precision(
    tmp_path: Path, given: str | None, mixed: bool, want: str
) -> None:
    """As HugeCTR's hugectr backend, served and offline alike: the ps.json's
    use_mixed_precision unless a precision is given (config.pbtxt, hps predict --precision)."""
    files = write_ranking_files(tmp_path / "m", OWN["wdl"], seed=21, use_mixed_precision=mixed)
    session = RankingSession.open(files.ps_json, files.name, precision=given)
    assert session.executor.ctx.precision.value == want
