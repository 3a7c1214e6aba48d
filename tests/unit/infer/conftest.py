"""Fixtures of the ranking-session tests: private shared-memory folder, no HPS left behind;
the dense-network test helpers of ``tests/unit/nn`` on the import path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from private_shm import private_shm_dir
from s3_server import s3_server

from hps_core.hps import HPS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))


@pytest.fixture(autouse=True)
def shm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point ``HPS_SHM_DIR`` at an empty folder of this test; close every HPS afterwards."""
    path = private_shm_dir(tmp_path, monkeypatch)
    yield path
    HPS.close_all()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """An S3-compatible server on a loopback port (see ``tests/s3_server.py``)."""
    yield from s3_server(monkeypatch)
