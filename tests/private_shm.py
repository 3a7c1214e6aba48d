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


def python_backend_regions(prefix: str) -> list[str]:
    """The ``/dev/shm`` regions of the Triton server whose Python backend names its regions
    with ``prefix`` (``TritonServer`` gives each server its own): what that server left there,
    whatever other tests running beside it keep in ``/dev/shm``."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}*"))
