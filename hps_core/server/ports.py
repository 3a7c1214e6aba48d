"""TCP ports: pick free ones, and see which ones a process listens on (Linux ``/proc``)."""

from __future__ import annotations

import os
import socket
from contextlib import ExitStack
from pathlib import Path

_TCP_LISTEN = "0A"  # state column of /proc/net/tcp


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


def listening_ports(pid: int) -> set[int]:
    """Return the TCP ports (IPv4 and IPv6) on which process ``pid`` itself has a listening socket.

    A server that answers on a port is not proof that *it* owns the port (a leftover server
    might); this is. Returns an empty set when the process is gone.

    Args:
        pid: process id.

    Returns:
        Local port numbers of the process's sockets in LISTEN state.
    """
    inodes = _socket_inodes(pid)
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _TCP_LISTEN and int(fields[9]) in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _socket_inodes(pid: int) -> set[int]:
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except (FileNotFoundError, ProcessLookupError):
        return set()
    inodes = set()
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:  # closed since listdir
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes
