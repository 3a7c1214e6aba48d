"""``benchmarks/make_large_dlrm.py``: the size budget, and a small generated model that
``hps check`` accepts and that predicts like the same weights loaded into PyTorch."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from dlrm_reference import ReferenceDLRM, hps_predict, random_batch, torch_predict

from hps_core.formats.sparse import read_sparse_table
from hps_core.model_check import check_ps_json

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "make_large_dlrm.py"
_spec = importlib.util.spec_from_file_location("make_large_dlrm", SCRIPT)
make_large_dlrm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_large_dlrm)


@pytest.mark.parametrize("seed", range(6))
def test_cap_is_the_largest_that_fits(seed):
    rng = np.random.default_rng(seed)
    wanted = rng.integers(1, 10_000, rng.integers(1, 30)).tolist()
    dim, max_rows = int(rng.integers(1, 64)), int(rng.integers(1, 12_000))
    row_bytes = dim * 4 + 8
    budget_rows = int(rng.integers(len(wanted), sum(wanted) + 10))
    rows, cap = make_large_dlrm.table_rows(wanted, dim, max_rows, budget_rows * row_bytes / 1e9)
    assert rows == tuple(min(w, cap) for w in wanted)
    assert 1 <= cap <= max(1, min(max_rows, max(wanted)))
    assert sum(rows) <= budget_rows
    bigger = sum(min(w, cap + 1) for w in wanted)
    assert cap == max_rows or cap >= max(wanted) or bigger > budget_rows


def test_budget_too_small_for_one_row_per_table():
    with pytest.raises(ValueError, match="cannot hold even one row per table"):
        make_large_dlrm.table_rows([5, 5, 5], 128, 10, 2 * 520 / 1e9)


def test_mlperf_defaults_fit_the_default_budget():
    rows, cap = make_large_dlrm.table_rows(make_large_dlrm.MLPERF_TABLE_ROWS, 128, 4_000_000, 16)
    assert cap == 4_000_000 and max(rows) == 4_000_000 and len(rows) == 26
    assert sum(rows) * 520 < 16e9


def test_generated_model_is_servable_and_predicts_like_torch(tmp_path: Path, capsys):
    args = ["--out", str(tmp_path), "--rows-per-table", "300-20-1000", "--max-total-gb", "1e-5"]
    args += ["--arch-sparse-feature-size", "8", "--arch-mlp-bot", "13-16-8"]
    args += ["--arch-mlp-top", "16-1", "--max-keys-per-table", "2", "--seed", "7"]
    assert make_large_dlrm.main(args) == 0
    out = capsys.readouterr().out
    assert "2 capped at" in out and f"ps.json: {tmp_path / 'ps.json'}" in out
    report = check_ps_json(tmp_path / "ps.json")
    assert report.ok, report.problems
    rows = [t.rows for t in report.models[0].tables]
    assert sum(rows) * (8 * 4 + 8) <= 1e4 and rows[1] == 20

    arch = make_large_dlrm.DlrmArch(8, tuple(rows), (13, 16, 8), (16, 1))
    dense = make_large_dlrm.random_dense(arch, seed=7)
    state = {key: torch.from_numpy(value) for key, value in dense.items()}
    for t, table in enumerate(report.models[0].tables):
        keys, vectors = read_sparse_table(table.path)
        np.testing.assert_array_equal(keys, np.arange(rows[t]))
        np.testing.assert_array_equal(
            vectors, make_large_dlrm.random_rows(7, t, rows[t], 8, 0, rows[t])
        )
        assert np.abs(vectors).max() <= rows[t] ** -0.5
        state[f"emb_l.{t}.weight"] = torch.from_numpy(vectors)
    model = ReferenceDLRM(8, rows, (13, 16, 8), (16, 1))
    model.load_state_dict(state)
    inputs = random_batch(np.random.default_rng(0), 16, 13, rows, max_hot=2)
    np.testing.assert_allclose(
        hps_predict(tmp_path / "ps.json", "dlrm", inputs), torch_predict(model, inputs), rtol=1e-5
    )


@pytest.mark.parametrize("cuts", [[0, 9000], [0, 1, 4096, 4097, 9000], [0, 5000, 8191, 9000]])
def test_rows_do_not_depend_on_the_chunking(cuts):
    whole = make_large_dlrm.random_rows(1, 2, 9000, 3, 0, 9000)
    chunks = [make_large_dlrm.random_rows(1, 2, 9000, 3, a, b) for a, b in itertools.pairwise(cuts)]
    np.testing.assert_array_equal(np.concatenate(chunks), whole)
    assert np.unique(whole).size > 0.99 * whole.size  # no block repeats another
    assert not np.array_equal(make_large_dlrm.random_rows(1, 3, 9000, 3, 0, 9000), whole)


def test_bad_flags_print_an_error(tmp_path: Path, capsys):
    assert make_large_dlrm.main(["--out", str(tmp_path), "--arch-mlp-bot", "13-64"]) == 2
    assert "--arch-mlp-bot: last width 64 must equal" in capsys.readouterr().err
