"""Fixtures of the tier tests: every shared-memory segment goes to a private folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from private_shm import private_shm_dir


@pytest.fixture(autouse=True)
def shm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``HPS_SHM_DIR`` at an empty folder of this test, never at /dev/shm."""
    return private_shm_dir(tmp_path, monkeypatch)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded by the test's name, so each test sees its own fixed stream."""
    return np.random.default_rng(list(request.node.nodeid.encode()))
