"""Model control of a running server for its operator, and for nobody else.

``hps serve`` runs Triton with the model-repository API restricted to requests that carry a
token drawn at start (:func:`control_args`), so clients cannot
load or unload models. The operator's tools reach it through a *control file*: ``hps serve``
writes the server's HTTP address and token to ``serve-<http port>.json`` in a folder only
this user can read (:func:`runtime_dir`, mode 0700, the file 0600) and removes it at stop;
``hps reload`` reads it and asks Triton to load a model again, with its folder's config.pbtxt
marked so that Triton loads it even when the folder did not change (:func:`reload_model`: the
files a ps.json names elsewhere may have). Loading a model whose folder has a new version
switches to it (Triton's default version policy serves the highest):
Triton loads the new version while the old one serves, routes requests to the new one when
the load returns, and unloads the old one once its in-flight requests are answered; its
stubs exit and release their host-tier segments (the last user removes a segment).

Example:
    >>> info = read_control_file(8000)  # doctest: +SKIP
    >>> config = folder_config(Path(info.repository), "hps_embedding")  # doctest: +SKIP
    >>> seconds = reload_model(info.http_url, info.token, "hps_embedding", load_marker(),
    ...                        config=config)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hps_core.errors import ConfigError, HPSError, Problem
from hps_core.load_record import RELOAD_PARAMETER

# Triton's refusal of a request without the header names the header and nothing else ("This
# API is restricted, expecting header '<name>'"; gRPC prefixes triton-grpc-protocol-), and it
# refuses a client's repository index as well as load and unload (one restricted category). So
# the name tells a client who meets it that the API is not theirs and where the list of served
# models is: the statistics API (GET /v2/models/stats, get_inference_statistics()). Lowercase
# letters and hyphens only: valid as an HTTP header and as gRPC metadata, kept by proxies.
HEADER = "hps-operator-only-to-list-models-use-model-statistics"
"""Header that must carry the token for Triton's model-repository API."""

CONTROL_OPTIONS = (
    "--model-control-mode",
    "--load-model",
    "--http-restricted-api",
    "--grpc-restricted-protocol",
)
"""tritonserver options :func:`control_args` sets; a server given them must not get them
elsewhere."""

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
        translation: the folder of the translation a HugeCTR repository is served through
            (:mod:`hps_core.hugectr_watch`), or None.
        repository: the model repository the server serves (the translation's folder for a
            HugeCTR repository), where ``hps reload`` reads each model's config.pbtxt; None in
            a file written before the field existed.
    """

    pid: int
    http_url: str
    token: str
    translation: str | None = None
    repository: str | None = None


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
        translation, repository = data.get("translation"), data.get("repository")
        info = ControlInfo(
            int(data["pid"]),
            str(data["http_url"]),
            str(data["token"]),
            None if translation is None else str(translation),
            None if repository is None else str(repository),
        )
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


def _request(
    http_url: str,
    token: str,
    path: str,
    timeout: float,
    body: dict[str, Any] | None = None,
    method: str = "POST",
) -> Any:
    """Send ``body`` (POST: an empty object by default; GET: none) to ``path`` with the
    token; its JSON answer."""
    request = urllib.request.Request(
        f"{http_url.rstrip('/')}{path}",
        data=json.dumps(body or {}).encode() if method == "POST" else None,
        method=method,
        headers={HEADER: token, "Content-Type": "application/json"},
    )
    try:
        with _NO_PROXY.open(request, timeout=timeout) as reply:
            answer = reply.read()
    except urllib.error.HTTPError as exc:
        raise ControlError(f"{path}: Triton answered {exc.code}: {_triton_error(exc)}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ControlError(f"{http_url}{path} failed: {exc}") from exc
    try:
        return json.loads(answer) if answer else None
    except ValueError as exc:
        raise ControlError(f"{http_url}{path}: not a JSON answer ({exc})") from exc


def _triton_error(exc: urllib.error.HTTPError) -> str:
    with contextlib.suppress(Exception):
        return without_frames(str(json.loads(exc.read())["error"]))
    return exc.reason or "no reason given"


def without_frames(reason: str) -> str:
    """Triton's reason for a Python model's failure without the stack frames its Python backend
    appends (an empty line, ``At:``, a line per frame): the message a user acts on.

    Example:
        >>> without_frames("Internal: ConfigError: bad dim\\n\\nAt:\\n  /x/m.py(49): initialize")
        'Internal: ConfigError: bad dim'
    """
    return re.split(r"\n[ \t]*\nAt:\n", reason, maxsplit=1)[0].strip()


def server_ready(http_url: str, timeout: float = 5.0) -> bool:
    """Whether the server answers ready (not starting, not shutting down).

    Args:
        http_url: the server's HTTP endpoint.
        timeout: seconds to wait for the answer.
    """
    try:
        with _NO_PROXY.open(f"{http_url.rstrip('/')}/v2/health/ready", timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def new_token() -> str:
    """A fresh model-control token (never logged)."""
    return secrets.token_hex(16)


def control_args(token: str) -> list[str]:
    """tritonserver options: every model loaded at start, model control only with ``token``."""
    restricted = f"model-repository:{HEADER}={token}"
    return [
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--http-restricted-api={restricted}",
        f"--grpc-restricted-protocol={restricted}",
    ]


def load_model(
    http_url: str,
    token: str,
    model: str,
    timeout: float = LOAD_TIMEOUT_S,
    config: dict[str, Any] | None = None,
) -> float:
    """Ask Triton to load ``model`` again: the new versions of its folder are loaded.

    Returns when Triton's load returns: the new version serves, the old one is being
    unloaded (after its in-flight requests). A load that fails leaves the old version serving.

    Args:
        http_url: the server's HTTP endpoint.
        token: the model-control token.
        model: the model name.
        timeout: seconds to wait for the load.
        config: load with this model config (Triton's JSON form) instead of the folder's
            config.pbtxt.

    Returns:
        Seconds the load took.

    Raises:
        ControlError: Triton refused or failed the load (its message), or cannot be reached.
    """
    started = time.perf_counter()
    body = None if config is None else {"parameters": {"config": json.dumps(config)}}
    _request(http_url, token, f"/v2/repository/models/{_quoted(model)}/load", timeout, body)
    return time.perf_counter() - started


def unload_model(http_url: str, token: str, model: str, timeout: float = 10.0) -> None:
    """Ask Triton to unload ``model`` (every version it serves). Triton unloads in the
    background: the index shows each version ``UNAVAILABLE`` once its instances are ended
    (:func:`version_states`).

    Args:
        http_url: the server's HTTP endpoint.
        token: the model-control token.
        model: the model name.
        timeout: seconds to wait for Triton to take the request.

    Raises:
        ControlError: Triton refused the request, or cannot be reached.
    """
    _request(http_url, token, f"/v2/repository/models/{_quoted(model)}/unload", timeout)


def _quoted(model: str) -> str:
    return urllib.parse.quote(model, safe="")


def reload_model(
    http_url: str,
    token: str,
    model: str,
    marker: str,
    versions: Sequence[int] = (),
    timeout: float = LOAD_TIMEOUT_S,
    config: dict[str, Any] | None = None,
) -> float:
    """Load ``model`` again, new instances in place of the old ones, even when nothing changed
    in its folder.

    Triton 2.51 skips the load of a model whose folder and config are as it loaded them, so
    :func:`load_model` of such a model does nothing, however its files outside that folder
    (sparse, dense and network files a ps.json names) changed. This load hands Triton the
    config with the parameter :data:`~hps_core.load_record.RELOAD_PARAMETER` set to
    ``marker``: a config Triton has not loaded. The new instances open their tables by the
    files' identity: files that changed are read again, unchanged ones attach to the host-tier
    copy the old instances hold.

    Args:
        http_url: the server's HTTP endpoint.
        token: the model-control token.
        model: the model name.
        marker: :func:`~hps_core.load_record.restart_marker` or
            :func:`~hps_core.load_record.load_marker`; a value other than that of the model's
            previous reload.
        versions: load exactly these versions (those that served), not the folder's newest
            (a version added since, not yet switched to, may be broken); empty: the config's
            own version policy.
        timeout: seconds to wait for the load.
        config: the config to load (Triton's JSON form, e.g. the folder's config.pbtxt, so
            that an edit of it is served); ``None``: the config the model is loaded with.

    Returns:
        Seconds the load took.

    Raises:
        ControlError: Triton refused or failed the load (its message), or cannot be reached.
    """
    started = time.perf_counter()
    if config is None:
        config = _request(http_url, token, f"/v2/models/{_quoted(model)}/config", 10, method="GET")
    config = {**config, "name": model}
    config["parameters"] = {
        **config.get("parameters", {}),
        RELOAD_PARAMETER: {"string_value": marker},
    }
    if versions:
        config["version_policy"] = {"specific": {"versions": [int(v) for v in versions]}}
    load_model(http_url, token, model, timeout, config)
    return time.perf_counter() - started


def folder_config(repository: Path, model: str) -> dict[str, Any]:
    """A model's config.pbtxt, in the JSON form Triton loads (:func:`reload_model`'s
    ``config``), so that a load from it serves what the folder says.

    Args:
        repository: the model repository.
        model: the model name (its folder).

    Returns:
        The config; empty when the folder has no config.pbtxt (Triton completes it, as it
        does that of a folder without one).

    Raises:
        ConfigError: the config.pbtxt is not a Triton model configuration (naming the line).
    """
    # Imported here: the models import this module (for the reload markers), and the gRPC
    # client library would add its weight to every stub process.
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    path = Path(repository) / model / "config.pbtxt"
    if not path.is_file():
        return {}
    try:
        message = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigError([Problem(str(path), f"not a Triton model configuration: {exc}")]) from exc
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


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
