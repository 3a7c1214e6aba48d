"""A private shared-memory folder per test: the host tier's segments go there, never to
/dev/shm, so tests neither see nor leave segments of other runs."""

from __future__ import annotations

from pathlib import Path

import pytest


def private_shm_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``tmp_path/shm`` and point ``HPS_SHM_DIR`` at it for the test; return it."""
    path = tmp_path / "shm"
    path.mkdir()
    monkeypatch.setenv("HPS_SHM_DIR", str(path))
    return path
