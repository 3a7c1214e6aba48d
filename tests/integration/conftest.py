"""Fixtures for tests that run a real tritonserver.

``triton_server(model_repository, **options)`` starts a :class:`TritonServer` (options as its
fields, ports picked free) and stops it, with all its stubs, when the test (or, for
``module_triton_server``, the module) ends. When Triton is not installed the test is skipped,
unless ``HPS_REQUIRE_TRITON=1`` (set by scripts/test.sh, after setup installed Triton): then it
fails, so a broken installation cannot pass CI as a row of skips.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hps_core.server.install import TritonInstallation, TritonInstallError, find_triton
from hps_core.server.process import TritonServer


@functools.cache
def _installation() -> TritonInstallation | TritonInstallError:
    try:
        return find_triton()
    except TritonInstallError as exc:
        return exc


def require_triton() -> TritonInstallation:
    """Return the Triton installation, or skip (fail under HPS_REQUIRE_TRITON=1) without one."""
    found = _installation()
    if isinstance(found, TritonInstallError):
        if os.environ.get("HPS_REQUIRE_TRITON") == "1":
            pytest.fail(f"Triton is required here (HPS_REQUIRE_TRITON=1) but unusable: {found}")
        pytest.skip(f"Triton not installed: {found}")
    return found


class ServerFactory:
    """Starts servers for one test or module and stops every one of them at the end."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._servers: list[TritonServer] = []

    def __call__(self, model_repository: str | os.PathLike[str], **options: Any) -> TritonServer:
        """Start a server on ``model_repository``; ``options`` are TritonServer fields.

        Returns:
            The running server (its log is in the test's temporary folder).
        """
        options.setdefault("installation", require_triton())
        options.setdefault("log_file", self._log_dir / f"tritonserver-{len(self._servers)}.log")
        server = TritonServer(model_repository, **options)
        self._servers.append(server)
        return server.start()

    def stop_all(self) -> None:
        """Stop every server started here, the last first; report the first failure."""
        errors = []
        for server in reversed(self._servers):
            try:
                server.stop()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def triton_installation() -> TritonInstallation:
    """The installed Triton, for tests that launch it some other way than ``triton_server``."""
    return require_triton()


@pytest.fixture
def triton_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Factory of servers stopped at the end of the test."""
    factory = ServerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="module")
def module_triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Factory of servers shared by a test module, stopped at its end."""
    factory = ServerFactory(tmp_path_factory.mktemp("tritonserver"))
    try:
        yield factory
    finally:
        factory.stop_all()
