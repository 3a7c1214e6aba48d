"""Pure helpers of client_examples/hps_client_common.py."""

from __future__ import annotations

import doctest

import numpy as np
import pytest


def random_tables(rng: np.random.Generator, num_tables: int):
    counts = rng.integers(0, 7, size=num_tables).tolist()
    dims = rng.integers(1, 40, size=num_tables).tolist()
    keys = [rng.integers(-(2**62), 2**62, size=n, dtype=np.int64) for n in counts]
    vectors = [
        rng.standard_normal((n, d)).astype(np.float32) for n, d in zip(counts, dims, strict=True)
    ]
    return counts, dims, keys, vectors


@pytest.mark.parametrize("num_tables", [1, 2, 3, 8])
@pytest.mark.parametrize("seed", range(5))
def test_request_arrays_follow_the_hps_contract(common, num_tables, seed):
    counts, _, keys, _ = random_tables(np.random.default_rng(seed), num_tables)
    keys_array, numkeys = common.build_request_arrays(keys)
    assert keys_array.dtype == np.int64 and keys_array.shape == (1, sum(counts))
    assert numkeys.dtype == np.int32 and numkeys.shape == (1, num_tables)
    assert numkeys[0].tolist() == counts
    flat = [int(k) for table in keys for k in table]
    assert keys_array[0].tolist() == flat


def test_request_arrays_accept_lists_and_empty_tables(common):
    keys, numkeys = common.build_request_arrays([[5, 6], [], np.array([7], dtype=np.uint32)])
    assert keys.tolist() == [[5, 6, 7]] and numkeys.tolist() == [[2, 0, 1]]


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ([], "at least one table"),
        ([[1, 2], [0.5]], "KEYS of table 1: keys must be integers"),
        ([[[1, 2]]], r"KEYS of table 0: expected a 1-D list of keys, got shape \(1, 2\)"),
        ([np.array([2**63], dtype=np.uint64)], "does not fit in int64"),
    ],
)
def test_request_arrays_reject_bad_keys(common, tables, message):
    with pytest.raises(common.ClientInputError, match=message):
        common.build_request_arrays(tables)


@pytest.mark.parametrize("num_tables", [1, 2, 5])
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("batch_dim", [False, True])
def test_split_output_recovers_each_tables_vectors(common, num_tables, seed, batch_dim):
    counts, dims, _, vectors = random_tables(np.random.default_rng(100 + seed), num_tables)
    flat = np.concatenate([v.reshape(-1) for v in vectors])
    output = flat.reshape(1, -1) if batch_dim else flat
    tables = common.split_output(output, np.array(counts, dtype=np.int32), dims)
    assert len(tables) == num_tables
    for got, want in zip(tables, vectors, strict=True):
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("output", "counts", "dims", "message"),
    [
        (np.zeros(47), [1, 1], [16, 32], r"OUTPUT0 has 47 values .* need 1\*16 \+ 1\*32 = 48"),
        (np.zeros(48), [1, 1, 1], [16, 32], "NUMKEYS has 3 entries but the model has 2 tables"),
        (np.zeros((2, 24)), [1, 1], [16, 32], r"OUTPUT0 has shape \[2, 24\]"),
        (np.zeros((1, 1, 48)), [1, 1], [16, 32], r"OUTPUT0 has shape \[1, 1, 48\]"),
        (np.zeros(16), [-1, 1], [16, 32], "negative count"),
        (np.zeros(0), [0], [0], "dims must be >= 1"),
    ],
)
def test_split_output_errors_say_what_was_expected(common, output, counts, dims, message):
    with pytest.raises(common.ClientInputError, match=message):
        common.split_output(output, counts, dims)


HTTP_CONFIG = {
    "name": "hps_embedding",
    "max_batch_size": 1024,
    "parameters": {
        "embedding_vecsize_per_table": {"string_value": "16, 32"},
        "table_names": {"string_value": "t0,t1"},
    },
}


def test_config_dims_and_names_http_and_grpc_forms(common):
    for config in (HTTP_CONFIG, {"config": HTTP_CONFIG}):
        assert common.table_dims_from_model_config(config) == [16, 32]
        assert common.table_names_from_model_config(config) == ["t0", "t1"]


def test_config_without_parameters_gives_none(common):
    for config in ({"name": "m"}, {"config": {"name": "m", "parameters": {}}}):
        assert common.table_dims_from_model_config(config) is None
        assert common.table_names_from_model_config(config) is None


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"string_value": "16,x"}, "embedding_vecsize_per_table: 'x' is not an integer"),
        ({"string_value": "16,0"}, "embedding_vecsize_per_table: dims must be >= 1"),
        ({"string_value": ""}, "embedding_vecsize_per_table: expected comma-separated"),
        ({"int_value": 3}, "embedding_vecsize_per_table has no string_value"),
    ],
)
def test_bad_config_dims_name_the_parameter(common, entry, message):
    config = {"parameters": {"embedding_vecsize_per_table": entry}}
    with pytest.raises(common.ClientInputError, match=message):
        common.table_dims_from_model_config(config)


@pytest.mark.parametrize(
    ("text", "expected"), [("0,1,2", [0, 1, 2]), (" -5 , 7", [-5, 7]), ("42", [42])]
)
def test_parse_int_list(common, text, expected):
    assert common.parse_int_list(text, "--keys") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [("1,,2", "--keys: expected comma-separated"), ("", "expected"), ("1,2.5", "'2.5'")],
)
def test_parse_int_list_errors(common, text, message):
    with pytest.raises(common.ClientInputError, match=message):
        common.parse_int_list(text, "--keys")


def test_format_lookup_shows_leading_values_per_key(common):
    vectors = [np.arange(6, dtype=np.float32).reshape(2, 3) / 4, np.full((1, 2), -1.5, np.float32)]
    lines = common.format_lookup([np.array([10, 11]), np.array([7])], vectors, ["a", "b"], 2)
    assert lines == [
        "table 0 'a' (dim 3, 2 keys):",
        "  key 10: [+0.00000, +0.25000, ...]",
        "  key 11: [+0.75000, +1.00000, ...]",
        "table 1 'b' (dim 2, 1 keys):",
        "  key 7: [-1.50000, -1.50000]",
    ]


def test_docstring_examples(common, perf_input):
    for module in (common, perf_input):
        result = doctest.testmod(module)
        assert result.attempted >= 1
        assert result.failed == 0
