"""Fixtures of the ranking-session tests: private shared-memory folder, no HPS left behind;
the dense-network test helpers of ``tests/unit/nn`` on the import path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hps_core.hps import HPS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nn"))


@pytest.fixture(autouse=True)
def shm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point ``HPS_SHM_DIR`` at an empty folder of this test; close every HPS afterwards."""
    path = tmp_path / "shm"
    path.mkdir()
    monkeypatch.setenv("HPS_SHM_DIR", str(path))
    yield path
    HPS.close_all()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """An S3-compatible server (moto's) on a free loopback port, found through the standard
    AWS settings; yields a pyarrow S3 file system that may create buckets. Stopped after."""
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "hps-test-key",
        "AWS_SECRET_ACCESS_KEY": "hps-test-secret-never-logged",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    try:
        yield fs.S3FileSystem(
            allow_bucket_creation=True, endpoint_override=f"http://{host}:{port}"
        )
    finally:
        server.stop()
