"""``hps prepare [REPO]``: write the default models' files where they are missing, and
labelled Parquet samples of the ranking models (``--sample-data DIR``).

A model's files that are there already and differ from the default (a config.pbtxt or ps.json
the user edited) are kept, each named; the tables' data is written only where it is missing
or does not hold the default rows."""

from __future__ import annotations

import argparse
from pathlib import Path

from hps_core.cli.arguments import positive_int
from hps_core.demo import DEMO_MODELS, ZOO_MODELS
from hps_core.infer import is_ranking_model
from hps_core.wording import plural


def run(args: argparse.Namespace) -> int:
    """Write every demo model into the repository (data only where missing), then a sample
    dataset of each ranking model when asked."""
    repo = Path(args.repository)
    writers = {**DEMO_MODELS, **ZOO_MODELS}
    names = args.models or [*DEMO_MODELS, *(ZOO_MODELS if args.zoo else ())]
    folders = {}
    for name in names:
        edited = _edited_files(repo, name)
        folders[name] = writers[name](repo)
        for path, content in edited.items():
            if path.read_bytes() != content:
                path.write_bytes(content)
                print(f"kept {path}: it differs from the default (remove it and run hps "
                      "prepare again to write the default)")  # fmt: skip
        print(f"ready: {folders[name]}")
    if args.sample_data is not None:
        from hps_core.config import load_ps_config
        from hps_core.demo.sample_data import write_sample_dataset

        for name, folder in folders.items():
            if not is_ranking_model(load_ps_config(folder / "ps.json").model(name)):
                continue  # an embedding table alone scores nothing
            out = args.sample_data / f"{name}.parquet"
            if out.exists():  # as the model files: what is there is kept
                print(f"kept {out}: it exists (remove it to write new sample data)")
                continue
            write_sample_dataset(folder / "ps.json", name, out, rows=args.sample_rows)
            print(f"sample data: {out} ({plural(args.sample_rows, 'labelled sample')})")
    return 0


_LARGEST_EDITED = 1 << 20
"""Bytes of the largest file :func:`_edited_files` keeps (configs, ps.json, model.py)."""


def _edited_files(repo: Path, name: str) -> dict[Path, bytes]:
    """The files of model ``name``'s Triton folders that exist, but its tables' data."""
    found = {}
    for folder in (repo / name, repo / f"{name}_samples"):
        for path in folder.rglob("*") if folder.is_dir() else ():
            parts = path.relative_to(folder).parts
            if "data" in parts or "__pycache__" in parts or not path.is_file():
                continue
            if path.stat().st_size <= _LARGEST_EDITED:
                found[path] = path.read_bytes()
    return found


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps prepare`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "prepare",
        help="write the default model repository's files where they are missing (files you "
        "changed are kept)",
    )
    parser.add_argument(
        "repository",
        nargs="?",
        default="model_repository",
        help="the model repository folder (default: model_repository)",
    )
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
        "--sample-rows",
        type=positive_int,
        default=10000,
        metavar="N",
        help="samples per file (10,000)",
    )
    parser.set_defaults(func=run)
