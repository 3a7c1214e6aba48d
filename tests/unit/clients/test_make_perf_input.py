"""perf_analyzer input-data generator (client_examples/make_perf_input.py)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from hps_core.workload import permute_ranks, zipf_top_k_mass


def table_segments(entry: dict, keys_per_table: list[int]) -> list[np.ndarray]:
    keys = np.array(entry["KEYS"]["content"])
    bounds = np.cumsum([0, *keys_per_table])
    return [keys[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(
    ("rows", "per_table", "alpha"),
    [([100_000, 20_000], [26, 26], 1.05), ([7], [3], 0.5), ([50, 10**9, 3], [1, 9, 4], 0.0)],
)
@pytest.mark.parametrize("batch_dim", [False, True])
def test_document_schema_and_shapes(perf_input, rows, per_table, alpha, batch_dim):
    doc = perf_input.make_perf_input(
        rows, per_table, alpha, 12, seed=1, include_batch_dim=batch_dim
    )
    assert list(doc) == ["data"] and len(doc["data"]) == 12
    lead = [1] if batch_dim else []
    for entry in doc["data"]:
        assert set(entry) == {"KEYS", "NUMKEYS"}
        for tensor in entry.values():
            assert set(tensor) == {"content", "shape"}
            assert int(np.prod(tensor["shape"])) == len(tensor["content"])
            assert all(type(v) is int for v in tensor["content"])
        assert entry["KEYS"]["shape"] == [*lead, sum(per_table)]
        assert entry["NUMKEYS"]["shape"] == [*lead, len(per_table)]
        assert entry["NUMKEYS"]["content"] == per_table
        for segment, num_rows in zip(table_segments(entry, per_table), rows, strict=True):
            assert segment.min() >= 0 and segment.max() < num_rows


def test_same_seed_same_document_other_seed_differs(perf_input):
    args = ([1000, 500], [8, 4], 1.1, 10)
    a = perf_input.make_perf_input(*args, seed=3)
    assert a == perf_input.make_perf_input(*args, seed=3)
    assert a != perf_input.make_perf_input(*args, seed=4)


def test_zipf_skew_is_visible(perf_input):
    rows, per_table, samples = [10_000, 3_000], [50, 20], 400
    for alpha in (0.0, 0.8, 1.2):
        doc = perf_input.make_perf_input(rows, per_table, alpha, samples, seed=0)
        segments = [table_segments(entry, per_table) for entry in doc["data"]]
        for table, num_rows in enumerate(rows):
            keys = np.concatenate([s[table] for s in segments])
            # Table t's hottest ranks map to keys through permutation seed t (documented).
            hot_keys = permute_ranks(np.arange(100), num_rows, seed=table)
            share = np.isin(keys, hot_keys).mean()
            expected = 100 / num_rows if alpha == 0 else zipf_top_k_mass(num_rows, alpha, 100)
            sigma = np.sqrt(expected * (1 - expected) / keys.size)
            assert abs(share - expected) < 6 * sigma, (alpha, table, share, expected)
    assert zipf_top_k_mass(rows[0], 1.2, 100) > 20 * zipf_top_k_mass(rows[0], 0.0, 100)


def test_tables_use_different_hot_keys(perf_input):
    doc = perf_input.make_perf_input([5000, 5000], [40, 40], 1.3, 200, seed=0)
    segments = [table_segments(entry, [40, 40]) for entry in doc["data"]]
    tables = [np.concatenate([s[t] for s in segments]) for t in range(2)]
    hottest = [np.bincount(t, minlength=5000).argmax() for t in tables]
    assert hottest[0] != hottest[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([10, 20], [1], 1.0, 2), "tables_rows has 2 tables but keys_per_table has 1"),
        (([], [], 1.0, 2), "at least one table"),
        (([10], [0], 1.0, 2), "keys_per_table must all be >= 1"),
        (([0], [1], 1.0, 2), "tables_rows must all be >= 1"),
        (([10], [1], -1.0, 2), "alpha must be finite and >= 0"),
        (([10], [1], float("nan"), 2), "alpha must be finite and >= 0"),
        (([10], [1], 1.0, 0), "samples must be >= 1"),
    ],
)
def test_bad_arguments(perf_input, args, message):
    with pytest.raises(ValueError, match=message):
        perf_input.make_perf_input(*args, seed=0)


def test_main_writes_a_file_perf_analyzer_can_read(perf_input, tmp_path, capsys):
    out = tmp_path / "perf_input.json"
    argv = ["--tables-rows", "100000,20000", "--keys-per-table", "26,26", "--alpha", "1.05"]
    argv += ["--samples", "64", "--seed", "0", "--out", str(out)]
    assert perf_input.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc == perf_input.make_perf_input([100_000, 20_000], [26, 26], 1.05, 64, 0)
    printed = capsys.readouterr().out
    assert "KEYS shape [52]" in printed and "--request-count 2000" in printed


def test_main_reports_bad_values(perf_input, tmp_path, capsys):
    assert perf_input.main(["--tables-rows", "5", "--out", str(tmp_path / "x.json")]) == 2
    assert "tables_rows has 1 tables but keys_per_table has 2" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    assert perf_input.main(["--out", str(tmp_path / "missing_dir" / "x.json")]) == 2


def test_main_rejects_malformed_lists(perf_input, capsys):
    with pytest.raises(SystemExit) as exc:
        perf_input.main(["--keys-per-table", "26,x"])
    assert exc.value.code == 2
    assert "'x' is not an integer" in capsys.readouterr().err
