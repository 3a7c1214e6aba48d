"""``hps models``: the models of a running ``hps serve``, each version with its state.

``hps serve`` keeps Triton's model-repository API (index, load and unload: Triton 2.51 cannot
restrict them apart) to its operator, so a client's ``get_model_repository_index()`` is
refused. This command reads the server's control file (:mod:`hps_core.server.control`, this
user's only) and lists the index: every model of the repository, the ones that failed to load
with Triton's reason. Clients see the models that serve through the statistics API instead
(``GET /v2/models/stats``, tritonclient's ``get_inference_statistics()``), open to them.

Example:
    $ hps models
    dcn            1  READY
    hps_embedding  1  READY
    wdl            1  UNAVAILABLE: Internal: ModuleNotFoundError: No module named 'nothere'
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from hps_core.cli.reload import add_http_port
from hps_core.server.control import (
    ControlError,
    read_control_file,
    repository_index,
    without_frames,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps models`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "models",
        help="list the models of a running hps serve and their states",
        description="List every model of a running `hps serve` on this machine, each version "
        "with Triton's state and, for a model that failed to load, its reason. Only the user "
        "who runs `hps serve` can do this; clients list the models that serve through "
        "Triton's statistics API (GET /v2/models/stats, get_inference_statistics()).",
    )
    add_http_port(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print one line per model version of the server's repository index.

    Args:
        args: parsed ``hps models`` arguments.

    Returns:
        0 when the index was read (whatever the models' states), 1 otherwise.
    """
    try:
        info = read_control_file(args.http_port)
        entries = repository_index(info.http_url, info.token)
    except ControlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in format_index(entries):
        print(line)
    return 0


def format_index(entries: Sequence[Mapping[str, str]]) -> list[str]:
    """One aligned line per entry of Triton's repository index, sorted by model and version.

    Args:
        entries: as :func:`~hps_core.server.control.repository_index` returns them.

    Returns:
        ``<model>  <version>  <state>[: <reason>]``, the reason on one line, without
        the Python backend's stack frames;
        ``-`` for a model without a version (Triton could not read its config: the reason is
        in the server's log).
    """
    rows = []
    for entry in entries:
        version = entry.get("version") or "-"
        state = entry.get("state") or "not loaded"
        reason = " ".join(without_frames(entry.get("reason", "")).split())
        rows.append((entry["name"], version, f"{state}: {reason}" if reason else state))
    rows.sort(key=lambda row: (row[0], int(row[1]) if row[1].isdigit() else -1))
    name_width = max((len(row[0]) for row in rows), default=0)
    version_width = max((len(row[1]) for row in rows), default=0)
    return [
        f"{name.ljust(name_width)}  {version.rjust(version_width)}  {state}"
        for name, version, state in rows
    ]
