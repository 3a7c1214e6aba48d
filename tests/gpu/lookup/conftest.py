"""The GPU lookup tests (every GPU lookup goes through the cache bank's kernels), each in a
private shared-memory folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from hps_core.hps import HPS


@pytest.fixture(autouse=True)
def _private_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A shared-memory folder of the test's own; every HPS closed afterwards."""
    monkeypatch.setenv("HPS_SHM_DIR", str(tmp_path / "shm"))
    yield
    HPS.close_all()
