"""Free-port picking and the listening sockets of a process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from contextlib import ExitStack

import psutil
import pytest

from hps_core.server.ports import listening_ports, pick_free_ports


@pytest.mark.parametrize("count", [1, 3, 8])
def test_picked_ports_are_distinct_and_bindable(count):
    ports = pick_free_ports(count)
    assert len(ports) == count == len(set(ports))
    assert all(1024 <= port <= 65535 for port in ports)
    with ExitStack() as stack:  # all of them at once, as tritonserver binds them
        for port in ports:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", port))


def test_picked_ports_on_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        (port,) = pick_free_ports(1, "::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback: {exc}")
    with socket.socket(socket.AF_INET6) as sock:
        sock.bind(("::1", port))


def test_listening_ports_of_this_process():
    with socket.socket() as listening, socket.socket() as bound_only:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        bound_only.bind(("127.0.0.1", 0))
        ports = listening_ports(os.getpid())
        assert listening.getsockname()[1] in ports
        assert bound_only.getsockname()[1] not in ports


def test_listening_ports_of_another_process_are_not_ours():
    code = (
        "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
        "print(s.getsockname()[1], flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(child.stdout.readline())
        assert port in listening_ports(child.pid)
        assert port not in listening_ports(os.getpid())
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    assert listening_ports(child.pid) == set()  # gone: nothing, no error


def test_listening_ports_of_a_process_we_may_not_inspect(monkeypatch):
    # Another user's process: psutil raises AccessDenied for its sockets (we run as root here).
    def refuse(self, kind="inet"):
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "net_connections", refuse)
    assert listening_ports(os.getpid()) == set()
