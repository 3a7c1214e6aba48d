"""A real Redis cluster for tests: three ``redis-server`` primaries on free loopback ports in a
temporary folder, joined with ``redis-cli --cluster create``, optionally with a password and
optionally over TLS only.

Each node runs with ``--cluster-require-full-coverage no`` so that, as in a deployment that
wants the HPS failure behaviour, the surviving nodes keep answering their slots while one
node is down. A node can be killed (SIGKILL) and restarted on the same port with its
cluster config file, where it rejoins the cluster. Everything (processes, folder) is removed
on :meth:`RedisCluster.stop`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SECRET = "hps-redis-secret-never-logged"
"""The password the tests give the cluster: it must never show in output, logs or errors."""

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
SKIP_REASON = "redis-server and redis-cli are needed (scripts/setup.sh installs them)"
OPENSSL = shutil.which("openssl")

SERVER_NAME = "redis.localhost"
"""The DNS name in the test server certificate (HugeCTR's default SNI)."""

# Extensions of the test certificates (read by ``openssl req``/``openssl x509``): a CA, and
# leaf certificates for both ends (the nodes also present theirs on the cluster bus).
_OPENSSL_CONF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = hps-triton test
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = DNS:{server_name}, IP:127.0.0.1
"""


class TlsUnsupported(RuntimeError):
    """This ``redis-server``/``redis-cli`` cannot serve TLS, or ``openssl`` is missing."""


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and two certificates it signed, as PEM files (ECDSA P-256 keys).

    Attributes:
        ca: the CA certificate (a bundle of one).
        ca_folder: a folder holding the CA certificate under its OpenSSL hash name
            (``<hash>.0``), as ``tls_ca_certificate`` may name a folder.
        server_cert, server_key: the nodes' certificate (``CN``/``subjectAltName``
            :data:`SERVER_NAME` and ``IP:127.0.0.1``) and key.
        client_cert, client_key: a client's certificate (``CN=hps-triton client``) and key.
    """

    ca: Path
    ca_folder: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> str:
    if OPENSSL is None:
        raise TlsUnsupported("the openssl command is needed to make test certificates")
    done = subprocess.run(
        [OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed:\n{done.stderr}")
    return done.stdout


def write_tls_files(folder: Path, ca_name: str = "hps-triton test CA") -> TlsFiles:
    """Write a new CA and a server and a client certificate it signed into ``folder``.

    Two calls give two unrelated CAs: one's certificates are not trusted by the other.

    Raises:
        TlsUnsupported: no ``openssl`` command.
    """
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "openssl.cnf"
    conf.write_text(_OPENSSL_CONF.format(server_name=SERVER_NAME))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", "-new", "-config", conf.name, "-extensions", "ca", *ec,
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", f"/CN={ca_name}",
        cwd=folder,
    )  # fmt: skip
    for serial, (name, subject) in enumerate(
        [("server", f"/CN={SERVER_NAME}"), ("client", "/CN=hps-triton client")], start=1
    ):
        _openssl(
            "req", "-new", "-config", conf.name, *ec, "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", subject,
            cwd=folder,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", str(serial), "-days", "2", "-extfile", conf.name,
            "-extensions", "leaf", "-out", f"{name}.crt",
            cwd=folder,
        )  # fmt: skip
    ca_folder = folder / "ca.d"
    ca_folder.mkdir(exist_ok=True)
    digest = _openssl("x509", "-hash", "-noout", "-in", "ca.crt", cwd=folder).strip()
    shutil.copyfile(folder / "ca.crt", ca_folder / f"{digest}.0")
    return TlsFiles(
        ca=folder / "ca.crt",
        ca_folder=ca_folder,
        server_cert=folder / "server.crt",
        server_key=folder / "server.key",
        client_cert=folder / "client.crt",
        client_key=folder / "client.key",
    )


def _free_ports(count: int) -> list[int]:
    """``count`` loopback ports that are free together with their cluster-bus port (+10000)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class RedisCluster:
    """Three (``nodes``) Redis cluster primaries on loopback, started by :meth:`start`.

    Args:
        nodes: primaries to start (at least 3, Redis's minimum for a cluster).
        password: ``requirepass`` (and ``masterauth``) of every node, written to each node's
            config file rather than its command line; ``None`` for no AUTH.
        tls: serve TLS only, with the certificates of :attr:`tls_files` (made in the
            cluster's folder); clients must present a certificate of that CA.

    Raises:
        TlsUnsupported: (at :meth:`start`, with ``tls``) ``redis-server`` was built without
            TLS, ``redis-cli`` has no ``--tls``, or there is no ``openssl`` command.

    Example:
        >>> cluster = RedisCluster(password=SECRET).start()  # doctest: +SKIP
        >>> cluster.address  # doctest: +SKIP
        '127.0.0.1:40001,127.0.0.1:40002,127.0.0.1:40003'
        >>> cluster.stop()  # doctest: +SKIP
    """

    def __init__(self, nodes: int = 3, password: str | None = None, tls: bool = False) -> None:
        if REDIS_SERVER is None or REDIS_CLI is None:
            raise RuntimeError(SKIP_REASON)
        self.password = password
        self.tls = tls
        self.tls_files: TlsFiles | None = None
        self.root = Path(tempfile.mkdtemp(prefix="hps-redis-"))
        self.ports = _free_ports(nodes)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def address(self) -> str:
        """The seeds in ps.json ``volatile_db.address`` form: ``host:port,host:port,...``."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def folder(self, port: int) -> Path:
        """The working folder of the node on ``port`` (its log and ``nodes.conf``)."""
        return self.root / str(port)

    def _cli_env(self) -> dict[str, str]:
        # REDISCLI_AUTH keeps the password off redis-cli's command line and its warning.
        env = dict(os.environ)
        if self.password is not None:
            env["REDISCLI_AUTH"] = self.password
        return env

    def _tls_cli_args(self) -> list[str]:
        if self.tls_files is None:
            return []
        files = self.tls_files
        paths = {"--cacert": files.ca, "--cert": files.client_cert, "--key": files.client_key}
        return ["--tls", *(text for flag, path in paths.items() for text in (flag, str(path)))]

    def cli(self, port: int, *args: str, timeout: float = 10.0) -> str:
        """Run ``redis-cli -p port args...`` (over TLS with the client certificate when the
        cluster is TLS) and return its output."""
        assert REDIS_CLI is not None
        done = subprocess.run(
            [REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *self._tls_cli_args(), *args],
            capture_output=True,
            env=self._cli_env(),
            timeout=timeout,
            check=False,
        )
        return done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")

    def start_node(self, port: int) -> None:
        """Start (or restart, with its existing ``nodes.conf``) the node on ``port``."""
        assert REDIS_SERVER is not None
        folder = self.folder(port)
        folder.mkdir(exist_ok=True)
        conf = folder / "redis.conf"
        lines = []
        if self.password is not None:
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        conf.write_text("\n".join(lines) + "\n")
        conf.chmod(0o600)
        args = [REDIS_SERVER, str(conf), "--bind", "127.0.0.1"]
        if self.tls_files is None:
            args += ["--port", str(port)]
        else:  # TLS only: no plain port; TLS on the cluster bus too
            files = self.tls_files
            args += ["--port", "0", "--tls-port", str(port), "--tls-cluster", "yes"]
            args += ["--tls-cert-file", str(files.server_cert)]
            args += ["--tls-key-file", str(files.server_key)]
            args += ["--tls-ca-cert-file", str(files.ca), "--tls-auth-clients", "yes"]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        args += ["--logfile", str(folder / "redis.log"), "--daemonize", "no"]
        # Errors before the log file opens (a directive this build lacks) go to stderr.
        with open(folder / "stderr.log", "ab") as stderr:
            self.processes[port] = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=stderr, cwd=folder
            )
        deadline = time.monotonic() + 10
        while "PONG" not in self.cli(port, "ping"):
            if self.processes[port].poll() is not None or time.monotonic() > deadline:
                self._raise_if_no_tls(folder)
                raise RuntimeError(f"redis-server on port {port} did not start: {folder}")
            time.sleep(0.05)

    def _raise_if_no_tls(self, folder: Path) -> None:
        """Raise :class:`TlsUnsupported` when a TLS node failed for want of TLS in the build:
        Redis up to 7.0 does not know the ``tls-*`` directives, 7.2 and later have no
        ``tls`` connection type."""
        if not self.tls:
            return
        text = "".join(
            (folder / name).read_text(errors="replace")
            for name in ("stderr.log", "redis.log")
            if (folder / name).exists()
        )
        for line in text.splitlines():
            if "Bad directive" in line or re.search(r"connection (listener|type) .*tls", line):
                raise TlsUnsupported(f"{REDIS_SERVER} was built without TLS: {line.strip()}")

    def start(self) -> RedisCluster:
        """Start every node, create the cluster and wait until it is ``cluster_state:ok``."""
        try:
            if self.tls:
                assert REDIS_CLI is not None
                cli_help = subprocess.run(
                    [REDIS_CLI, "--help"], capture_output=True, text=True, timeout=10
                )
                if "--tls" not in cli_help.stdout + cli_help.stderr:
                    raise TlsUnsupported(f"{REDIS_CLI} was built without TLS (no --tls)")
                self.tls_files = write_tls_files(self.root / "tls")
            for port in self.ports:
                self.start_node(port)
            out = self.cli(
                self.ports[0],
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
                timeout=60,
            )
            if "[OK] All 16384 slots covered" not in out:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{out}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node reports ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        for port in self.ports:
            while "cluster_state:ok" not in self.cli(port, "cluster", "info"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Redis cluster did not reach cluster_state:ok ({port})")
                time.sleep(0.1)

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (no shutdown, no save) and reap it."""
        process = self.processes.pop(port)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def restart(self, port: int) -> None:
        """Start the killed node on ``port`` again and wait until the cluster is ok."""
        self.start_node(port)
        self.wait_ok()

    def logs(self) -> str:
        """Every node's log, concatenated."""
        return "".join(
            path.read_text(errors="replace") for path in sorted(self.root.glob("*/redis.log"))
        )

    def stop(self) -> None:
        """Kill every node and remove the temporary folder (idempotent)."""
        for port in list(self.processes):
            self.kill(port)
        shutil.rmtree(self.root, ignore_errors=True)


def redis_cluster(password: str | None = None, tls: bool = False) -> Iterator[RedisCluster]:
    """Start a cluster, yield it, stop it afterwards (use with ``yield from`` in a fixture);
    skips the test when ``redis-server`` is not installed or, with ``tls``, cannot serve
    TLS (or ``openssl`` is missing)."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip(SKIP_REASON)
    try:
        cluster = RedisCluster(password=password, tls=tls).start()
    except TlsUnsupported as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()
