"""Joining the samples of several requests into one batch, and cutting results back."""

from __future__ import annotations

import itertools

import numpy as np
from ranking_reference import random_keys
from ranking_testdata import to_sparse_batch

from hps_core.infer import concat_batches, split_samples


def assert_same_batch(got, want) -> None:
    np.testing.assert_array_equal(got.dense, want.dense)
    assert len(got.keys) == len(want.keys) == len(got.row_offsets)
    for t in range(len(want.keys)):
        np.testing.assert_array_equal(got.keys[t], want.keys[t])
        np.testing.assert_array_equal(got.row_offsets[t], want.row_offsets[t])
        assert got.keys[t].dtype == np.int64 and got.row_offsets[t].dtype == np.int64


def test_joined_batch_equals_the_batch_of_all_samples() -> None:
    rng = np.random.default_rng(3)
    for _ in range(30):
        slot_nums = [int(s) for s in rng.integers(1, 5, int(rng.integers(1, 4)))]
        known = [rng.integers(-1000, 1000, 50) for _ in slot_nums]
        sizes = [int(n) for n in rng.integers(1, 6, int(rng.integers(1, 5)))]
        parts = []
        all_dense, all_keys = [], []
        for size in sizes:
            keys = random_keys(rng, size, slot_nums, known, max_hot=3, empty=0.3)
            dense = rng.standard_normal((size, 2)).astype(np.float32)
            parts.append(to_sparse_batch(dense, keys))
            all_dense.append(dense)
            all_keys.extend(keys)
        joined = concat_batches(parts)
        assert joined.batch_size == sum(sizes)
        assert_same_batch(joined, to_sparse_batch(np.concatenate(all_dense), all_keys))


def test_one_batch_is_returned_as_it_is() -> None:
    rng = np.random.default_rng(4)
    batch = to_sparse_batch(np.zeros((2, 3), np.float32), random_keys(rng, 2, [2], [np.arange(9)]))
    assert concat_batches([batch]) is batch


def test_split_samples_cuts_rows_in_order() -> None:
    scores = np.arange(20, dtype=np.float32).reshape(10, 2)
    pieces = split_samples(scores, [3, 0, 6, 1])
    assert [p.shape for p in pieces] == [(3, 2), (0, 2), (6, 2), (1, 2)]
    np.testing.assert_array_equal(np.concatenate(pieces), scores)
    assert all(np.shares_memory(p, scores) for p in pieces if p.size)


def test_one_hot_tables_join_without_offsets_and_mix_with_others() -> None:
    rng = np.random.default_rng(5)
    keys = random_keys(rng, 4, [2, 1], [np.arange(20), np.arange(30)], max_hot=1)
    full = to_sparse_batch(np.ones((4, 2), np.float32), keys)
    first, second = to_sparse_batch(full.dense[:2], keys[:2]), full
    one_hot = type(full)(first.dense, first.keys, (None, None))
    # Two one-hot parts stay one-hot; a one-hot part joined with offsets gets offsets.
    joined = concat_batches([one_hot, one_hot])
    assert joined.row_offsets == (None, None)
    assert joined.table_offsets(0).tolist() == list(range(9))
    mixed = concat_batches([one_hot, second])
    expected = concat_batches([first, second])
    for t in range(2):
        np.testing.assert_array_equal(mixed.row_offsets[t], expected.row_offsets[t])
        np.testing.assert_array_equal(mixed.keys[t], expected.keys[t])


def test_fixed_hotness_batches_join_as_key_matrices_or_flat_keys() -> None:
    """Batches of the samples contract (a [B, K] key matrix, no offsets) join into one such
    batch; joined with a batch of offsets, every table gets offsets that mean the same."""
    from hps_core.infer import SparseBatch

    rng = np.random.default_rng(8)
    widths, hotness = (3, 2), (3, 1)  # table 0: 1 slot of 3 keys; table 1: 2 slots of 1
    parts = [
        SparseBatch.from_sample_keys(
            np.full((n, 1), n, np.float32), rng.integers(0, 50, (n, 5)), widths, hotness
        )
        for n in (2, 3)
    ]
    joined = concat_batches(parts)
    assert joined.sample_keys.shape == (5, 5) and joined.row_offsets == (None, None)
    np.testing.assert_array_equal(
        joined.sample_keys, np.concatenate([p.sample_keys for p in parts])
    )
    assert joined.table_offsets(0).tolist() == [0, 3, 6, 9, 12, 15]
    assert joined.table_offsets(1).tolist() == list(range(11))
    assert joined.flat_keys(0).tolist() == joined.sample_keys[:, :3].ravel().tolist()
    with_offsets = SparseBatch(
        parts[0].dense,
        tuple(parts[0].flat_keys(t) for t in range(2)),
        tuple(parts[0].table_offsets(t) for t in range(2)),
    )
    mixed = concat_batches([with_offsets, parts[1]])
    for t in range(2):
        np.testing.assert_array_equal(mixed.flat_keys(t), joined.flat_keys(t))
        np.testing.assert_array_equal(mixed.table_offsets(t), joined.table_offsets(t))


def test_sample_ranges_join_back_into_the_batch() -> None:
    """Cutting a batch into sample ranges and joining them gives the batch back, for tables
    with offsets (empty bags included), one-hot tables and key matrices alike."""
    from hps_core.infer import SparseBatch

    rng = np.random.default_rng(9)
    for _ in range(20):
        samples = int(rng.integers(1, 9))
        keys = random_keys(rng, samples, [2, 1], [np.arange(40), np.arange(9)], empty=0.3)
        batch = to_sparse_batch(rng.standard_normal((samples, 2)).astype(np.float32), keys)
        one_hot = SparseBatch(batch.dense, (rng.integers(0, 9, samples),), (None,))
        matrix = SparseBatch.from_sample_keys(
            batch.dense, rng.integers(0, 50, (samples, 5)), (3, 2), (3, 1)
        )
        cuts = sorted({0, samples, *rng.integers(1, samples + 1, 2).tolist()})
        for whole in (batch, one_hot, matrix):
            parts = [whole.sample_range(a, b) for a, b in itertools.pairwise(cuts)]
            assert [p.batch_size for p in parts] == np.diff(cuts).tolist()
            for part in parts:
                for offsets in part.row_offsets:
                    assert offsets is None or offsets[0] == 0
            joined = concat_batches(parts)
            for t in range(len(whole.keys)):
                np.testing.assert_array_equal(joined.flat_keys(t), whole.flat_keys(t))
                np.testing.assert_array_equal(joined.table_offsets(t), whole.table_offsets(t))
            np.testing.assert_array_equal(joined.dense, whole.dense)
            if whole.sample_keys is not None:
                assert all(np.shares_memory(p.sample_keys, whole.sample_keys) for p in parts)
