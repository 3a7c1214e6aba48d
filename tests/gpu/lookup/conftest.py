"""The GPU lookup tests run through either engine (``HPS_GPU_ENGINE``: the cache bank's
kernels, or each table's CachedTableLookup), each in a private shared-memory folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps_core.hps import GPU_ENGINE_ENV, HPS


@pytest.fixture(params=["bank", "tables"])
def engine(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The engine's name; every HPS closed afterwards."""
    monkeypatch.setenv("HPS_SHM_DIR", str(tmp_path / "shm"))
    monkeypatch.setenv(GPU_ENGINE_ENV, request.param)
    yield request.param
    HPS.close_all()
