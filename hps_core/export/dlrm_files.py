"""Write a DLRM as HugeCTR files: sparse folders, dense model, network JSON and ps.json.

The same writer serves the PyTorch exporter (tables already in memory) and the large-model
generator (tables produced chunk by chunk), so a table is given as a function returning its
rows ``[start, stop)``; no table is ever copied whole. File names follow HugeCTR's
``save_params_to_files(prefix)`` and ``graph_to_json``::

    OUT/NAME.json                  network (graph form)
    OUT/NAME_dense_0.model         dense parameters
    OUT/NAME{t}_sparse_0.model/    table t: key + emb_vector
    OUT/ps.json                    names the files above, relative to OUT

ps.json is written last, so a folder with a ps.json holds a complete model. Existing files
are refused (all of them listed) unless ``overwrite`` is set.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.errors import OVERWRITE_HINT, ConfigError, ModelFileError, Problem
from hps_core.export.dlrm_arch import DlrmArch
from hps_core.export.dlrm_network import dlrm_network_json, hugectr_dense_params
from hps_core.formats.keys import check_unique_keys
from hps_core.formats.sparse import DEFAULT_CHUNK_BYTES, KEY_DTYPE, KEY_FILE, VECTOR_FILE
from hps_core.formats.sparse_writer import SparseTableWriter
from hps_core.nn import DenseLayout, DenseParams, build_graph, parse_network_json, write_dense_blob

logger = logging.getLogger(__name__)

PS_JSON = "ps.json"

#: Rows ``[start, stop)`` of one table as float32 ``[stop - start, dim]``.
TableSource = Callable[[int, int], np.ndarray]


@dataclass(frozen=True)
class DlrmFiles:
    """What :func:`write_dlrm_model` wrote.

    Args:
        ps_json: the ps.json.
        network_file: the network JSON.
        dense_file: the dense model file.
        sparse_files: one sparse model folder per table, in table order.
        table_rows: rows of each table.
        dense_floats: float32 values in the dense model file.
    """

    ps_json: Path
    network_file: Path
    dense_file: Path
    sparse_files: tuple[Path, ...]
    table_rows: tuple[int, ...]
    dense_floats: int

    @property
    def total_bytes(self) -> int:
        """Bytes written to disk (files of the sparse folders, dense file, JSON files)."""
        folders = sum(p.stat().st_size for f in self.sparse_files for p in f.iterdir())
        files = (self.ps_json, self.network_file, self.dense_file)
        return folders + sum(p.stat().st_size for p in files)


def checked_key_map(keys: Any, rows: int, where: str) -> np.ndarray:
    """Validate the keys of one table: one distinct integer per row.

    Args:
        keys: array-like of integer keys; ``keys[i]`` is the key of row ``i``.
        rows: rows of the table.
        where: what the keys are, for messages (e.g. ``key map of table 3``).

    Returns:
        int64 ``[rows]``.

    Raises:
        ConfigError: not 1-D integers, wrong length, or outside int64.
        ModelFileError: a key appears twice (up to five are listed).
    """
    array = np.asarray(keys)
    if array.ndim != 1 or array.dtype.kind not in "iu" or array.shape[0] != rows:
        raise ConfigError(
            f"must be a 1-D integer array of {rows} keys (one per row), "
            f"got {array.dtype} {array.shape}",
            where,
        )
    if array.dtype.kind == "u" and rows and int(array.max()) > np.iinfo(np.int64).max:
        raise ConfigError(f"key {int(array.max())} does not fit in int64", where)
    array = array.astype(KEY_DTYPE, copy=False)
    check_unique_keys(array, where)
    return array


def write_embedding_table(
    path: Path,
    rows: int,
    dim: int,
    vectors: TableSource,
    keys: np.ndarray | None = None,
    chunk_rows: int | None = None,
    overwrite: bool = False,
) -> None:
    """Write one sparse model folder, pulling its rows chunk by chunk.

    Args:
        path: the folder.
        rows: rows of the table.
        dim: floats per vector.
        vectors: returns rows ``[start, stop)`` as float32 ``[stop - start, dim]``.
        keys: int64 key of each row (see :func:`checked_key_map`); ``None`` gives row ``i``
            key ``i``.
        chunk_rows: rows per chunk; default about 64 MiB of vectors and keys.
        overwrite: replace a table already in the folder.

    Raises:
        ModelFileError: a chunk has the wrong shape or dtype, or the disk refused the data;
            the folder keeps what it held before.
    """
    step = chunk_rows or max(1, DEFAULT_CHUNK_BYTES // (dim * 4 + KEY_DTYPE.itemsize))
    with SparseTableWriter(path, overwrite=overwrite) as writer:
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            chunk = vectors(start, stop)
            if getattr(chunk, "shape", None) != (stop - start, dim):
                raise ModelFileError(
                    f"{path}: rows {start}..{stop} must come as [{stop - start}, {dim}], "
                    f"got {getattr(chunk, 'shape', type(chunk).__name__)}"
                )
            chunk_keys = (
                np.arange(start, stop, dtype=KEY_DTYPE) if keys is None else keys[start:stop]
            )
            writer.append(chunk_keys, chunk)


def write_dlrm_model(
    out_dir: str | Path,
    model_name: str,
    arch: DlrmArch,
    dense: Mapping[str, np.ndarray],
    tables: Sequence[TableSource],
    key_maps: Mapping[int, Any] | None = None,
    max_keys_per_table: int | Sequence[int] = 1,
    max_batch_size: int = 64,
    overwrite: bool = False,
) -> DlrmFiles:
    """Write every HugeCTR file of a DLRM and the ps.json naming them.

    Args:
        out_dir: the folder (created if missing).
        model_name: the ps.json ``model`` name (Triton's model name) and the file prefix.
        arch: the model.
        dense: the MLP tensors by state-dict key in PyTorch layout (``bot_l.0.weight``
            ``[out, in]``, ``bot_l.0.bias`` ``[out]``, ...), shapes as ``arch`` says.
        tables: one row source per table, in ``emb_l`` order.
        key_maps: table index -> the key of each of its rows; other tables use row ``i`` ->
            key ``i``.
        max_keys_per_table: most keys one sample looks up in each table (one value for all
            tables, or one per table); 1 for one-hot features.
        max_batch_size: the ps.json ``max_batch_size``.
        overwrite: replace files already there.

    Returns:
        The paths and sizes written.

    Raises:
        ConfigError: a bad argument (all listed), e.g. a key map of the wrong length.
        ModelFileError: files already exist without ``overwrite`` (all listed), duplicate
            keys in a key map, or the disk refused the data.
    """
    max_keys = _per_table(max_keys_per_table, arch.num_tables)
    _check_arguments(
        model_name, arch.num_tables, tables, arch.embedding_sizes, key_maps or {}, max_keys,
        max_batch_size,
    )  # fmt: skip
    return write_ranking_files(
        out_dir,
        model_name,
        dlrm_network_json(arch, max_keys),
        lambda layout: hugectr_dense_params(arch, dense, layout),
        tables,
        arch.embedding_sizes,
        key_maps,
        max_keys,
        max_batch_size,
        overwrite,
    )


def write_ranking_files(
    out_dir: str | Path,
    model_name: str,
    network: Mapping[str, Any],
    dense_params: Callable[[DenseLayout], DenseParams],
    tables: Sequence[TableSource],
    table_rows: Sequence[int],
    key_maps: Mapping[int, Any] | None = None,
    max_keys_per_table: int | Sequence[int] = 1,
    max_batch_size: int = 64,
    overwrite: bool = False,
) -> DlrmFiles:
    """Write a ranking model given as a HugeCTR network document: its network file, dense
    file, one sparse folder per embedding layer (rows pulled chunk by chunk) and the ps.json.

    Args:
        out_dir: the folder (created if missing).
        model_name: the ps.json ``model`` name (Triton's model name) and the file prefix.
        network: the network JSON document (graph form); its embedding layers, in file order,
            are the tables.
        dense_params: returns the dense parameters for the network's dense layout.
        tables: one row source per table.
        table_rows: rows of each table.
        key_maps: table index -> the key of each of its rows; other tables use row ``i`` ->
            key ``i``.
        max_keys_per_table: ``maxnum_catfeature_query_per_table_per_sample``: one value for
            all tables, or one per table.
        max_batch_size: the ps.json ``max_batch_size``.
        overwrite: replace files already there.

    Returns:
        The paths and sizes written.

    Raises:
        ConfigError: a bad argument (all listed).
        ModelFileError: files already exist without ``overwrite`` (all listed), duplicate
            keys in a key map, or the disk refused the data.
    """
    out_dir = Path(out_dir)
    network_file = out_dir / f"{model_name}.json"
    network_text = json.dumps(network, indent=2) + "\n"
    graph = build_graph(parse_network_json(network_text, source=str(network_file)))
    layers = [node.layer for node in graph.embeddings]
    names = [node.spec.name for node in graph.embeddings]
    max_keys = _per_table(max_keys_per_table, len(layers))
    _check_arguments(
        model_name, len(layers), tables, table_rows, key_maps or {}, max_keys, max_batch_size
    )
    keys = {
        t: checked_key_map(k, table_rows[t], f"key map of table {t}")
        for t, k in sorted((key_maps or {}).items())
    }
    ps_json = out_dir / PS_JSON
    dense_file = out_dir / f"{model_name}_dense_0.model"
    sparse = tuple(out_dir / f"{model_name}{t}_sparse_0.model" for t in range(len(layers)))
    if not overwrite:
        _refuse_existing([ps_json, network_file, dense_file], sparse)
    params = dense_params(graph.dense_layout())
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelFileError(f"{out_dir}: cannot create the output folder: {exc}") from None
    for t, (path, source, layer) in enumerate(zip(sparse, tables, layers, strict=True)):
        rows, dim = table_rows[t], layer.vec_size
        logger.info("writing table %d: %d rows x %d to %s", t, rows, dim, path)
        write_embedding_table(path, rows, dim, source, keys.get(t), overwrite=overwrite)
    floats = write_dense_blob(params, dense_file)
    output = graph.output_shape
    assert output is not None  # every layer of a built graph has a shape
    document = {
        "supportlonglong": True,
        "models": [
            {
                "model": model_name,
                "sparse_files": [p.name for p in sparse],
                "dense_file": dense_file.name,
                "network_file": network_file.name,
                "embedding_table_names": names,
                "embedding_vecsize_per_table": [layer.vec_size for layer in layers],
                "maxnum_catfeature_query_per_table_per_sample": list(max_keys),
                "default_value_for_each_table": [0.0] * len(layers),
                "deployed_device_list": [0],
                "max_batch_size": max_batch_size,
                "slot_num": sum(layer.slot_num for layer in layers),
                "label_dim": output.sample_size,
                "maxnum_des_feature_per_sample": graph.spec.data.dense_dim,
            }
        ],
    }
    _write_text(network_file, network_text)
    _write_text(ps_json, json.dumps(document, indent=2) + "\n")
    return DlrmFiles(ps_json, network_file, dense_file, sparse, tuple(table_rows), floats)


def _per_table(value: int | Sequence[int], num_tables: int) -> tuple[int, ...]:
    if isinstance(value, int | np.integer):
        return (int(value),) * num_tables
    return tuple(int(v) for v in value)


def _check_arguments(
    model_name: str,
    num_tables: int,
    tables: Sequence[TableSource],
    table_rows: Sequence[int],
    key_maps: Mapping[int, Any],
    max_keys: tuple[int, ...],
    max_batch_size: int,
) -> None:
    problems = []
    if not model_name or any(c in model_name for c in "/\\") or model_name.startswith("."):
        problems.append(
            Problem("model_name", f"must be a plain file-name prefix, got {model_name!r}")
        )
    if len(tables) != num_tables or len(table_rows) != num_tables:
        problems.append(
            Problem(
                "tables",
                f"got {len(tables)} tables and {len(table_rows)} row counts, the model has "
                f"{num_tables}",
            )
        )
    for t in key_maps:
        if not isinstance(t, int | np.integer) or not 0 <= t < num_tables:
            problems.append(
                Problem(
                    f"key map of table {t}",
                    f"no such table; the model has tables 0..{num_tables - 1}",
                )
            )
    if len(max_keys) != num_tables or (max_keys and min(max_keys) < 1):
        problems.append(
            Problem(
                "max_keys_per_table",
                f"needs one value >= 1 or {num_tables} of them, got {list(max_keys)}",
            )
        )
    if max_batch_size < 1:
        problems.append(Problem("max_batch_size", f"must be >= 1, got {max_batch_size}"))
    if problems:
        raise ConfigError(problems)


def _refuse_existing(files: Sequence[Path], folders: Sequence[Path]) -> None:
    found = [str(p) for p in files if p.exists()]
    found += [
        str(folder / name)
        for folder in folders
        for name in (KEY_FILE, VECTOR_FILE)
        if (folder / name).exists()
    ]
    if found:
        listed = "\n  ".join(found)
        raise ModelFileError(
            f"refusing to overwrite existing model files; {OVERWRITE_HINT} them:\n  {listed}"
        )


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot write: {exc}") from None
