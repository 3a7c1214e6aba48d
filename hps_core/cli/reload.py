"""``hps reload MODEL...``: load models of a running ``hps serve`` again, from their files.

Reads the server's control file (:mod:`hps_core.server.control`, written by ``hps serve`` for
this user only) and asks Triton to load each model again, with the config.pbtxt of its folder
(:func:`~hps_core.server.control.reload_model`: Triton would skip a plain load of a folder
that did not change, whatever happened to the files its ps.json names elsewhere). Triton loads
the newest version of the model folder while the old instances keep serving, switches
requests when the load returns and unloads the old instances after their in-flight requests.
The new instances read again every table whose files changed (size, modification time or
inode) and attach to the host-tier copy of the others. This command then waits until older
versions are unloaded (their stubs have exited and released their host-tier segments).

Example:
    hps repo retrained/ps.json model_repository --version 2
    hps reload hps_embedding
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hps_core.errors import ConfigError
from hps_core.hugectr_watch import wait_for_scan
from hps_core.load_record import load_marker
from hps_core.server.control import (
    ControlError,
    folder_config,
    read_control_file,
    reload_model,
    repository_index,
    version_states,
)

_POLL_S = 0.2
_SCAN_WAIT_S = 10.0


def add_http_port(parser: argparse.ArgumentParser) -> None:
    """``--http-port``: which running ``hps serve`` on this machine to reach (its control
    file is named by it); shared by the operator commands."""
    parser.add_argument(
        "--http-port",
        type=int,
        default=8000,
        metavar="PORT",
        help="HTTP port of the hps serve to reach (default %(default)s)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps reload`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "reload",
        help="load models of a running hps serve again (their newest version, files re-read)",
        description="Load models of a running `hps serve` on this machine again, without "
        "failing requests: the newest version in their folders, with their config.pbtxt, "
        "reading again the tables whose files changed; the old instances serve until the new "
        "ones are loaded. Only the user who runs `hps serve` can do this.",
    )
    parser.add_argument("models", nargs="+", metavar="MODEL", help="Triton model names")
    add_http_port(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="give up waiting for a load, or for an old version to unload (default %(default)s)",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="return when the new version serves, not when the old one is unloaded",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load each model again; report the load time and the versions serving.

    Args:
        args: parsed ``hps reload`` arguments.

    Returns:
        0 when every model loaded (and its old versions unloaded unless ``--no-wait``), 1
        otherwise.
    """
    started = time.time()
    try:
        info = read_control_file(args.http_port)
    except ControlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if info.repository is None:
        print(
            "error: the control file of this hps serve names no model repository (an hps "
            "serve older than this command wrote it); restart hps serve",
            file=sys.stderr,
        )
        return 1
    if info.translation is not None and not wait_for_scan(
        Path(info.translation), started, _SCAN_WAIT_S
    ):
        # A HugeCTR repository: its translation follows the user's edits; load what it
        # holds after a scan that saw them, or say the scan did not come.
        print(f"warning: the served HugeCTR repository was not rescanned within "
              f"{_SCAN_WAIT_S:g} s (are its files still being written?); loading what its "
              "translation holds", file=sys.stderr)  # fmt: skip
    code = 0
    try:
        served = {entry["name"] for entry in repository_index(info.http_url, info.token)}
    except ControlError:
        served = None  # the load below says what is wrong with the server
    for model in args.models:
        if served is not None and model not in served:
            print(f"error: model '{model}' is not in the served repository; it has: "
                  f"{', '.join(sorted(served)) or 'no model'}", file=sys.stderr)  # fmt: skip
            code = 1
            continue
        try:
            config = folder_config(Path(info.repository), model)
            seconds = reload_model(
                info.http_url, info.token, model, load_marker(), timeout=args.timeout,
                config=config,
            )  # fmt: skip
        except (ControlError, ConfigError) as exc:
            print(f"error: model '{model}': load failed, the serving version stays: {exc}",
                  file=sys.stderr)  # fmt: skip
            code = 1
            continue
        serving = _versions(info.http_url, info.token, model, "READY")
        print(f"model '{model}': loaded in {seconds:.2f} s; serving version {_listed(serving)}")
        if args.no_wait:
            continue
        left = _wait_unloaded(info.http_url, info.token, model, max(serving, default=0), args)
        if left:
            print(f"error: model '{model}': version {_listed(left)} still not unloaded after "
                  f"{args.timeout:g} s", file=sys.stderr)  # fmt: skip
            code = 1
        else:
            print(f"model '{model}': older versions unloaded")
    return code


def _versions(http_url: str, token: str, model: str, *states: str) -> list[int]:
    try:
        entries = version_states(http_url, token)
    except ControlError:
        return []
    return sorted(e.version for e in entries if e.model == model and e.state in states)


def _wait_unloaded(
    http_url: str, token: str, model: str, newest: int, args: argparse.Namespace
) -> list[int]:
    """Wait until no version below ``newest`` is READY or UNLOADING; return those left."""
    deadline = time.monotonic() + args.timeout
    while True:
        left = [v for v in _versions(http_url, token, model, "READY", "UNLOADING") if v < newest]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(_POLL_S)


def _listed(versions: list[int]) -> str:
    return ", ".join(map(str, versions)) or "none"
