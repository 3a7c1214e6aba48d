"""An S3-compatible server for tests: moto's server mode on a free loopback port, reached
through the standard AWS settings (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), which
the tests set and child processes (a Triton server and its stubs) inherit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

SECRET = "hps-test-secret-never-logged"
"""The secret access key the tests use: it must never show in output or logs."""


def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Start the server, set the AWS variables, yield a pyarrow S3 file system that may
    create buckets, and stop the server afterwards (use with ``yield from`` in a fixture)."""
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "hps-test-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    try:
        yield fs.S3FileSystem(allow_bucket_creation=True, endpoint_override=endpoint)
    finally:
        server.stop()


def upload(s3: Any, local: Any, prefix: str) -> None:
    """Every file under the folder ``local`` to ``prefix`` (``bucket/key...``), byte for byte."""
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        with s3.open_output_stream(f"{prefix}/{path.relative_to(local).as_posix()}") as out:
            out.write(path.read_bytes())
