"""A private shared-memory folder per test: the host tier's segments go there, never to
/dev/shm, so tests neither see nor leave segments of other runs."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
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


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount``'s syntax: ``12m``) on ``path`` for the block, as a
    ``/dev/shm`` of that size; the test is skipped, saying why, where mounting is not
    permitted (not root, or no CAP_SYS_ADMIN in a container).

    Args:
        path: the mount point (created if missing).
        size: the size limit.

    Yields:
        ``path``, unmounted afterwards (lazily, should a process still hold a file there).
    """
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", str(path)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs of {size} here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=False)
