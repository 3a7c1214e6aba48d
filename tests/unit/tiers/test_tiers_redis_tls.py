"""The Redis cluster tier over TLS (ps.json ``enable_tls`` and the ``tls_*`` fields), on a real
three-node cluster that serves TLS only and requires client certificates
(``tests/redis_cluster.py``), and against a local TLS listener that records the SNI a client
asks for."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis_cluster import OPENSSL, RedisCluster, TlsFiles, redis_cluster, write_tls_files

from hps_core.config import DatabaseType, VolatileDBConfig
from hps_core.errors import ConfigError, TierUnavailableError
from hps_core.tiers.backing import table_tag
from hps_core.tiers.redis_store import RedisClusterStore


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """A TLS-only cluster (``tls-auth-clients yes``) shared by the tests of this module."""
    yield from redis_cluster(tls=True)


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A second CA and its certificates: the cluster trusts none of them, nor they it."""
    if OPENSSL is None:
        pytest.skip("the openssl command is needed to make test certificates")
    return write_tls_files(tmp_path_factory.mktemp("foreign"), ca_name="another test CA")


def files_of(cluster: RedisCluster) -> TlsFiles:
    assert cluster.tls_files is not None
    return cluster.tls_files


def tls_config(address: str, files: TlsFiles, **fields: Any) -> VolatileDBConfig:
    values: dict[str, Any] = {
        "num_partitions": 5,
        "max_batch_size": 64,
        "enable_tls": True,
        "tls_ca_certificate": files.ca,
        "tls_client_certificate": files.client_cert,
        "tls_client_key": files.client_key,
    }
    values.update(fields)
    return VolatileDBConfig(type=DatabaseType.REDIS_CLUSTER, address=address, **values)


def key_body(path: Path) -> list[str]:
    """The base64 lines of a PEM key: none may show in a message or log."""
    return [line for line in path.read_text().splitlines() if line and "-----" not in line]


@pytest.mark.parametrize(
    ("n", "dim", "batch", "ca_folder"),
    [(1, 1, 1, False), (2500, 16, 100, False), (900, 128, 64, True)],
)
def test_tls_lookups_equal_a_dict_of_the_rows(
    cluster: RedisCluster,
    rng: np.random.Generator,
    n: int,
    dim: int,
    batch: int,
    ca_folder: bool,
) -> None:
    files = files_of(cluster)
    keys = rng.choice(10**12, n, replace=False).astype(np.int64) - 5 * 10**11
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    stored = dict(zip(keys.tolist(), vectors, strict=True))
    ca = files.ca_folder if ca_folder else files.ca
    table = table_tag("tls", f"t{n}")
    config = tls_config(cluster.address, files, max_batch_size=batch, tls_ca_certificate=ca)
    with RedisClusterStore(config) as store:
        store.insert(table, keys, vectors)
        unknown = np.array([-1, 7, 10**13], np.int64)
        queries = rng.permutation(np.concatenate([keys, keys[: n // 2], unknown]))
        got, found = store.lookup(table, queries, dim, default=-1.5)
        want = np.full((queries.shape[0], dim), -1.5, np.float32)
        want_found = np.zeros(queries.shape[0], bool)
        for i, key in enumerate(queries.tolist()):
            if key in stored:
                want[i], want_found[i] = stored[key], True
        np.testing.assert_array_equal(found, want_found)
        np.testing.assert_array_equal(got, want)
        assert store.count(table) == n and table in store.tables()
        assert store.errors == 0
        assert store.evict(table) == n


def test_every_handshake_asks_for_the_configured_name(
    cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the real cluster: every TLS handshake of the store (the seed's topology query, each
    node's data connections, a later slot-map refresh) hands OpenSSL the configured name,
    never the node's address (what redis-py alone would send)."""
    files = files_of(cluster)
    handshakes: list[tuple[int, str | None]] = []
    wrap_socket = ssl.SSLContext.wrap_socket

    def spy(context: ssl.SSLContext, sock: socket.socket, *args: Any, **kwargs: Any) -> Any:
        handshakes.append((sock.getpeername()[1], kwargs.get("server_hostname")))
        return wrap_socket(context, sock, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "wrap_socket", spy)
    name = "cache-7.hps.internal"
    config = tls_config(cluster.address, files, tls_server_name_identification=name)
    with RedisClusterStore(config) as store:
        keys = np.arange(200, dtype=np.int64)
        store.insert("hps_et.tls.sni", keys, np.ones((200, 2), np.float32))
        assert store.lookup("hps_et.tls.sni", keys, 2)[1].all()
        store._refresh(force=True)
        store.evict("hps_et.tls.sni")
    assert {port for port, _ in handshakes} == set(cluster.ports)
    assert {hostname for _, hostname in handshakes} == {name}


class SniListener:
    """A TLS server on a loopback port that records the SNI of each handshake (``None`` when
    the client sent none), then closes the connection: it is no Redis node."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self.names: list[str | None] = []
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(files.server_cert, files.server_key)
        self._context.sni_callback = self._record
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.1)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _record(self, _sock: ssl.SSLObject, name: str | None, _context: ssl.SSLContext) -> None:
        self.names.append(name)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            conn.settimeout(2)
            try:
                with self._context.wrap_socket(conn, server_side=True):
                    pass  # handshake done: the name is recorded
            except (OSError, ssl.SSLError):
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._server.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[SniListener]:
    if OPENSSL is None:
        pytest.skip("the openssl command is needed to make test certificates")
    sni = SniListener(write_tls_files(tmp_path / "tls"))
    try:
        yield sni
    finally:
        sni.close()


@pytest.mark.parametrize("name", ["redis.localhost", "cache-7.hps.internal", ""])
def test_the_seed_connection_sends_the_configured_sni(listener: SniListener, name: str) -> None:
    """On the wire: the store's first connection (the topology query to a seed) asks for
    ``tls_server_name_identification``; an empty one sends none, as HugeCTR's hiredis."""
    import redis

    files = listener.files
    address = f"127.0.0.1:{listener.port}"
    config = tls_config(address, files, tls_server_name_identification=name)
    with pytest.raises(TierUnavailableError, match=r"^volatile_db\.address '127\.0\.0\.1:\d+'"):
        RedisClusterStore(config, connect_timeout=2, socket_timeout=2)
    assert listener.names and set(listener.names) == {name or None}

    # The listener records what a client sends: redis-py on its own sends the address.
    listener.names.clear()
    plain = redis.Redis(
        host="localhost", port=listener.port, ssl=True, ssl_ca_certs=str(files.ca),
        ssl_check_hostname=False, socket_timeout=2, retry=None,
    )  # fmt: skip
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()
    assert set(listener.names) == {"localhost"}


def test_untrusted_certificates_and_bad_files_fail_clearly(
    cluster: RedisCluster, foreign: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    """A CA that did not sign the nodes' certificate, a client certificate the nodes do not
    trust, and files that do not load: each fails at open, naming volatile_db and the file
    by path, never the key's contents."""
    caplog.set_level(logging.DEBUG)
    files = files_of(cluster)
    address = cluster.address
    messages = []

    with pytest.raises(ConfigError) as info:  # we do not trust the nodes
        RedisClusterStore(tls_config(address, files, tls_ca_certificate=foreign.ca))
    assert str(info.value).startswith("volatile_db.tls_ca_certificate: the Redis cluster at")
    assert f"'{foreign.ca}' does not verify" in str(info.value)
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)
    messages.append(str(info.value))

    untrusted = {
        "tls_client_certificate": foreign.client_cert,
        "tls_client_key": foreign.client_key,
    }
    with pytest.raises(TierUnavailableError) as down:  # the nodes do not trust us
        RedisClusterStore(tls_config(address, files, **untrusted))
    assert str(down.value).startswith(f"volatile_db.address '{address}': cannot open")
    assert f"does it trust tls_client_certificate '{foreign.client_cert}'?" in str(down.value)
    messages.append(str(down.value))

    missing = files.client_key.with_name("absent.key")
    bad_files: list[tuple[dict[str, Any], str]] = [
        ({"tls_ca_certificate": files.ca.with_name("absent.crt")}, "tls_ca_certificate"),
        ({"tls_client_key": missing}, "tls_client_certificate"),
        ({"tls_client_key": files.server_key}, "tls_client_certificate"),  # not its key
        ({"tls_client_certificate": files.client_key}, "tls_client_certificate"),  # a key
    ]
    for fields, field in bad_files:
        with pytest.raises(ConfigError, match=rf"^volatile_db\.{field}: cannot load '") as bad:
            RedisClusterStore(tls_config(address, files, **fields))
        messages.append(str(bad.value))

    text = "\n".join(messages) + caplog.text
    for key in (files.client_key, files.server_key, foreign.client_key):
        assert not any(line in text for line in key_body(key))


def test_tls_off_against_the_tls_cluster_fails_clearly(cluster: RedisCluster) -> None:
    config = VolatileDBConfig(type=DatabaseType.REDIS_CLUSTER, address=cluster.address)
    with pytest.raises(TierUnavailableError, match=r"^volatile_db\.address '.*': cannot open"):
        RedisClusterStore(config)
