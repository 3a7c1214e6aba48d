"""HashLayout, sort_order, build_index, fill_directory and find_rows against a Python dict of the
file rows, and build_index against sort_order."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers_testdata import (
    EXTREME_KEYS,
    INT64_MAX,
    INT64_MIN,
    expected_rows,
    make_keys,
    mixed_queries,
    random_vectors,
    row_reference,
    splitmix64_finalizer,
)

import hps_core.tiers.hash_layout as hash_layout_module
from hps_core.hashing import unmix64
from hps_core.tiers.hash_layout import (
    ALIGN,
    SEARCH_KEYS,
    DuplicateKeysError,
    HashLayout,
    build_index,
    entry_rows,
    fill_directory,
    find_rows,
    sort_order,
)

ROWS = [0, 1, 2, 3, 7, 8, 1000, 100_003]


def build_table(
    keys: np.ndarray, vectors: np.ndarray, fill: int = 0
) -> tuple[HashLayout, bytearray, np.ndarray]:
    """Lay a table out in a bytearray the way the host tier does; return the stored order."""
    layout = HashLayout(len(keys), vectors.shape[1])
    buffer = bytearray(bytes([fill]) * layout.nbytes)
    hashes, starts, _, values = layout.views(buffer)
    order, sorted_hashes = sort_order(keys)
    hashes[: len(keys)] = sorted_hashes
    fill_directory(layout, sorted_hashes, starts)
    values[:] = vectors[order]
    return layout, buffer, order


def lookup_file_rows(layout: HashLayout, buffer: bytearray, order: np.ndarray, queries):
    """find_rows, translated from stored slots back to file rows (-1 stays -1)."""
    hashes, starts, _, _ = layout.views(buffer)
    slots = find_rows(layout, hashes, starts, queries)
    assert slots.dtype == np.int64 and slots.shape == queries.shape
    file_rows = np.full(slots.shape, -1, dtype=np.int64)
    file_rows[slots >= 0] = order[slots[slots >= 0]]
    return file_rows, slots


@pytest.mark.parametrize("kind", ["wide", "dense"])
@pytest.mark.parametrize("rows", ROWS)
def test_find_rows_matches_dict(rows: int, kind: str, rng: np.random.Generator) -> None:
    dim = 3
    keys = make_keys(rng, rows, kind)
    vectors = random_vectors(rng, rows, dim)
    layout, buffer, order = build_table(keys, vectors)
    queries = mixed_queries(rng, keys, max(64, min(rows, 20_000)))
    reference = row_reference(keys)
    expected = expected_rows(reference, queries)

    file_rows, slots = lookup_file_rows(layout, buffer, order, queries)
    np.testing.assert_array_equal(file_rows, expected)
    # The vector stored at the slot is the file's vector of that key.
    values = layout.views(buffer).values
    hit = expected >= 0
    np.testing.assert_array_equal(values[slots[hit]], vectors[expected[hit]])
    # Every stored key is found at a distinct slot.
    all_rows, all_slots = lookup_file_rows(layout, buffer, order, keys)
    np.testing.assert_array_equal(all_rows, np.arange(rows))
    assert len(np.unique(all_slots)) == rows


@pytest.mark.parametrize("rows", ROWS)
def test_binary_search_and_probe_rounds_find_the_same_rows(
    rows: int, rng: np.random.Generator
) -> None:
    """Up to SEARCH_KEYS keys take binary searches, more take the bucket probe rounds."""
    keys = make_keys(rng, rows, "wide")
    layout, buffer, order = build_table(keys, np.zeros((rows, 1), np.float32), fill=0xFF)
    queries = mixed_queries(rng, keys, 3 * SEARCH_KEYS + 5)
    expected = expected_rows(row_reference(keys), queries)
    whole, _ = lookup_file_rows(layout, buffer, order, queries)
    np.testing.assert_array_equal(whole, expected)
    cuts = [0, 1, 8, 8 + SEARCH_KEYS]
    for at, stop in itertools.pairwise(cuts):
        piece, _ = lookup_file_rows(layout, buffer, order, queries[at:stop])
        np.testing.assert_array_equal(piece, expected[at:stop])


@pytest.mark.parametrize("rows", ROWS)
def test_sort_order_and_directory_invariants(rows: int, rng: np.random.Generator) -> None:
    keys = make_keys(rng, rows, "wide")
    layout = HashLayout(rows, 1)
    order, sorted_hashes = sort_order(keys)
    assert sorted(order.tolist()) == list(range(rows))
    sample = order[:500]
    assert sorted_hashes[:500].tolist() == [splitmix64_finalizer(k) for k in keys[sample].tolist()]
    assert np.all(sorted_hashes[1:] > sorted_hashes[:-1])

    starts = np.full(layout.num_buckets + 1, -7, dtype=layout.starts_dtype)
    fill_directory(layout, sorted_hashes, starts)
    assert starts[0] == 0 and starts[-1] == rows
    assert np.all(np.diff(starts) >= 0)
    # Bucket b holds exactly the hashes whose top bucket_bits bits are b (Python ints).
    shift = 64 - layout.bucket_bits
    counts = Counter(h >> shift for h in sorted_hashes.tolist())
    assert np.diff(starts).tolist() == [counts.get(b, 0) for b in range(layout.num_buckets)]


@pytest.mark.parametrize("rows", [2, 4096, 50_000])
def test_sort_order_of_hashes_sharing_their_high_bits(rows: int, rng: np.random.Generator) -> None:
    """sort_order sorts each hash's high bits with its row number, then the rows whose high
    bits agree: keys chosen (through unmix64) so that most hashes share them still come out
    in exact hash order."""
    index_bits = (rows - 1).bit_length()
    high = rng.integers(0, 4, rows * 2, dtype=np.uint64) << np.uint64(50)
    low = rng.integers(0, 1 << index_bits, rows * 2, dtype=np.uint64)
    hashes = rng.permutation(np.unique(high | low))[:rows]
    order, sorted_hashes = sort_order(unmix64(hashes))
    np.testing.assert_array_equal(order, np.argsort(hashes, kind="stable"))
    np.testing.assert_array_equal(sorted_hashes, np.sort(hashes))


def test_bucket_count_stays_between_two_and_four_rows_per_bucket() -> None:
    for rows in [*range(4, 300), 1000, 4095, 4096, 100_003, 10**9]:
        per_bucket = rows / HashLayout(rows, 1).num_buckets
        assert 2 <= per_bucket < 4, rows
    # Tiny tables still get the minimum of two buckets.
    assert [HashLayout(r, 1).num_buckets for r in range(4)] == [2, 2, 2, 2]


def test_one_overfull_bucket_and_hashes_at_both_ends(rng: np.random.Generator) -> None:
    """Keys chosen through unmix64 so that 1000 rows share the last bucket."""
    rows = 1000
    layout = HashLayout(rows, 2)
    top = np.uint64(layout.num_buckets - 1) << np.uint64(64 - layout.bucket_bits)
    low = rng.integers(1, 2**40, size=3 * rows, dtype=np.uint64)
    wanted = np.unique(top | low)[: 2 * rows]
    wanted = rng.permutation(wanted)
    stored, absent = wanted[:rows].copy(), wanted[rows:]
    stored[:2] = [0, 1]  # hash 0 is the first row of bucket 0
    keys = unmix64(stored)
    vectors = random_vectors(rng, rows, 2)
    # 0xFF padding: the entry after the last row equals the largest hash, which is absent.
    layout, buffer, order = build_table(keys, vectors, fill=0xFF)
    queries = np.concatenate([keys, unmix64(absent), unmix64(np.array([2**64 - 1], np.uint64))])
    file_rows, _ = lookup_file_rows(layout, buffer, order, queries)
    expected = expected_rows(row_reference(keys), queries)
    np.testing.assert_array_equal(file_rows, expected)
    assert (expected[:rows] >= 0).all() and (expected[rows:] == -1).all()


def test_empty_query_and_empty_table() -> None:
    keys = np.array([5, -5], dtype=np.int64)
    layout, buffer, order = build_table(keys, np.zeros((2, 1), np.float32))
    file_rows, _ = lookup_file_rows(layout, buffer, order, np.empty(0, np.int64))
    assert file_rows.shape == (0,)
    empty, buffer0, order0 = build_table(np.empty(0, np.int64), np.zeros((0, 4), np.float32))
    file_rows, _ = lookup_file_rows(empty, buffer0, order0, np.array(EXTREME_KEYS, np.int64))
    assert file_rows.tolist() == [-1] * len(EXTREME_KEYS)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(INT64_MIN, INT64_MAX), unique=True, max_size=40),
    st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=40),
)
def test_find_rows_any_keys(keys: list[int], extra: list[int]) -> None:
    table_keys = np.array(keys, dtype=np.int64)
    layout, buffer, order = build_table(table_keys, np.zeros((len(keys), 1), np.float32))
    queries = np.array(keys[::2] + extra + keys[::3], dtype=np.int64)
    file_rows, _ = lookup_file_rows(layout, buffer, order, queries)
    np.testing.assert_array_equal(file_rows, expected_rows(row_reference(table_keys), queries))


def test_duplicate_keys_error_lists_every_duplicate(rng: np.random.Generator) -> None:
    unique = make_keys(rng, 500, "wide")
    repeated = rng.choice(unique, size=9, replace=False)
    keys = rng.permutation(np.concatenate([unique, repeated, repeated[:3]]))  # some 3 times
    with pytest.raises(DuplicateKeysError) as info:
        sort_order(keys)
    expected = sorted(k for k, n in Counter(keys.tolist()).items() if n > 1)
    assert info.value.duplicates.tolist() == expected
    message = str(info.value)
    assert message.startswith("9 duplicate keys: ")
    assert all(str(k) in message for k in expected[:5])
    assert message.endswith(" and 4 more")
    assert isinstance(info.value, ValueError)


def test_duplicate_keys_error_short_list_has_no_tail() -> None:
    with pytest.raises(DuplicateKeysError, match=r"^1 duplicate keys: -9223372036854775808$"):
        sort_order(np.array([INT64_MIN, 3, INT64_MIN], dtype=np.int64))


def test_views_are_disjoint_and_inside_the_buffer(rng: np.random.Generator) -> None:
    layout = HashLayout(1000, 16)
    buffer = bytearray(layout.nbytes)
    hashes, starts, positions, values = layout.views(buffer)
    assert positions is None
    assert hashes.shape == (1001,) and starts.shape == (layout.num_buckets + 1,)
    assert values.shape == (1000, 16) and values.dtype == np.float32
    for offset in (layout.hashes_offset, layout.starts_offset, layout.values_offset):
        assert offset % ALIGN == 0
    hashes[:] = np.uint64(2**64 - 1)
    starts[:] = -1
    values[:] = rng.standard_normal((1000, 16), dtype=np.float32)
    copy_values = values.copy()
    assert (hashes == np.uint64(2**64 - 1)).all() and (starts == -1).all()
    np.testing.assert_array_equal(values, copy_values)
    assert layout.values_offset + values.nbytes <= layout.nbytes == len(buffer)


def file_bytes(rows: int, dim: int) -> int:
    return rows * (8 + 4 * dim)


@pytest.mark.parametrize("dim", [1, 2, 16, 128])
def test_nbytes_close_to_file_size_from_1000_rows(dim: int) -> None:
    sizes = [1000, 1001, 1023, 1024, 4095, 4096, 65_537, 100_003, 10**6, 2**31 - 2]
    for rows in sizes:
        nbytes = HashLayout(rows, dim).nbytes
        assert file_bytes(rows, dim) <= nbytes <= 1.3 * file_bytes(rows, dim), rows


@pytest.mark.parametrize("dim", [1, 2, 16, 128])
def test_nbytes_of_tables_over_two_billion_rows(dim: int) -> None:
    """From 2**31 - 1 rows the directory is int64 (4 bytes/row instead of 2), so a dim-1
    table (12 bytes/row on disk) takes up to 16/12 = 1.33x; dims >= 2 stay within 1.3x."""
    for rows in (2**31 - 1, 2**31 + 5, 3 * 2**31, 2**33 - 1):
        ratio = HashLayout(rows, dim).nbytes / file_bytes(rows, dim)
        assert ratio <= (16 / 12 + 1e-6 if dim == 1 else 1.3), (rows, ratio)


@pytest.mark.parametrize("dim", [1, 2, 16, 128])
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 7, 8, 31, 999])
def test_nbytes_of_small_tables_is_file_size_plus_bounded_overhead(rows: int, dim: int) -> None:
    """Small tables pay a fixed cost (three aligned arrays, a padding hash, >= 2 buckets), so
    the 1.3x bound does not hold; the overhead is at most 2 bytes/row (4 rows minimum) for
    the directory plus the padding hash, one directory entry and alignment of three arrays."""
    nbytes = HashLayout(rows, dim).nbytes
    overhead = nbytes - file_bytes(rows, dim)
    assert 0 < overhead <= 2 * max(rows, 4) + 8 + 4 + 3 * (ALIGN - 1)


def test_starts_switch_to_int64_for_huge_tables() -> None:
    assert HashLayout(2**31 - 2, 1).starts_dtype == np.int32
    assert HashLayout(2**31 - 1, 1).starts_dtype == np.int64
    big = HashLayout(2**31 + 5, 1)
    assert big.values_offset - big.starts_offset >= 8 * (big.num_buckets + 1)


def test_find_rows_of_2d_keys_equals_find_rows_of_flat_keys(rng: np.random.Generator) -> None:
    keys = make_keys(rng, 1000, "dense")
    layout, buffer, _ = build_table(keys, np.zeros((1000, 1), np.float32))
    queries = np.arange(-20, 1020, dtype=np.int64)
    hashes, starts, _, _ = layout.views(buffer)
    flat = find_rows(layout, hashes, starts, queries)
    square = find_rows(layout, hashes, starts, queries.reshape(40, 26))
    np.testing.assert_array_equal(square.ravel(), flat)


def test_find_rows_accepts_other_integer_dtypes() -> None:
    keys = np.arange(10, dtype=np.int64)
    layout, buffer, order = build_table(keys, np.zeros((10, 1), np.float32))
    for dtype in (np.int32, np.uint16):
        queries = np.array([9, 0, 3, 12], dtype=dtype)
        file_rows, _ = lookup_file_rows(layout, buffer, order, queries)
        assert file_rows.tolist() == [9, 0, 3, -1]


# --- the host tier's layout: rows in file order, an index of positions ----------------------


@pytest.mark.parametrize("chunk", [3, 1 << 20])
@pytest.mark.parametrize("rows", ROWS)
def test_build_index_orders_as_sort_order_and_points_at_the_file_rows(
    rows: int, chunk: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build_index sorts in place, a chunk at a time (3 rows: runs of equal high bits across
    chunks): its hashes and directory equal sort_order's, each entry's position is the file
    row, and find_rows + entry_rows give every key's file row, -1 for the others."""
    monkeypatch.setattr(hash_layout_module, "_CHUNK", chunk)
    keys = make_keys(rng, rows, "wide")
    layout = HashLayout(rows, 3, positions=True)
    buffer = bytearray(b"\xff" * layout.nbytes)
    views = layout.views(buffer)
    assert views.positions is not None and views.positions.dtype == np.int32
    build_index(layout, views, keys)
    order, sorted_hashes = sort_order(keys)
    np.testing.assert_array_equal(views.hashes[:rows], sorted_hashes)
    np.testing.assert_array_equal(views.positions, order)
    starts = np.empty_like(views.starts)
    fill_directory(layout, sorted_hashes, starts)
    np.testing.assert_array_equal(views.starts, starts)
    queries = mixed_queries(rng, keys, max(64, min(rows, 5000)))
    rows_found = entry_rows(views.positions, find_rows(layout, views.hashes, views.starts, queries))
    np.testing.assert_array_equal(rows_found, expected_rows(row_reference(keys), queries))


@pytest.mark.parametrize("rows", [2, 4096, 50_000])
def test_build_index_of_hashes_sharing_their_high_bits(
    rows: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hash_layout_module, "_CHUNK", 1000)
    index_bits = (rows - 1).bit_length()
    high = rng.integers(0, 4, rows * 2, dtype=np.uint64) << np.uint64(50)
    low = rng.integers(0, 1 << index_bits, rows * 2, dtype=np.uint64)
    hashes = rng.permutation(np.unique(high | low))[:rows]
    layout = HashLayout(rows, 1, positions=True, values=False)
    views = layout.views(bytearray(layout.nbytes))
    assert views.values is None and layout.nbytes == layout.values_offset
    build_index(layout, views, unmix64(hashes))
    np.testing.assert_array_equal(views.positions, np.argsort(hashes, kind="stable"))
    np.testing.assert_array_equal(views.hashes[:rows], np.sort(hashes))


def test_build_index_names_every_duplicate(rng: np.random.Generator) -> None:
    unique = make_keys(rng, 300, "wide")
    keys = rng.permutation(np.concatenate([unique, unique[:4], unique[:1]]))
    layout = HashLayout(len(keys), 1, positions=True)
    with pytest.raises(DuplicateKeysError) as info:
        build_index(layout, layout.views(bytearray(layout.nbytes)), keys)
    assert info.value.duplicates.tolist() == sorted(unique[:4].tolist())


def test_positions_sit_between_the_directory_and_the_rows() -> None:
    plain, placed = HashLayout(1000, 16), HashLayout(1000, 16, positions=True)
    assert placed.positions_offset == plain.values_offset
    assert placed.values_offset == placed.positions_offset + 4032  # int32 rows, aligned
    assert placed.nbytes == plain.nbytes + 4032
    assert placed.index_nbytes == plain.index_nbytes + 4000
    huge = HashLayout(2**31 + 5, 1, positions=True)
    assert huge.values_offset - huge.positions_offset == 8 * (2**31 + 5) + 24  # int64, aligned
