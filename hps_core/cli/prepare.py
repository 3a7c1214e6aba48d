"""``hps prepare [REPO]``: write the default models' files where they are missing."""

from __future__ import annotations

import argparse
from pathlib import Path

from hps_core.demo import DEMO_MODELS, ZOO_MODELS


def run(args: argparse.Namespace) -> int:
    """Write every demo model into the repository (data only where missing)."""
    repo = Path(args.repository)
    writers = {**DEMO_MODELS, **ZOO_MODELS}
    names = args.models or [*DEMO_MODELS, *(ZOO_MODELS if args.zoo else ())]
    for name in names:
        folder = writers[name](repo)
        print(f"ready: {folder}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps prepare`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "prepare", help="generate the default model repository's files if missing"
    )
    parser.add_argument("repository", nargs="?", default="model_repository")
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        choices=sorted({**DEMO_MODELS, **ZOO_MODELS}),
        help="only these",
    )
    parser.add_argument(
        "--zoo",
        action="store_true",
        help="also one model of each other HugeCTR sample family: "
        + ", ".join(ZOO_MODELS)
        + " (DLRM with MLP layers, DIN, BST, MMoE, NCF, shared-bottom multi-task, MLPerf's "
        "DLRM-v2 with DCNv2 and multi-hot tables)",
    )
    parser.set_defaults(func=run)
