"""``hps prepare [REPO]``: write the default models' files where they are missing, and
labelled Parquet samples of the ranking models (``--sample-data DIR``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hps_core.demo import DEMO_MODELS, ZOO_MODELS
from hps_core.infer import is_ranking_model


def run(args: argparse.Namespace) -> int:
    """Write every demo model into the repository (data only where missing), then a sample
    dataset of each ranking model when asked."""
    repo = Path(args.repository)
    writers = {**DEMO_MODELS, **ZOO_MODELS}
    names = args.models or [*DEMO_MODELS, *(ZOO_MODELS if args.zoo else ())]
    folders = {}
    for name in names:
        folders[name] = writers[name](repo)
        print(f"ready: {folders[name]}")
    if args.sample_data is not None:
        from hps_core.config import load_ps_config
        from hps_core.demo.sample_data import write_sample_dataset

        for name, folder in folders.items():
            if not is_ranking_model(load_ps_config(folder / "ps.json").model(name)):
                continue  # an embedding table alone scores nothing
            out = args.sample_data / f"{name}.parquet"
            write_sample_dataset(folder / "ps.json", name, out, rows=args.sample_rows)
            print(f"sample data: {out} ({args.sample_rows:,} labelled samples)")
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
    parser.add_argument(
        "--sample-data",
        type=Path,
        metavar="DIR",
        help="also write DIR/<model>.parquet for each ranking model: labelled samples in "
        "Criteo's column names (label, I1..., C1...), labels drawn from the model's own "
        "scores, for hps predict",
    )
    parser.add_argument(
        "--sample-rows", type=int, default=10000, metavar="N", help="samples per file"
    )
    parser.set_defaults(func=run)
