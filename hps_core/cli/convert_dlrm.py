"""``hps convert dlrm``: a PyTorch DLRM (facebookresearch/dlrm ``DLRM_Net``) -> HugeCTR files.

The ``--arch-*`` flags have dlrm's names and meanings (``dlrm_s_pytorch.py``):
``--arch-mlp-top`` leaves out the interaction width, which is computed. Each flag that is
given is checked against the state dict; one that is left out is read off the tensor shapes.

Example:
    hps convert dlrm --state-dict dlrm.pt --arch-sparse-feature-size 16 \\
        --arch-embedding-size 1000-500-20 --arch-mlp-bot 13-64-16 --arch-mlp-top 64-32-1 \\
        --model-name dlrm --out model/
    hps repo model/ps.json repo/
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from hps_core.errors import ConfigError, ModelFileError
from hps_core.export import (
    DlrmArch,
    check_dlrm_state,
    infer_dlrm_arch,
    load_checkpoint,
    parse_dash_list,
    write_dlrm_model,
)
from hps_core.export.dlrm_arch import (
    EMBEDDING_SIZE_FLAG,
    MLP_BOT_FLAG,
    MLP_TOP_FLAG,
    SPARSE_FEATURE_SIZE_FLAG,
)


def _key_map_flag(text: str) -> tuple[int, Path]:
    table, sep, path = text.partition("=")
    if not sep or not table.isdigit() or not path:
        raise argparse.ArgumentTypeError(f"must be TABLE=FILE.npy, e.g. 3=keys3.npy; got {text!r}")
    return int(table), Path(path)


def _load_key_maps(flags: list[tuple[int, Path]]) -> dict[int, np.ndarray]:
    tables = [table for table, _ in flags]
    repeated = sorted({t for t in tables if tables.count(t) > 1})
    if repeated:
        raise ConfigError(f"table {repeated[0]} is given twice", "--key-map")
    maps: dict[int, np.ndarray] = {}
    for table, path in flags:
        try:
            maps[table] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ModelFileError(
                f"{path}: cannot read the key map of table {table}: {exc}"
            ) from None
    return maps


def _arch(args: argparse.Namespace, state: object, where: str) -> DlrmArch:
    given = (args.sparse_feature_size, args.embedding_size, args.mlp_bot, args.mlp_top)
    if all(value is not None for value in given):
        return DlrmArch.from_flags(*given)
    inferred = infer_dlrm_arch(state, where)
    return DlrmArch(
        sparse_feature_size=(
            inferred.sparse_feature_size
            if args.sparse_feature_size is None
            else args.sparse_feature_size
        ),
        embedding_sizes=_flag_or(
            args.embedding_size, EMBEDDING_SIZE_FLAG, inferred.embedding_sizes
        ),
        bottom_mlp=_flag_or(args.mlp_bot, MLP_BOT_FLAG, inferred.bottom_mlp),
        top_mlp=_flag_or(args.mlp_top, MLP_TOP_FLAG, inferred.top_mlp),
    )


def _flag_or(text: str | None, flag: str, inferred: tuple[int, ...]) -> tuple[int, ...]:
    return inferred if text is None else parse_dash_list(text, flag)


def run(args: argparse.Namespace) -> int:
    """Export the model; print the files written and the next command."""
    if args.arch_interaction_itself:
        raise ConfigError(
            "HugeCTR's Interaction layer leaves out self-interaction (the diagonal); "
            "only models trained without --arch-interaction-itself can be exported",
            "--arch-interaction-itself",
        )
    key_maps = _load_key_maps(args.key_map)
    where = str(args.state_dict)
    state = load_checkpoint(args.state_dict, allow_pickle=args.allow_pickle)
    arch = _arch(args, state, where)
    max_keys = parse_dash_list(args.max_keys_per_table, "--max-keys-per-table")
    checked = check_dlrm_state(state, arch, where)
    files = write_dlrm_model(
        args.out,
        args.model_name,
        arch,
        checked.dense,
        checked.table_sources(),
        key_maps=key_maps,
        max_keys_per_table=max_keys[0] if len(max_keys) == 1 else max_keys,
        max_batch_size=args.max_batch_size,
        overwrite=args.overwrite,
    )
    print(f"model '{args.model_name}': {arch.flags()}")
    for t, (path, rows) in enumerate(zip(files.sparse_files, files.table_rows, strict=True)):
        keys = "keys from --key-map" if t in key_maps else "key = row"
        print(f"  table {t}: {rows} rows x {arch.sparse_feature_size} ({keys}) -> {path}")
    print(f"  dense: {files.dense_floats} floats -> {files.dense_file}")
    print(f"  network: {files.network_file}")
    print(f"wrote {files.ps_json} ({files.total_bytes} bytes in all)")
    print(f"serve it with: hps repo {files.ps_json} REPO && hps serve --model-repository REPO")
    return 0


def register(converters: argparse._SubParsersAction) -> None:
    """Add ``hps convert dlrm``.

    Args:
        converters: the subparsers of ``hps convert``.
    """
    parser = converters.add_parser(
        "dlrm",
        help="PyTorch DLRM (facebookresearch/dlrm) -> HugeCTR files + ps.json",
        description="Write HugeCTR sparse folders (one per emb_l table), the dense model, the "
        "network JSON and a ps.json from a DLRM_Net state dict saved with torch.save (or "
        "dlrm_s_pytorch.py --save-model). Table t becomes sparse_files[t] and embedding "
        "layer sparse_embedding{t}.",
    )
    parser.add_argument(
        "--state-dict", required=True, type=Path, metavar="FILE.pt", help="torch.save file"
    )
    parser.add_argument("--model-name", required=True, help="ps.json model name, file prefix")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    arch = parser.add_argument_group(
        "architecture (dlrm's flags; each one left out is read off the state dict)"
    )
    arch.add_argument(SPARSE_FEATURE_SIZE_FLAG, dest="sparse_feature_size", type=int)
    arch.add_argument(EMBEDDING_SIZE_FLAG, dest="embedding_size", help="rows per table: 1000-500")
    arch.add_argument(MLP_BOT_FLAG, dest="mlp_bot", help="bottom MLP, dense width first: 13-64-16")
    arch.add_argument(
        MLP_TOP_FLAG, dest="mlp_top", help="top MLP without the interaction width: 64-32-1"
    )
    arch.add_argument(
        "--arch-interaction-op",
        choices=("dot",),
        default="dot",
        help="only dot: HugeCTR's Interaction layer",
    )
    arch.add_argument(
        "--arch-interaction-itself", action="store_true", help="not supported by HugeCTR"
    )
    parser.add_argument(
        "--key-map",
        action="append",
        default=[],
        type=_key_map_flag,
        metavar="TABLE=FILE.npy",
        help="keys of table TABLE's rows: element i of the 1-D integer array is row i's key "
        "(repeatable; tables without one get key i for row i)",
    )
    parser.add_argument(
        "--max-keys-per-table",
        default="1",
        metavar="N[-N...]",
        help="most keys per sample per table, one value or one per table (default 1: one-hot)",
    )
    parser.add_argument("--max-batch-size", type=int, default=64, help="ps.json max_batch_size")
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="load FILE.pt with weights_only=False (runs code in it: trusted files only)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace existing files in DIR")
    parser.set_defaults(func=run)
