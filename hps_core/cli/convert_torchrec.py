"""``hps convert torchrec``: the embedding tables of a TorchRec model -> HugeCTR sparse folders
and a ps.json.

TorchRec's ``EmbeddingBagCollection`` and ``EmbeddingCollection`` keep each table's weight
under ``...embedding_bags.<table>.weight`` and ``...embeddings.<table>.weight`` of the model's
state dict (a prefix such as ``sparse_arch.embedding_bag_collection.`` where the collection sits
inside a model, e.g. ``torchrec.models.dlrm.DLRM``). Each such weight becomes one table, row
``i`` under key ``i`` (TorchRec's ids are row numbers), in the state dict's order. The input is
a ``torch.save`` file of the state dict, or a ``torch.distributed.checkpoint`` folder (read on
one process, unsharded).

Example:
    hps convert torchrec --state-dict model.pt --model-name dlrm --out tables/
    hps convert torchrec --state-dict ckpt_dir/ --model-name dlrm --out tables/ \\
        --max-keys-per-table 3-1-20
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.errors import ConfigError, ModelFileError
from hps_core.export import load_checkpoint, parse_dash_list
from hps_core.formats.sparse_writer import write_sparse_table

_TABLE_WEIGHT = re.compile(r"^(?:.*\.)?(?:embedding_bags|embeddings)\.(?P<table>[^.]+)\.weight$")
"""A TorchRec collection's table weight in a state dict, and the table's name."""


def torchrec_tables(state: Mapping[str, Any], where: str) -> dict[str, np.ndarray]:
    """The embedding tables of a TorchRec state dict, by table name, in its order.

    Args:
        state: key -> tensor (CPU).
        where: the source, for messages.

    Returns:
        Table name -> float32 ``[rows, dim]``.

    Raises:
        ConfigError: no table, two collections naming one table, or a weight that is not 2-D.
    """
    tables: dict[str, np.ndarray] = {}
    for key, tensor in state.items():
        match = _TABLE_WEIGHT.match(key)
        if match is None:
            continue
        name = match["table"]
        if name in tables:
            raise ConfigError(f"table '{name}' appears twice (again as {key})", where)
        if tensor.dim() != 2:
            raise ConfigError(f"{key}: a table weight is 2-D, got {list(tensor.shape)}", where)
        tables[name] = tensor.detach().float().contiguous().numpy()
    if not tables:
        raise ConfigError(
            "holds no TorchRec table: no key ends in embedding_bags.<table>.weight or "
            "embeddings.<table>.weight",
            where,
        )
    return tables


def load_state(path: Path, allow_pickle: bool = False) -> Mapping[str, Any]:
    """The state dict of a ``torch.save`` file, or of a ``torch.distributed.checkpoint``
    folder (gathered on this process)."""
    if not path.is_dir():
        return load_checkpoint(path, allow_pickle=allow_pickle)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="hps-torchrec-") as scratch:
        saved = Path(scratch) / "state.pt"
        try:
            dcp_to_torch_save(path, saved)
        except Exception as exc:  # torch raises many kinds for a folder that is not one
            raise ModelFileError(
                f"{path}: cannot read as a torch.distributed.checkpoint folder: {exc}"
            ) from None
        return load_checkpoint(saved, allow_pickle=allow_pickle)


def run(args: argparse.Namespace) -> int:
    """Write the tables and the ps.json; print them and the next command."""
    where = str(args.state_dict)
    tables = torchrec_tables(load_state(args.state_dict, args.allow_pickle), where)
    max_keys = parse_dash_list(args.max_keys_per_table, "--max-keys-per-table")
    if len(max_keys) not in (1, len(tables)):
        raise ConfigError(
            f"give one value or one per table ({len(tables)}), got {len(max_keys)}",
            "--max-keys-per-table",
        )
    out: Path = args.out
    ps_json = out / "ps.json"
    if ps_json.exists() and not args.overwrite:
        raise ModelFileError(f"{ps_json} exists; pass --overwrite to replace it")
    sparse_files = []
    for name, weight in tables.items():
        folder = out / f"{args.model_name}_{name}.model"
        keys = np.arange(weight.shape[0], dtype=np.int64)
        write_sparse_table(folder, keys, weight, overwrite=args.overwrite, check_unique=False)
        sparse_files.append(folder.name)
        print(f"  table '{name}': {weight.shape[0]} rows x {weight.shape[1]} -> {folder}")
    model = {
        "model": args.model_name,
        "sparse_files": sparse_files,
        "embedding_table_names": list(tables),
        "embedding_vecsize_per_table": [int(w.shape[1]) for w in tables.values()],
        "maxnum_catfeature_query_per_table_per_sample": list(max_keys)
        * (len(tables) if len(max_keys) == 1 else 1),
        "default_value_for_each_table": [0.0] * len(tables),
        "deployed_device_list": [0],
        "max_batch_size": args.max_batch_size,
    }
    ps_json.write_text(json.dumps({"supportlonglong": True, "models": [model]}, indent=2) + "\n")
    print(f"wrote {ps_json}: model '{args.model_name}', {len(tables)} tables (key = row)")
    print(f"serve it with: hps repo {ps_json} REPO && hps serve --model-repository REPO")
    return 0


def register(converters: argparse._SubParsersAction) -> None:
    """Add ``hps convert torchrec``.

    Args:
        converters: the subparsers of ``hps convert``.
    """
    parser = converters.add_parser(
        "torchrec",
        help="TorchRec embedding tables -> HugeCTR sparse folders + ps.json",
        description="Write one HugeCTR sparse folder per table of a TorchRec "
        "EmbeddingBagCollection or EmbeddingCollection (state dict keys ending in "
        "embedding_bags.<table>.weight or embeddings.<table>.weight; row i under key i) and a "
        "ps.json naming them, from a torch.save state dict or a torch.distributed.checkpoint "
        "folder.",
    )
    parser.add_argument(
        "--state-dict", required=True, type=Path, metavar="FILE.pt|DIR",
        help="torch.save file of the model's state dict, or a torch.distributed.checkpoint folder",
    )  # fmt: skip
    parser.add_argument("--model-name", required=True, help="ps.json model name, folder prefix")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    parser.add_argument(
        "--max-keys-per-table", default="1", metavar="N[-N...]",
        help="most keys per sample per table, one value or one per table (default 1)",
    )  # fmt: skip
    parser.add_argument("--max-batch-size", type=int, default=64, help="ps.json max_batch_size")
    parser.add_argument(
        "--allow-pickle", action="store_true",
        help="load a file holding more than tensors (runs its code: trusted files only)",
    )  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="replace existing files")
    parser.set_defaults(func=run)
