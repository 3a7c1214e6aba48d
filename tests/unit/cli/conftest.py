"""Fixtures of the command-line tests: private shared-memory folder, no HPS left behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hps_core.hps import HPS


@pytest.fixture(autouse=True)
def shm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point ``HPS_SHM_DIR`` at an empty folder of this test; close every HPS afterwards."""
    path = tmp_path / "shm"
    path.mkdir()
    monkeypatch.setenv("HPS_SHM_DIR", str(path))
    yield path
    HPS.close_all()
