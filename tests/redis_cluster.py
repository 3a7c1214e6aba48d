"""A real Redis cluster for tests: three ``redis-server`` primaries on free loopback ports in a
temporary folder, joined with ``redis-cli --cluster create``, optionally with a password.

Each node runs with ``--cluster-require-full-coverage no`` so that, as in a deployment that
wants the HPS failure behaviour, the surviving nodes keep answering their slots while one
node is down. A node can be killed (SIGKILL) and restarted on the same port with its
cluster config file, where it rejoins the cluster. Everything (processes, folder) is removed
on :meth:`RedisCluster.stop`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SECRET = "hps-redis-secret-never-logged"
"""The password the tests give the cluster: it must never show in output, logs or errors."""

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
SKIP_REASON = "redis-server and redis-cli are needed (scripts/setup.sh installs them)"


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

    Example:
        >>> cluster = RedisCluster(password=SECRET).start()  # doctest: +SKIP
        >>> cluster.address  # doctest: +SKIP
        '127.0.0.1:40001,127.0.0.1:40002,127.0.0.1:40003'
        >>> cluster.stop()  # doctest: +SKIP
    """

    def __init__(self, nodes: int = 3, password: str | None = None) -> None:
        if REDIS_SERVER is None or REDIS_CLI is None:
            raise RuntimeError(SKIP_REASON)
        self.password = password
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

    def cli(self, port: int, *args: str, timeout: float = 10.0) -> str:
        """Run ``redis-cli -p port args...`` and return its output."""
        assert REDIS_CLI is not None
        done = subprocess.run(
            [REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args],
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
        args = [REDIS_SERVER, str(conf), "--port", str(port), "--bind", "127.0.0.1"]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        args += ["--logfile", str(folder / "redis.log"), "--daemonize", "no"]
        self.processes[port] = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder
        )
        deadline = time.monotonic() + 10
        while "PONG" not in self.cli(port, "ping"):
            if self.processes[port].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not start: {folder}")
            time.sleep(0.05)

    def start(self) -> RedisCluster:
        """Start every node, create the cluster and wait until it is ``cluster_state:ok``."""
        try:
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


def redis_cluster(password: str | None = None) -> Iterator[RedisCluster]:
    """Start a cluster, yield it, stop it afterwards (use with ``yield from`` in a fixture);
    skips the test when ``redis-server`` is not installed."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip(SKIP_REASON)
    cluster = RedisCluster(password=password).start()
    try:
        yield cluster
    finally:
        cluster.stop()
