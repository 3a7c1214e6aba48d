"""Fixtures of the ranking-model backend tests: private shared-memory folder, no HPS left
behind; the ranking test helpers of ``tests/unit/infer`` on the import path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from private_shm import private_shm_dir

from hps_core.hps import HPS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infer"))


@pytest.fixture(autouse=True)
def shm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point ``HPS_SHM_DIR`` at an empty folder of this test; close every HPS afterwards."""
    path = private_shm_dir(tmp_path, monkeypatch)
    yield path
    HPS.close_all()
