"""The demo ranking models of the default repository: deterministic files written once, and
predictions equal to PyTorch (DLRM) or the float64 reference (DCN, W&D)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from ranking_reference import model_tables, predict_reference, random_keys, torch_dlrm_predict
from ranking_testdata import to_sparse_batch

from hps_core.config import load_ps_config
from hps_core.demo import DEMO_MODELS
from hps_core.demo.dlrm import dlrm_state
from hps_core.infer import RankingSession
from hps_core.triton_repo import ServingOptions

RANKING_DEMOS = ("dlrm", "dcn", "wdl")


def tree(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder``."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def data_state(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every data file: equal only if nothing rewrote it."""
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted((folder / "data").rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    for name in RANKING_DEMOS:
        assert DEMO_MODELS[name](path) == (path / name).resolve()
    return path


def test_each_demo_writes_two_triton_models(repo: Path) -> None:
    for name in RANKING_DEMOS:
        assert (repo / name / "config.pbtxt").is_file()
        assert (repo / name / "1" / "model.py").is_file()
        assert (repo / f"{name}_samples" / "config.pbtxt").is_file()
        model = load_ps_config(repo / name / "ps.json").model(name)
        for path in (model.network_file, model.dense_file, *model.sparse_files):
            assert path.is_relative_to(repo / name / "data"), path


def test_demos_are_the_same_on_every_machine(repo: Path, tmp_path: Path) -> None:
    for name in RANKING_DEMOS:
        DEMO_MODELS[name](tmp_path, ServingOptions())
        for folder in (name, f"{name}_samples"):
            assert tree(tmp_path / folder) == tree(repo / folder), folder


@pytest.mark.parametrize("name", RANKING_DEMOS)
def test_data_is_written_only_when_missing_or_damaged(tmp_path: Path, name: str) -> None:
    writer = DEMO_MODELS[name]
    folder = writer(tmp_path)
    before, files = data_state(folder), tree(folder / "data")
    writer(tmp_path)
    assert data_state(folder) == before
    dense = next(p for p in (folder / "data").iterdir() if "dense" in p.name)
    dense.write_bytes(dense.read_bytes()[:-4])
    writer(tmp_path)
    assert tree(folder / "data") == files


def test_dlrm_demo_predicts_what_pytorch_predicts(repo: Path) -> None:
    session = RankingSession.open(repo / "dlrm" / "ps.json", "dlrm")
    _, tables = model_tables(repo / "dlrm" / "ps.json", "dlrm")
    rows = [np.arange(len(t)) for t in tables]
    rng = np.random.default_rng(1)
    state = dlrm_state()
    for batch in (1, 17, 256):
        keys = random_keys(rng, batch, [1] * len(tables), rows)
        dense = rng.random((batch, 13), dtype=np.float32)
        got = session.predict(to_sparse_batch(dense, keys))
        np.testing.assert_allclose(got, torch_dlrm_predict(state, dense, keys), rtol=1e-5)
        assert got.std() > 0.05 or batch == 1  # the predictions depend on the inputs


@pytest.mark.parametrize("name", ["dcn", "wdl"])
def test_multi_hot_demo_equals_the_reference(repo: Path, name: str) -> None:
    session = RankingSession.open(repo / name / "ps.json", name)
    model, tables = model_tables(repo / name / "ps.json", name)
    known = [np.array(sorted(t), dtype=np.int64) for t in tables]
    rng = np.random.default_rng(2)
    for batch in (1, 9, 100):
        keys = random_keys(
            rng, batch, session.layout.slot_nums, known, max_hot=2, empty=0.1, unknown=0.1
        )
        dense = rng.standard_normal((batch, 13)).astype(np.float32)
        got = session.predict(to_sparse_batch(dense, keys))
        want = predict_reference(
            model.network_file, model.dense_file, tables, [0.0] * len(tables), dense, keys
        )
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
