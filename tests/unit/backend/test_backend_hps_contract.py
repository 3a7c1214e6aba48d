"""HugeCTR hps contract: request validation, batching across requests, output splitting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hps_core.config import parse_ps_config
from hps_core.errors import RequestError
from triton_backend.hps_contract import (
    KEYS,
    NUMKEYS,
    HpsContract,
    batch_tables,
    split_outputs,
)

INT64_MIN = int(np.iinfo(np.int64).min)
INT64_MAX = int(np.iinfo(np.int64).max)


def random_contract(rng: np.random.Generator) -> HpsContract:
    tables = int(rng.integers(1, 5))
    return HpsContract(
        dims=tuple(int(d) for d in rng.integers(1, 20, tables)),
        max_keys=tuple(int(m) for m in rng.integers(1, 40, tables)),
    )


def random_counts(rng: np.random.Generator, contract: HpsContract) -> list[int]:
    """Keys per table within the limits, at least one key in total."""
    while True:
        counts = [int(rng.integers(0, m + 1)) for m in contract.max_keys]
        if sum(counts):
            return counts


def request(rng: np.random.Generator, counts: list[int], batched: bool = True):
    keys = rng.integers(INT64_MIN, INT64_MAX, sum(counts), np.int64, endpoint=True)
    numkeys = np.array(counts, dtype=np.int32)
    if batched:
        return keys[None, :], numkeys[None, :]
    return keys, numkeys


def split_reference(keys: np.ndarray, counts: list[int]) -> list[list[int]]:
    flat, out, start = keys.ravel().tolist(), [], 0
    for n in counts:
        out.append(flat[start : start + n])
        start += n
    return out


@pytest.mark.parametrize("batched", [True, False], ids=["[1,N]", "[N]"])
def test_parse_splits_keys_per_table(batched: bool) -> None:
    rng = np.random.default_rng(21 + batched)
    for _ in range(200):
        contract = random_contract(rng)
        counts = random_counts(rng, contract)
        keys, numkeys = request(rng, counts, batched)
        parsed = contract.parse(keys, numkeys)
        assert [p.tolist() for p in parsed] == split_reference(keys, counts)
        assert all(p.dtype == np.int64 for p in parsed)


def test_an_unbatched_request_is_read_flat_whatever_its_shape() -> None:
    """max_batch_size 0 (HugeCTR's ensemble sample sends KEYS [1024, 3], NUMKEYS [[3072]]):
    KEYS of any shape in row-major order, NUMKEYS flat; the checks stay."""
    rng = np.random.default_rng(9)
    contract = HpsContract(dims=(4, 2), max_keys=(3072, 100))
    keys = rng.integers(-(2**40), 2**40, (1024, 3))
    (first, second) = contract.parse(keys, np.array([[3000, 72]], np.int32), batched=False)
    assert first.tolist() == keys.reshape(-1)[:3000].tolist()
    assert second.tolist() == keys.reshape(-1)[3000:].tolist()
    with pytest.raises(RequestError, match="counts sum to 3000 but 'KEYS' holds 3,072 keys"):
        contract.parse(keys, np.array([[3000, 0]], np.int32), batched=False)
    with pytest.raises(RequestError, match="expected shape \\[1, N\\]"):
        contract.parse(keys, np.array([[3000, 72]], np.int32))  # batched: one row only


def test_limits_are_inclusive_and_tables_may_be_empty() -> None:
    contract = HpsContract(dims=(2, 3), max_keys=(3, 5))
    keys, numkeys = request(np.random.default_rng(1), [3, 0])
    assert [len(p) for p in contract.parse(keys, numkeys)] == [3, 0]
    keys, numkeys = request(np.random.default_rng(2), [0, 5])
    assert [len(p) for p in contract.parse(keys, numkeys)] == [0, 5]


def two_tables() -> HpsContract:
    return HpsContract(dims=(2, 3), max_keys=(4, 4))


KEYS3 = np.array([[5, 9, 7]], dtype=np.int64)
COUNTS = np.array([[2, 1]], dtype=np.int32)


@pytest.mark.parametrize(
    ("keys", "numkeys", "name", "says"),
    [
        (KEYS3.astype(np.int32), COUNTS, KEYS, "expected INT64, got int32"),
        (KEYS3.astype(np.float32), COUNTS, KEYS, "expected INT64, got float32"),
        (KEYS3, COUNTS.astype(np.int64), NUMKEYS, "expected INT32, got int64"),
        (np.repeat(KEYS3, 2, axis=0), COUNTS, KEYS, "got [2, 3]"),
        (KEYS3, np.repeat(COUNTS, 2, axis=0), NUMKEYS, "got [2, 2]"),
        (KEYS3[None], COUNTS, KEYS, "got [1, 1, 3]"),
        (np.int64(5), COUNTS, KEYS, "got []"),
        (KEYS3[:, :2], COUNTS, NUMKEYS, "counts sum to 3 but 'KEYS' holds 2 keys"),
        (KEYS3, np.array([[4, -1]], np.int32), NUMKEYS, "count of table 1 is negative (-1)"),
        (KEYS3, np.array([[3]], np.int32), NUMKEYS, "expected 2 counts (one per table), got 1"),
        (KEYS3, np.array([[1, 1, 1]], np.int32), NUMKEYS, "expected 2 counts"),
        (np.arange(5, dtype=np.int64)[None], np.array([[5, 0]], np.int32), NUMKEYS,
         "table 0 has 5 keys, more than the 4 allowed"),
        (np.arange(7, dtype=np.int64)[None], np.array([[2, 5]], np.int32), NUMKEYS,
         "table 1 has 5 keys, more than the 4 allowed"),
        (np.empty((1, 0), np.int64), np.array([[0, 0]], np.int32), KEYS, "empty"),
    ],
    ids=[
        "keys-int32", "keys-float", "numkeys-int64", "keys-2-rows", "numkeys-2-rows",
        "keys-3d", "keys-scalar", "count-mismatch", "negative", "too-few-counts",
        "too-many-counts", "over-limit-0", "over-limit-1", "empty",
    ],
)  # fmt: skip
def test_invalid_requests_name_the_input(keys, numkeys, name: str, says: str) -> None:
    with pytest.raises(RequestError) as info:
        two_tables().parse(np.asarray(keys), numkeys)
    message = str(info.value)
    assert message.startswith(f"input '{name}': ")
    assert says in message


def test_contract_from_ps_json_model(tmp_path: Path) -> None:
    config = parse_ps_config(
        {
            "supportlonglong": True,
            "models": [
                {
                    "model": "m",
                    "sparse_files": ["a", "b"],
                    "deployed_device_list": [0],
                    "default_value_for_each_table": [0.0, 0.0],
                    "maxnum_catfeature_query_per_table_per_sample": [2, 26],
                    "embedding_vecsize_per_table": [1, 16],
                    "max_batch_size": 8,
                }
            ],
        },
        tmp_path,
    )
    contract = HpsContract.from_model(config.models[0])
    assert contract == HpsContract(dims=(1, 16), max_keys=(16, 208))
    assert contract.num_tables == 2


def embed(table: int, keys: np.ndarray, dim: int) -> np.ndarray:
    """A per-key stand-in for a table: each key's vector depends on that key only."""
    base = (keys % 1000).astype(np.float32)[:, None]
    return base + np.arange(dim, dtype=np.float32) * 0.5 + 100 * table


def test_batch_and_split_equal_per_request_answers() -> None:
    rng = np.random.default_rng(31)
    for _ in range(100):
        contract = random_contract(rng)
        parsed = []
        for _ in range(int(rng.integers(1, 7))):
            counts = random_counts(rng, contract)
            parsed.append(contract.parse(*request(rng, counts)))
        batched = batch_tables(parsed)
        assert [len(b) for b in batched] == [sum(len(p[t]) for p in parsed)
                                             for t in range(contract.num_tables)]  # fmt: skip
        values = [
            embed(t, keys, d)
            for t, (keys, d) in enumerate(zip(batched, contract.dims, strict=True))
        ]
        outputs = split_outputs(values, parsed)
        assert len(outputs) == len(parsed)
        for tables, out in zip(parsed, outputs, strict=True):
            expected = np.concatenate(
                [
                    embed(t, k, d).ravel()
                    for t, (k, d) in enumerate(zip(tables, contract.dims, strict=True))
                ]
            )
            assert out.dtype == np.float32 and out.flags.c_contiguous
            assert out.shape == (1, contract.output_length([len(k) for k in tables]))
            np.testing.assert_array_equal(out[0], expected)


def test_output_length() -> None:
    contract = HpsContract(dims=(2, 3, 16), max_keys=(9, 9, 9))
    assert contract.output_length([2, 1, 0]) == 7
    assert contract.output_length([0, 0, 4]) == 64
    assert contract.output_length([1, 1, 1]) == 21
    with pytest.raises(ValueError):
        contract.output_length([1, 1])
