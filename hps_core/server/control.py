"""Model control of a running server for its operator, and for nobody else.

``hps serve`` runs Triton with the model-repository API restricted to requests that carry a
token drawn at start (:func:`~hps_core.server.stub_watchdog.control_args`), so clients cannot
load or unload models. The operator's tools reach it through a *control file*: ``hps serve``
writes the server's HTTP address and token to ``serve-<http port>.json`` in a folder only
this user can read (:func:`runtime_dir`, mode 0700, the file 0600) and removes it at stop;
``hps reload`` reads it and asks Triton to load a model again. Loading a model whose folder
has a new version switches to it (Triton's default version policy serves the highest):
Triton loads the new version while the old one serves, routes requests to the new one when
the load returns, and unloads the old one once its in-flight requests are answered; its
stubs exit and release their host-tier segments (the last user removes a segment).

Example:
    >>> info = read_control_file(8000)  # doctest: +SKIP
    >>> seconds = load_model(info.http_url, info.token, "hps_embedding")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hps_core.errors import HPSError
from hps_core.server.stub_watchdog import HEADER

LOAD_TIMEOUT_S = 600.0
"""How long a load may take: a large model reads its tables before it is ready."""

# Requests go to the server on this machine: an http_proxy in the environment must not see them
# (the token travels in a header).
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ControlError(HPSError):
    """The server cannot be reached for model control, or refused a load."""


@dataclass(frozen=True)
class ControlInfo:
    """What an operator's tool needs to control a running server.

    Args:
        pid: the ``hps serve`` process that wrote the file.
        http_url: the server's HTTP endpoint, e.g. ``http://127.0.0.1:8000``.
        token: the model-control token (a secret: never printed).
    """

    pid: int
    http_url: str
    token: str


@dataclass(frozen=True)
class VersionState:
    """One version of a model in a running server, from Triton's repository index.

    Args:
        model: the model name.
        version: the version number.
        state: Triton's state: ``READY``, ``LOADING``, ``UNLOADING``, ``UNAVAILABLE``.
        reason: why it is not ready, or empty.
    """

    model: str
    version: int
    state: str
    reason: str


def runtime_dir() -> Path:
    """The folder of this user's control files, created with mode 0700.

    ``$HPS_RUNTIME_DIR`` when set, else ``$XDG_RUNTIME_DIR/hps-triton``, else
    ``<tmp>/hps-triton-<uid>``.

    Returns:
        The folder.

    Raises:
        ControlError: it exists but belongs to another user or others may read it.
    """
    if os.environ.get("HPS_RUNTIME_DIR"):
        path = Path(os.environ["HPS_RUNTIME_DIR"])
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "hps-triton"
    else:
        path = Path(tempfile.gettempdir()) / f"hps-triton-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ControlError(
            f"{path}: the control folder must belong to you with mode 0700 (it holds model-"
            "control tokens); fix it or set HPS_RUNTIME_DIR to another folder"
        )
    return path


def control_path(http_port: int) -> Path:
    """The control file of the server whose HTTP endpoint is on ``http_port``."""
    return runtime_dir() / f"serve-{http_port}.json"


def write_control_file(http_port: int, info: ControlInfo) -> Path:
    """Write a server's control file (mode 0600, replaced atomically).

    Args:
        http_port: the server's HTTP port (names the file).
        info: what to write.

    Returns:
        The file.
    """
    path = control_path(http_port)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(info), f)
    os.replace(tmp, path)
    return path


def remove_control_file(path: Path, pid: int | None = None) -> None:
    """Remove a control file, only if it is still the one process ``pid`` wrote.

    The folder goes too once no server's file is left in it.

    Args:
        path: the file.
        pid: the writer; ``None`` removes it whoever wrote it.
    """
    with contextlib.suppress(OSError, ValueError, KeyError):
        if pid is None or json.loads(path.read_text())["pid"] == pid:
            path.unlink()
    with contextlib.suppress(OSError):  # not empty: another server's file is there
        path.parent.rmdir()


def read_control_file(http_port: int) -> ControlInfo:
    """The control information of the ``hps serve`` on this machine's ``http_port``.

    Args:
        http_port: the server's HTTP port.

    Returns:
        The information.

    Raises:
        ControlError: no such server (no file, or its writer has exited).
    """
    path = control_path(http_port)
    try:
        data = json.loads(path.read_text())
        info = ControlInfo(int(data["pid"]), str(data["http_url"]), str(data["token"]))
    except FileNotFoundError:
        raise ControlError(
            f"no hps serve with model control on HTTP port {http_port} ({path} is missing); "
            "is it running as this user, with that --http-port and without model-control "
            "options of its own?"
        ) from None
    except (OSError, ValueError, KeyError) as exc:
        raise ControlError(f"{path}: unreadable control file: {exc}") from exc
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        remove_control_file(path, info.pid)
        raise ControlError(
            f"the hps serve that wrote {path} (pid {info.pid}) has exited; removed the file"
        ) from None
    except PermissionError:
        pass
    return info


def _request(http_url: str, token: str, path: str, timeout: float) -> Any:
    request = urllib.request.Request(
        f"{http_url.rstrip('/')}{path}",
        data=b"{}",
        method="POST",
        headers={HEADER: token, "Content-Type": "application/json"},
    )
    try:
        with _NO_PROXY.open(request, timeout=timeout) as reply:
            body = reply.read()
    except urllib.error.HTTPError as exc:
        raise ControlError(f"{path}: Triton answered {exc.code}: {_triton_error(exc)}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ControlError(f"{http_url}{path} failed: {exc}") from exc
    return json.loads(body) if body else None


def _triton_error(exc: urllib.error.HTTPError) -> str:
    with contextlib.suppress(Exception):
        return str(json.loads(exc.read())["error"])
    return exc.reason or "no reason given"


def load_model(http_url: str, token: str, model: str, timeout: float = LOAD_TIMEOUT_S) -> float:
    """Ask Triton to load ``model`` again: the new versions of its folder are loaded.

    Returns when Triton's load returns: the new version serves, the old one is being
    unloaded (after its in-flight requests). A load that fails leaves the old version serving.

    Args:
        http_url: the server's HTTP endpoint.
        token: the model-control token.
        model: the model name.
        timeout: seconds to wait for the load.

    Returns:
        Seconds the load took.

    Raises:
        ControlError: Triton refused or failed the load (its message), or cannot be reached.
    """
    started = time.perf_counter()
    quoted = urllib.parse.quote(model, safe="")
    _request(http_url, token, f"/v2/repository/models/{quoted}/load", timeout)
    return time.perf_counter() - started


def repository_index(http_url: str, token: str, timeout: float = 10.0) -> list[dict[str, str]]:
    """Triton's repository index: every model of the repository, with each version it knows.

    Clients cannot read it (it belongs to the restricted model-repository API, with load and
    unload); the models that serve are open to them through the statistics API instead.

    Args:
        http_url: the server's HTTP endpoint.
        token: the model-control token.
        timeout: seconds to wait for the answer.

    Returns:
        Triton's entries: ``name``, and where Triton has them ``version``, ``state``
        (``READY``, ``UNAVAILABLE``, ...) and ``reason`` (a load error). A model whose
        config Triton could not read has its name only.

    Raises:
        ControlError: the index cannot be read.
    """
    entries = _request(http_url, token, "/v2/repository/index", timeout) or []
    return [{str(k): str(v) for k, v in entry.items()} for entry in entries]


def version_states(http_url: str, token: str, timeout: float = 10.0) -> list[VersionState]:
    """Every version Triton knows of every model, from its repository index.

    Args:
        http_url: the server's HTTP endpoint.
        token: the model-control token.
        timeout: seconds to wait for the answer.

    Returns:
        One entry per model version Triton lists (models never loaded have none).

    Raises:
        ControlError: the index cannot be read.
    """
    return [
        VersionState(e["name"], int(e["version"]), e.get("state", ""), e.get("reason", ""))
        for e in repository_index(http_url, token, timeout)
        if e.get("version", "").isdigit()
    ]
