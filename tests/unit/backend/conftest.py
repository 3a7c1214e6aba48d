"""Fixtures of the backend tests: a private shared-memory folder for any table opened."""

from __future__ import annotations

from pathlib import Path

import pytest
from private_shm import private_shm_dir


@pytest.fixture(autouse=True)
def shm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``HPS_SHM_DIR`` at an empty folder of this test, never at /dev/shm."""
    return private_shm_dir(tmp_path, monkeypatch)
