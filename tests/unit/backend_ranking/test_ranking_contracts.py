"""The ranking request contracts (pure NumPy): HugeCTR's DES/CATCOLUMN/ROWINDEX and the
one-sample-per-row contract, parsed against a key-by-key reference encoder, and every bad
request rejected with the name of the input."""

from __future__ import annotations

import numpy as np
import pytest
from ranking_reference import encode_hugectr, encode_samples, random_keys
from ranking_testdata import to_sparse_batch

from hps_core.errors import RequestError
from hps_core.infer import RankingLayout, TableFeed
from hps_core.infer.contracts import HugeCTRContract, SamplesContract
from hps_core.nn import Combiner


def make_layout(
    slot_nums, dense_dim=3, max_batch_size=4, max_keys_per_sample=None, label_dim=1
) -> RankingLayout:
    per_sample = max_keys_per_sample or [2 * s for s in slot_nums]
    tables = tuple(
        TableFeed(t, f"t{t}", f"emb{t}", s, 4, Combiner.SUM, per_sample[t])
        for t, s in enumerate(slot_nums)
    )
    return RankingLayout("m", dense_dim, label_dim, max_batch_size, tables)


def assert_same_batch(got, want) -> None:
    np.testing.assert_array_equal(got.dense, want.dense)
    assert got.dense.dtype == np.float32 and got.dense.shape == want.dense.shape
    assert len(got.keys) == len(want.keys) == len(got.row_offsets)
    for t in range(len(want.keys)):
        assert got.flat_keys(t).tolist() == want.flat_keys(t).tolist()
        # A one-hot table may come without offsets: compare the offsets they stand for.
        assert got.table_offsets(t).tolist() == want.table_offsets(t).tolist()


def random_request(rng, layout, batch, max_hot, empty=0.2):
    known = [rng.integers(-(2**62), 2**62, 30) for _ in layout.tables]
    keys = random_keys(rng, batch, layout.slot_nums, known, max_hot, empty=empty)
    dense = rng.standard_normal((batch, layout.dense_dim)).astype(np.float32)
    return dense, keys


@pytest.mark.parametrize("flat", [False, True], ids=["[1,N]", "[N]"])
def test_hugectr_parse_equals_the_reference(flat: bool) -> None:
    rng = np.random.default_rng(31 + flat)
    for _ in range(150):
        slot_nums = [int(s) for s in rng.integers(1, 6, int(rng.integers(1, 5)))]
        layout = make_layout(slot_nums, int(rng.integers(0, 5)), 8, [3 * s for s in slot_nums])
        batch = int(rng.integers(1, 9))
        dense, keys = random_request(rng, layout, batch, max_hot=3)
        inputs = encode_hugectr(dense, keys)
        if flat:
            inputs = tuple(a[0] for a in inputs)
        parsed = HugeCTRContract(layout).parse(*inputs)
        assert parsed.batch_size == batch
        assert_same_batch(parsed, to_sparse_batch(dense, keys))


def test_hugectr_parse_of_32_bit_keys_equals_the_reference() -> None:
    """A model with supportlonglong false takes UINT32 CATCOLUMN (as HugeCTR's backend), keys
    up to 2**32 - 1, and refuses INT64 naming the dtype it wants."""
    rng = np.random.default_rng(37)
    layout = make_layout([2, 3], 4, 8, [6, 9])
    known = [rng.integers(0, 2**32, 30) for _ in layout.tables]
    known[0][0] = 2**32 - 1
    keys = random_keys(rng, 5, layout.slot_nums, known, 3, empty=0.2)
    dense = rng.standard_normal((5, 4)).astype(np.float32)
    des, catcolumn, rowindex = encode_hugectr(dense, keys)
    contract = HugeCTRContract(layout, key_dtype=np.uint32)
    parsed = contract.parse(des, catcolumn.astype(np.uint32), rowindex)
    assert all(k.dtype == np.int64 for k in parsed.keys)
    assert_same_batch(parsed, to_sparse_batch(dense, keys))
    with pytest.raises(RequestError, match="input 'CATCOLUMN': expected uint32, got int64"):
        contract.parse(des, catcolumn, rowindex)


def test_hugectr_worked_example_of_the_docstring() -> None:
    """Two tables (2 and 1 slots), sample 0 = {t0: [[5], [6, 7]], t1: [[9]]}, sample 1 =
    {t0: [[], [8]], t1: [[4]]}."""
    layout = make_layout([2, 1], dense_dim=1)
    parsed = HugeCTRContract(layout).parse(
        np.array([[0.5, 1.5]], np.float32),
        np.array([[5, 6, 7, 9, 8, 4]], np.int64),
        np.array([[0, 1, 3, 3, 4, 0, 1, 2]], np.int32),
    )
    assert [k.tolist() for k in parsed.keys] == [[5, 6, 7, 8], [9, 4]]
    assert [o.tolist() for o in parsed.row_offsets] == [[0, 1, 3, 3, 4], [0, 1, 2]]
    assert parsed.dense.tolist() == [[0.5], [1.5]]


def test_samples_parse_equals_the_reference_and_hugectr() -> None:
    rng = np.random.default_rng(33)
    for _ in range(100):
        slot_nums = [int(s) for s in rng.integers(1, 6, int(rng.integers(1, 5)))]
        layout = make_layout(slot_nums, int(rng.integers(1, 5)), 16)
        batch = int(rng.integers(1, 17))
        dense, keys = random_request(rng, layout, batch, max_hot=1, empty=0.0)
        request = encode_samples(dense, keys)
        parsed = SamplesContract(layout).parse(*request)
        assert all(o is None for o in parsed.row_offsets)  # one-hot: no offsets to build
        for t, slots in enumerate(slot_nums):  # one-slot tables are views of the request
            assert slots > 1 or np.shares_memory(parsed.keys[t], request[1])
        assert_same_batch(parsed, to_sparse_batch(dense, keys))
        assert_same_batch(parsed, HugeCTRContract(layout).parse(*encode_hugectr(dense, keys)))


def test_all_slots_empty_is_a_valid_request() -> None:
    layout = make_layout([2, 3])
    keys = [[[[], []], [[], [], []]] for _ in range(2)]
    dense = np.ones((2, 3), np.float32)
    parsed = HugeCTRContract(layout).parse(*encode_hugectr(dense, keys))
    assert [k.size for k in parsed.keys] == [0, 0]
    assert [o.tolist() for o in parsed.row_offsets] == [[0] * 5, [0] * 7]


def test_responses_keep_each_contracts_shape() -> None:
    scores = np.arange(6, dtype=np.float32).reshape(3, 2)
    layout = make_layout([1], label_dim=2)
    assert HugeCTRContract(layout).response(scores).tolist() == [[0, 1, 2, 3, 4, 5]]
    assert SamplesContract(layout).response(scores) is scores


# Layout of the bad-request cases: tables of 2 and 1 slots, 3 dense features, at most 4
# samples and 4 + 2 keys per sample (so 16 and 8 keys per request).
LAYOUT = make_layout([2, 1])
GOOD = encode_hugectr(
    np.arange(6, dtype=np.float32).reshape(2, 3),
    [[[[1], [2, 3]], [[4]]], [[[], [5]], [[6]]]],
)


def hugectr(des=None, cat=None, row=None):
    """The good request with some inputs replaced."""
    return tuple(g if a is None else a for g, a in zip(GOOD, (des, cat, row), strict=True))


def rows(*values) -> np.ndarray:
    return np.array([values], np.int32)


BAD_HUGECTR = [
    (hugectr(row=rows(0, 1, 3, 3, 4, 0, 1)), ["ROWINDEX", "3 x batch + 2", "got 7"]),
    (hugectr(row=rows(0, 1)), ["ROWINDEX", "at least one sample"]),
    (hugectr(row=np.zeros((1, 17), np.int32)), ["ROWINDEX", "5 samples", "4 allowed"]),
    (hugectr(des=np.zeros((1, 5), np.float32)), ["DES", "2 samples", "6 values", "got 5"]),
    (hugectr(des=np.zeros((1, 0), np.float32)), ["DES", "got 0"]),
    (hugectr(row=rows(0, 1, 3, 3, 4, 1, 1, 2)), ["ROWINDEX", "table 1", "start at 0, got 1"]),
    (hugectr(row=rows(0, 1, 3, 3, 4, 0, 2, 1)), ["ROWINDEX", "table 1", "entry 7 is 1 after 2"]),
    (hugectr(row=rows(0, 3, 1, 3, 4, 0, 1, 2)), ["ROWINDEX", "table 0", "entry 2 is 1 after 3"]),
    (
        hugectr(row=rows(0, 1, 3, 3, 3, 0, 1, 2)),
        ["CATCOLUMN", "holds 6 keys", "end at 5 in all (table 0: 3; table 1: 2)"],
    ),
    (
        hugectr(cat=np.zeros((1, 21), np.int64), row=rows(0, 9, 19, 19, 19, 0, 1, 2)),
        ["ROWINDEX", "table 0", "19 keys, more than the 16 allowed"],
    ),
    (hugectr(des=np.zeros((1, 6), np.float64)), ["DES", "expected float32, got float64"]),
    (hugectr(cat=np.zeros((1, 6), np.int32)), ["CATCOLUMN", "expected int64"]),
    (hugectr(row=rows(0, 1, 3, 3, 4, 0, 1, 2).astype(np.int64)), ["ROWINDEX", "int32"]),
    (hugectr(des=np.zeros((2, 3), np.float32)), ["DES", "expected shape [1, N]", "[2, 3]"]),
    (
        hugectr(des=np.array([[0, 1, 2, 3, np.nan, 5]], np.float32)),
        ["DES", "sample 1, dense feature 1 is nan", "must be finite"],
    ),
    (
        hugectr(des=np.array([[np.inf, 1, 2, 3, 4, 5]], np.float32)),
        ["DES", "sample 0, dense feature 0 is inf"],
    ),
]


@pytest.mark.parametrize(
    ("slots", "rule"),
    [
        # 26 tables of one slot: the expected length is said once, not 26 times.
        ([1] * 26, "26 x batch + 26 offsets (each of the 26 tables: 1 x batch + 1)"),
        # W&D's two tables after 24 of one slot: each run of equal slot counts is said once.
        (
            [1] * 24 + [26, 2],
            "52 x batch + 26 offsets (tables 0-23: 1 x batch + 1; table 24: 26 x batch + 1; "
            "table 25: 2 x batch + 1)",
        ),
    ],
)
def test_a_rowindex_of_the_wrong_length_states_the_rule_once_per_run_of_tables(
    slots: list[int], rule: str
) -> None:
    layout = make_layout(slots)
    with pytest.raises(RequestError) as info:
        HugeCTRContract(layout).parse(
            np.zeros((1, 3), np.float32),
            np.zeros((1, sum(slots)), np.int64),
            np.zeros((1, 9), np.int32),
        )
    assert str(info.value) == f"input 'ROWINDEX': expected {rule}, got 9"


@pytest.mark.parametrize("inputs,words", BAD_HUGECTR)
def test_bad_hugectr_request_names_the_input(inputs, words) -> None:
    HugeCTRContract(LAYOUT).parse(*GOOD)  # the unaltered request is valid
    with pytest.raises(RequestError) as info:
        HugeCTRContract(LAYOUT).parse(*inputs)
    message = str(info.value)
    assert message.startswith(f"input '{words[0]}'")
    assert all(w in message for w in words), message


DENSE = np.zeros((2, 3), np.float32)
SPARSE = np.zeros((2, 3), np.int64)
BAD_SAMPLES = [
    ((np.zeros((2, 4), np.float32), SPARSE), ["dense", "expected shape [batch, 3]", "[2, 4]"]),
    ((np.zeros(3, np.float32), SPARSE), ["dense", "[batch, 3]", "got [3]"]),
    ((DENSE, np.zeros((2, 2), np.int64)), ["sparse", "[batch, 3]", "[2, 2]"]),
    ((DENSE, np.zeros((3, 3), np.int64)), ["sparse", "3 samples", "'dense' has 2"]),
    ((np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64)), ["dense", "at least one"]),
    ((np.zeros((5, 3), np.float32), np.zeros((5, 3), np.int64)), ["dense", "5 samples"]),
    ((DENSE.astype(np.float16), SPARSE), ["dense", "expected float32, got float16"]),
    ((DENSE, SPARSE.astype(np.uint64)), ["sparse", "expected int64, got uint64"]),
    (
        (np.array([[0, 0, 0], [0, 0, -np.inf]], np.float32), SPARSE),
        ["dense", "sample 1, dense feature 2 is -inf"],
    ),
]


@pytest.mark.parametrize("inputs,words", BAD_SAMPLES)
def test_bad_samples_request_names_the_input(inputs, words) -> None:
    SamplesContract(LAYOUT).parse(DENSE, SPARSE)
    with pytest.raises(RequestError) as info:
        SamplesContract(LAYOUT).parse(*inputs)
    message = str(info.value)
    assert message.startswith(f"input '{words[0]}'")
    assert all(w in message for w in words), message


def test_one_hot_hugectr_requests_need_no_offsets() -> None:
    rng = np.random.default_rng(12)
    layout = make_layout([1, 3, 1], 2, 16)
    dense, keys = random_request(rng, layout, 5, max_hot=1, empty=0.0)
    request = encode_hugectr(dense, keys)
    parsed = HugeCTRContract(layout).parse(*request)
    assert parsed.row_offsets == (None, None, None)
    assert_same_batch(parsed, to_sparse_batch(dense, keys))
    assert np.shares_memory(parsed.keys[0], request[1])  # a one-slot table is a column view
    # One empty slot and the request is not one-hot any more: offsets are kept.
    keys[2][1][0] = []
    parsed = HugeCTRContract(layout).parse(*encode_hugectr(dense, keys))
    assert all(o is not None for o in parsed.row_offsets)
    assert_same_batch(parsed, to_sparse_batch(dense, keys))


def fixed_layout(slot_nums, hotness, dense_dim=2, max_batch_size=16) -> RankingLayout:
    """Tables whose samples carry ``hotness[t]`` keys in every slot (fixed-length inputs)."""
    tables = tuple(
        TableFeed(t, f"t{t}", f"emb{t}", s, 4, Combiner.SUM, s * h, h)
        for t, (s, h) in enumerate(zip(slot_nums, hotness, strict=True))
    )
    return RankingLayout("m", dense_dim, 1, max_batch_size, tables)


def fixed_request(rng, layout, batch):
    """Samples with each table's hotness of keys in every slot (repeats likely)."""
    keys = [
        [
            [[int(k) for k in rng.integers(0, 9, feed.hotness)] for _ in range(feed.slot_num)]
            for feed in layout.tables
        ]
        for _ in range(batch)
    ]
    return rng.standard_normal((batch, layout.dense_dim)).astype(np.float32), keys


@pytest.mark.parametrize(("slot_nums", "hotness"), [([1, 1, 1], [3, 1, 100]), ([2, 1], [4, 2])])
def test_fixed_hotness_requests_keep_their_key_matrix(slot_nums, hotness) -> None:
    """MLPerf DLRM-v2's inputs: every slot of a table holds the same number of keys. Both
    contracts hand the request's [B, K] key matrix over as it is (no offsets, no copy), and
    the batch means the same samples as the key-by-key reference."""
    layout = fixed_layout(slot_nums, hotness)
    assert layout.sample_width == sum(s * h for s, h in zip(slot_nums, hotness, strict=True))
    rng = np.random.default_rng(61)
    for batch in (1, 5, 16):
        dense, keys = fixed_request(rng, layout, batch)
        want = to_sparse_batch(dense, keys)
        samples_request = encode_samples(dense, keys)
        assert samples_request[1].shape == (batch, layout.sample_width)
        hugectr_request = encode_hugectr(dense, keys)
        for parsed, request in (
            (SamplesContract(layout).parse(*samples_request), samples_request[1]),
            (HugeCTRContract(layout).parse(*hugectr_request), hugectr_request[1]),
        ):
            assert parsed.row_offsets == (None,) * len(slot_nums)
            assert parsed.hotness == tuple(hotness)
            assert parsed.sample_keys.shape == (batch, layout.sample_width)
            assert np.shares_memory(parsed.sample_keys, request)
            assert_same_batch(parsed, want)


def test_fixed_hotness_model_takes_uneven_hugectr_requests_with_offsets() -> None:
    layout = fixed_layout([1, 2], [3, 2])
    rng = np.random.default_rng(62)
    dense, keys = fixed_request(rng, layout, 4)
    keys[1][0][0].pop()  # one slot one key short: the offsets say where each slot starts
    parsed = HugeCTRContract(layout).parse(*encode_hugectr(dense, keys))
    assert parsed.sample_keys is None and all(o is not None for o in parsed.row_offsets)
    assert_same_batch(parsed, to_sparse_batch(dense, keys))


def test_samples_request_of_a_fixed_hotness_model_must_carry_every_key() -> None:
    layout = fixed_layout([1, 1], [3, 2])
    with pytest.raises(RequestError, match=r"input 'sparse': expected shape \[batch, 5\]"):
        SamplesContract(layout).parse(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.int64))


def test_offsets_ending_elsewhere_than_the_keys_are_said_once_per_run_of_tables() -> None:
    """26 tables whose offsets end at 1 but one: 'tables 1-25: 1 each', not 26 terms."""
    layout = make_layout([1] * 26, dense_dim=1)
    rows_ = np.concatenate([[0, 2]] + [[0, 1]] * 25).astype(np.int32)[None]
    with pytest.raises(RequestError) as info:
        HugeCTRContract(layout).parse(
            np.zeros((1, 1), np.float32), np.zeros((1, 26), np.int64), rows_
        )
    assert str(info.value) == (
        "input 'CATCOLUMN': holds 26 keys, but the offsets in 'ROWINDEX' end at 27 in all "
        "(table 0: 2; tables 1-25: 1 each)"
    )
