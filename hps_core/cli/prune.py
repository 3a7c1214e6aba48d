"""``hps prune PS_JSON``: remove the copies of a ps.json's tables its servers no longer read.

After a table's ``storage`` or a database's ``store_compressed`` changes, the Redis cluster and
RocksDB keep the table under its old name too (servers still running the old setting read it;
servers name such a copy in a warning when they open the table). Once no server reads them,
this command removes them (:mod:`hps_core.tiers.unread_copies`).

Example:
    hps prune model_repository/dlrm/ps.json --dry-run
    hps prune model_repository/dlrm/ps.json
"""

from __future__ import annotations

import argparse

from hps_core.config import load_ps_config
from hps_core.tiers.unread_copies import find_unread_copies, remove_copies
from hps_core.wording import plural


def _prune(args: argparse.Namespace) -> int:
    config = load_ps_config(args.ps_json)
    if args.model is not None:
        config.model(args.model)  # an unknown model is refused, with the ps.json's names
    copies = find_unread_copies(config, args.model)
    verb = "would remove" if args.dry_run else "removing"
    for copy in copies:
        rows = "" if copy.rows is None else f", {plural(copy.rows, 'row')}"
        print(f"{verb} {copy.database} table '{copy.name}'{rows} (read: '{copy.read}')")
    if not args.dry_run:
        remove_copies(config, copies)
    done = "found" if args.dry_run else "removed"
    print(f"{len(copies)} unread {'copy' if len(copies) == 1 else 'copies'} {done}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps prune`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "prune",
        help="remove copies of the tables that the ps.json's servers no longer read",
        description="Remove from the ps.json's Redis cluster (volatile_db) and RocksDB "
        "(persistent_db) the copies of its tables stored under another storage or "
        "store_compressed setting than the ps.json's, with their load markers. Run it once no "
        "server with the old setting runs: such a server reads them.",
    )
    parser.add_argument("ps_json", help="path of the ps.json")
    parser.add_argument("--model", help="only this model's tables")
    parser.add_argument(
        "--dry-run", action="store_true", help="list the copies without removing them"
    )
    parser.set_defaults(func=_prune)
