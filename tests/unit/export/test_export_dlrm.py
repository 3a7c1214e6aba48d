"""``export_dlrm``: the exported HugeCTR files, run by ``hps_core``, predict what the PyTorch
model predicts (float32, 1e-5 relative), for one-hot and multi-hot inputs and several sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dlrm_reference import ReferenceDLRM, hps_predict, random_batch, torch_predict

from hps_core.export import DlrmArch, export_dlrm
from hps_core.formats.sparse import read_sparse_table

# (tables, dim, batch, bottom MLP, top MLP after the interaction)
SIZES = [
    pytest.param(1, 4, 1, (5, 8, 4), (3, 1), id="1table-dim4-batch1"),
    pytest.param(3, 8, 7, (13, 16, 8), (16, 1), id="3tables-dim8"),
    pytest.param(5, 64, 33, (7, 64), (64, 2), id="5tables-dim64-2labels"),
    pytest.param(26, 16, 64, (13, 32, 16), (32, 16, 1), id="26tables-dim16-batch64"),
    pytest.param(26, 64, 17, (13, 64), (8, 1), id="26tables-dim64"),
]
MAX_HOT = 4


def _rows(tables: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 300, tables).tolist()


def _assert_same(hps: np.ndarray, reference: np.ndarray) -> None:
    assert hps.shape == reference.shape and hps.dtype == np.float32
    np.testing.assert_allclose(hps, reference, rtol=1e-5, atol=0)


@pytest.mark.parametrize(("tables", "dim", "batch", "bottom", "top"), SIZES)
def test_exported_model_predicts_like_torch(tmp_path: Path, tables, dim, batch, bottom, top):
    rows = _rows(tables, seed=tables * dim)
    model = ReferenceDLRM(dim, rows, bottom, top, seed=batch)
    files = export_dlrm(model, tmp_path, "dlrm", max_keys_per_table=MAX_HOT)
    assert files.table_rows == tuple(rows)
    rng = np.random.default_rng(batch)
    for max_hot in (1, MAX_HOT):
        inputs = random_batch(rng, batch, bottom[0], rows, max_hot)
        reference = torch_predict(model, inputs)
        if batch > 1:  # the embeddings move the predictions, so a wrong layout would show
            assert reference.std(axis=0).min() > 1e-3
        _assert_same(hps_predict(files.ps_json, "dlrm", inputs), reference)


def test_state_dict_of_numpy_arrays_and_given_arch(tmp_path: Path):
    rows = [40, 7, 300, 2]
    model = ReferenceDLRM(8, rows, (6, 16, 8), (12, 1), seed=5)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    arch = DlrmArch(8, tuple(rows), (6, 16, 8), (12, 1))
    files = export_dlrm(state, tmp_path, "np", arch=arch, max_keys_per_table=[1, 3, 2, 1])
    inputs = random_batch(np.random.default_rng(1), 20, 6, rows, max_hot=1)
    _assert_same(hps_predict(files.ps_json, "np", inputs), torch_predict(model, inputs))
    for t, path in enumerate(files.sparse_files):
        keys, vectors = read_sparse_table(path)
        np.testing.assert_array_equal(keys, np.arange(rows[t]))
        np.testing.assert_array_equal(vectors, state[f"emb_l.{t}.weight"])


def test_key_maps_give_rows_their_keys(tmp_path: Path):
    rows = [50, 9, 120]
    model = ReferenceDLRM(4, rows, (3, 4), (5, 1), seed=2)
    rng = np.random.default_rng(8)
    key_maps = {
        0: rng.permutation(np.arange(-(2**62), 2**62, 2**57))[:50],
        2: rng.choice(10**12, 120, replace=False).astype(np.uint64),
    }
    files = export_dlrm(model, tmp_path, "keyed", key_maps=key_maps, max_keys_per_table=3)
    for t, path in enumerate(files.sparse_files):
        keys, vectors = read_sparse_table(path)
        expected = key_maps[t].astype(np.int64) if t in key_maps else np.arange(rows[t])
        np.testing.assert_array_equal(keys, expected)
        np.testing.assert_array_equal(vectors, model.emb_l[t].weight.detach().numpy())
    inputs = random_batch(rng, 16, 3, rows, max_hot=3)
    predicted = hps_predict(files.ps_json, "keyed", inputs, key_maps)
    _assert_same(predicted, torch_predict(model, inputs))


def test_checkpoint_file_path(tmp_path: Path):
    rows = [30, 30]
    model = ReferenceDLRM(8, rows, (4, 8), (4, 1), seed=9)
    torch.save({"state_dict": model.state_dict(), "test_acc": np.float64(0.75)}, tmp_path / "c.pt")
    files = export_dlrm(tmp_path / "c.pt", tmp_path / "out", "ckpt")
    inputs = random_batch(np.random.default_rng(3), 5, 4, rows, max_hot=1)
    _assert_same(hps_predict(files.ps_json, "ckpt", inputs), torch_predict(model, inputs))
