"""TCP ports: pick free ones, and see which ones a process listens on."""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping
from contextlib import ExitStack

import psutil


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ask the kernel for ``count`` distinct TCP ports that are free on ``host`` right now.

    All sockets stay bound until every port is picked, so the ports differ from each other.
    Another process may still take one before the caller binds it: callers retry on
    "address in use" (``TritonServer.start`` does).

    Args:
        count: number of ports.
        host: address the ports will be bound on.

    Returns:
        The port numbers.

    Example:
        >>> http, grpc = pick_free_ports(2)
        >>> http != grpc
        True
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]


def busy_ports(ports: Mapping[str, int], host: str = "127.0.0.1") -> dict[str, int]:
    """Return the ports that another socket already holds on ``host`` (a bind test).

    Checked before a server starts, so that a port in use fails at once instead of after
    every model has loaded (Triton binds its ports only then). The test binds with
    ``SO_REUSEADDR``, as Triton does, so the TIME_WAIT connections of a server that just
    exited leave its ports free; a socket bound there, or on the wildcard address, does not.
    Only "address in use" counts: other bind errors (an address not on this host, a
    privileged port) are left for the server to report.

    Args:
        ports: a port per name, e.g. ``{"http": 8000, "grpc": 8001}``; 0 (pick a free
            port) is never busy.
        host: the address the server will bind.

    Returns:
        The names and ports of ``ports`` that are in use, in the order given.

    Example:
        >>> with socket.socket() as sock:  # doctest: +SKIP
        ...     sock.bind(("127.0.0.1", 8000))
        ...     sock.listen()
        ...     busy_ports({"http": 8000, "grpc": 0})
        {'http': 8000}
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    busy = {}
    for name, port in ports.items():
        if not port:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    busy[name] = port
    return busy


def listening_ports(pid: int) -> set[int]:
    """Return the TCP ports (IPv4 and IPv6) on which process ``pid`` itself has a listening socket.

    A server that answers on a port is not proof that *it* owns the port (a leftover server
    might); this is. Returns an empty set when the process is gone or belongs to another user.

    Args:
        pid: process id.

    Returns:
        Local port numbers of the process's sockets in LISTEN state.
    """
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")  # IPv4 and IPv6
    except psutil.Error:  # gone, a zombie, or another user's process
        return set()
    return {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}
