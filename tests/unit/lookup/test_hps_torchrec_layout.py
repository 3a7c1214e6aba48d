"""How hps_torchrec cuts a KeyedJaggedTensor into each table's lookup: where each feature's
ids start, which features have bags of one length (pooled by hotness, without offsets), and
each table's keys and offsets. Checked against a NumPy reference on random lengths, with the
tensor path (the one CUDA keys take) compared with the NumPy path (host keys)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hps_core.hps_torchrec import (  # noqa: E402
    TableSpec,
    _feature_layout,
    _rebased_offsets,
    _table_hotness,
    _TableKeys,
)

SAMPLES = 6
# Per feature, how its bags are drawn: a fixed length, or ragged lengths from 0 to 4.
FEATURES = {"one_hot": 1, "three_hot": 3, "ragged": None, "empty": 0, "five_hot": 5, "also_3": 3}
TABLES = [
    TableSpec("t_one", 4, ("one_hot",)),
    TableSpec("t_pair", 4, ("three_hot", "also_3")),  # two features of one hotness: by hotness
    TableSpec("t_mixed", 4, ("five_hot", "ragged")),  # two hotnesses: offsets
    TableSpec("t_empty", 4, ("empty",), pooling="mean"),  # empty bags: offsets
    TableSpec("t_seq", 4, ("one_hot",), pooling="none"),  # a sequence: offsets
]


def _lengths(rng: np.random.Generator, samples: int) -> np.ndarray:
    rows = []
    for fixed in FEATURES.values():
        if fixed is None:
            rows.append(rng.integers(0, 5, samples))
        else:
            rows.append(np.full(samples, fixed))
    return np.concatenate(rows).astype(np.int64)


@pytest.mark.parametrize("samples", [0, 1, SAMPLES])
def test_the_layout_is_the_lengths_cumulative_sums_and_single_lengths(samples: int) -> None:
    rng = np.random.default_rng(samples)
    lengths = _lengths(rng, samples)
    starts, one = _feature_layout(torch.from_numpy(lengths), len(FEATURES), samples)
    per_feature = lengths.reshape(len(FEATURES), samples).astype(np.float64)
    assert starts == [0, *np.cumsum(per_feature.sum(axis=1)).astype(int).tolist()]
    want = [
        int(row[0]) if samples and (row == row[0]).all() and row[0] > 0 else None
        for row in per_feature
    ]
    assert one == want
    if samples == SAMPLES:
        assert one == [1, 3, None, None, 5, 3]  # the ragged draw holds two lengths at least


@pytest.mark.parametrize("weighted", [False, True])
def test_tables_of_one_bag_length_go_without_offsets_and_the_tensor_path_cuts_alike(
    weighted: bool,
) -> None:
    rng = np.random.default_rng(3)
    lengths = _lengths(rng, SAMPLES)
    values = rng.integers(0, 1000, int(lengths.sum())).astype(np.int64)
    weights = rng.random(len(values)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    where = {name: i for i, name in enumerate(FEATURES)}
    starts, one = _feature_layout(torch.from_numpy(lengths), len(FEATURES), SAMPLES)
    hotness = [_table_hotness(t, where, one, weighted) for t in TABLES]
    if weighted:
        assert hotness == [None] * len(TABLES)
    else:
        assert hotness == [1, 3, None, None, None]

    rebased = _rebased_offsets(torch.from_numpy(offsets), len(FEATURES), SAMPLES)
    by_numpy = _TableKeys.gather(
        TABLES, where, SAMPLES, starts, values, rebased.numpy(),
        weights if weighted else None, hotness,
    )  # fmt: skip
    by_tensor = _TableKeys.gather(
        TABLES, where, SAMPLES, starts, torch.from_numpy(values), rebased,
        torch.from_numpy(weights) if weighted else None, hotness,
    )  # fmt: skip
    for spec, hot, a, b in zip(TABLES, hotness, by_numpy, by_tensor, strict=True):
        # The reference: the table's features' ids back to back, their bags' offsets from 0.
        ids = [values[starts[where[f]] : starts[where[f] + 1]] for f in spec.feature_names]
        bag_lengths = np.concatenate([
            lengths[where[f] * SAMPLES : (where[f] + 1) * SAMPLES] for f in spec.feature_names
        ])  # fmt: skip
        np.testing.assert_array_equal(a.keys, np.concatenate(ids))
        np.testing.assert_array_equal(b.keys.numpy(), a.keys)
        assert a.counts == b.counts == [len(i) for i in ids]
        assert a.hotness == b.hotness == hot
        if hot is None:
            want = np.concatenate([[0], np.cumsum(bag_lengths)])
            np.testing.assert_array_equal(a.offsets, want)
            np.testing.assert_array_equal(b.offsets.numpy(), want)
        else:
            assert a.offsets is None and b.offsets is None
            assert (bag_lengths == hot).all()
        if weighted:
            np.testing.assert_array_equal(b.weights.numpy(), a.weights)


@pytest.mark.parametrize("samples", [0, 1, SAMPLES])
def test_rebased_offsets_are_each_features_offsets_from_0(samples: int) -> None:
    """Against a loop over the features: offsets ``[f * S, (f + 1) * S]`` less their first,
    from an offsets tensor that is a view (not starting at its storage's start)."""
    rng = np.random.default_rng(samples + 10)
    lengths = _lengths(rng, samples)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    padded = torch.from_numpy(np.concatenate([[-7], offsets]))[1:]  # a view at offset 1
    got = _rebased_offsets(padded, len(FEATURES), samples)
    assert got.dtype == torch.int64 and tuple(got.shape) == (len(FEATURES), samples + 1)
    for f in range(len(FEATURES)):
        window = offsets[f * samples : (f + 1) * samples + 1]
        np.testing.assert_array_equal(got[f].numpy(), window - window[0])
