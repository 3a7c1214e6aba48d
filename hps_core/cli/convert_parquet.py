"""``hps convert parquet-to-hugectr`` and ``hps convert hugectr-to-parquet``.

Example:
    hps convert parquet-to-hugectr emb.parquet model/0_sparse_model --dim 16
    hps convert hugectr-to-parquet model/0_sparse_model emb.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hps_core.cli.arguments import positive_int
from hps_core.formats.parquet import parquet_to_sparse_table, sparse_table_to_parquet


def _parquet_to_hugectr(args: argparse.Namespace) -> int:
    info = parquet_to_sparse_table(
        args.parquet,
        args.out_dir,
        key_column=args.key_column,
        vector_column=args.vector_column,
        dim=args.dim,
        overwrite=args.overwrite,
    )
    print(
        f"wrote {info.rows} rows x dim {info.dim} to {info.path} "
        f"({info.total_bytes} bytes: key {info.key_bytes}, emb_vector {info.vector_bytes})"
    )
    return 0


def _hugectr_to_parquet(args: argparse.Namespace) -> int:
    info = sparse_table_to_parquet(
        args.table_dir,
        args.out,
        dim=args.dim,
        key_column=args.key_column,
        vector_column=args.vector_column,
        overwrite=args.overwrite,
    )
    print(
        f"wrote {info.rows} rows x dim {info.dim} from {info.path} "
        f"({info.total_bytes} bytes) to {args.out} ({args.out.stat().st_size} bytes)"
    )
    return 0


def register(converters: argparse._SubParsersAction) -> None:
    """Add the Parquet converters to ``hps convert``.

    Args:
        converters: the subparsers of ``hps convert``.
    """
    to_hugectr = converters.add_parser(
        "parquet-to-hugectr",
        help="Parquet table -> HugeCTR sparse model folder (key + emb_vector)",
        description="Convert a Parquet file, or a folder of part files, with an integer key "
        "column and a list-of-floats vector column into a HugeCTR sparse model folder.",
    )
    to_hugectr.add_argument(
        "parquet", metavar="PARQUET", help="Parquet file or folder (a path, or s3:// / hdfs:// URI)"
    )
    to_hugectr.add_argument("out_dir", metavar="OUT_DIR", help="sparse model folder to write")
    to_hugectr.add_argument("--key-column", default="key", help="key column (default: key)")
    to_hugectr.add_argument(
        "--vector-column", default="vector", help="vector column (default: vector)"
    )
    to_hugectr.add_argument(
        "--dim", type=positive_int, help="floats per vector (default: from the data)"
    )
    to_hugectr.add_argument(
        "--overwrite", action="store_true", help="replace a table already in OUT_DIR"
    )
    to_hugectr.set_defaults(func=_parquet_to_hugectr)

    to_parquet = converters.add_parser(
        "hugectr-to-parquet",
        help="HugeCTR sparse model folder -> Parquet file",
        description="Convert a HugeCTR sparse model folder into one Parquet file with an "
        "int64 key column and a fixed_size_list<float32> vector column.",
    )
    to_parquet.add_argument(
        "table_dir",
        metavar="TABLE_DIR",
        help="sparse model folder (a path, or s3:// / hdfs:// URI)",
    )
    to_parquet.add_argument("out", metavar="OUT.parquet", type=Path, help="file to write")
    to_parquet.add_argument(
        "--dim", type=positive_int, help="floats per vector (default: from the file sizes)"
    )
    to_parquet.add_argument("--key-column", default="key", help="key column (default: key)")
    to_parquet.add_argument(
        "--vector-column", default="vector", help="vector column (default: vector)"
    )
    to_parquet.add_argument("--overwrite", action="store_true", help="replace OUT.parquet")
    to_parquet.set_defaults(func=_hugectr_to_parquet)
