"""Demo ranking models: ``dcn`` and ``wdl`` of the default repository, and HugeCTR's sample
zoo (``hps prepare --zoo``): network, dense and sparse files, ps.json.

Each is a function of its seed only. Table ``t`` of a model holds ``slot_num_t x
ROWS_PER_SLOT[t]`` keys: slot ``s`` uses keys ``s * R .. (s + 1) * R - 1`` (``R`` its rows per
slot), the way Criteo data offsets each field's categories; other keys get the default vector
(zeros). Vectors are normal with standard deviation ``VECTOR_SCALE``; dense parameters are
:func:`~hps_core.nn.random_dense_params` of the seed. Files go under ``<model>/data/``, written
only when missing or different; config.pbtxt, model.py and ps.json are written every time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hps_core.config import parse_ps_config
from hps_core.demo.ranking_networks import dcn_network, wdl_network
from hps_core.demo.zoo_networks import (
    MLPERF_V2_HOTNESS,
    bst_network,
    din_network,
    dlrm_mlp_network,
    dlrm_v2_network,
    mmoe_network,
    ncf_network,
    shared_bottom_network,
)
from hps_core.errors import HPSError
from hps_core.formats.sparse import inspect_sparse_table
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.nn import (
    build_graph,
    check_dense_blob_size,
    parse_network_json,
    random_dense_params,
    write_dense_blob,
)
from hps_core.triton_repo import ServingOptions, write_ranking_model

VECTOR_SCALE = 0.5
MAX_BATCH_SIZE = 256


@dataclass(frozen=True)
class RankingDemo:
    """One demo ranking model.

    Args:
        name: model name (ps.json ``model`` and Triton folder).
        network: returns the network file's JSON document.
        rows_per_slot: keys per slot of each table, in table (embedding layer) order.
        seed: seed of every generated value.
    """

    name: str
    network: Callable[[], dict[str, Any]]
    rows_per_slot: tuple[int, ...]
    seed: int


DCN = RankingDemo("dcn", dcn_network, (150,), 20261202)
WDL = RankingDemo("wdl", wdl_network, (500, 150), 20261203)
ZOO = (
    RankingDemo("dlrm_mlp", dlrm_mlp_network, (100,), 20261210),
    RankingDemo("din", din_network, (200, 60, 20), 20261211),
    RankingDemo("bst", bst_network, (50, 40), 20261212),
    RankingDemo("mmoe", mmoe_network, (80,), 20261213),
    RankingDemo("ncf", ncf_network, (300, 500), 20261214),
    RankingDemo("shared_bottom", shared_bottom_network, (80,), 20261215),
    RankingDemo("dlrm_v2", dlrm_v2_network, (200,) * len(MLPERF_V2_HOTNESS), 20261216),
)
"""HugeCTR's sample model families (:mod:`hps_core.demo.zoo_networks`)."""


def table_rows(
    demo: RankingDemo, table: int, slot_num: int, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Keys and vectors of one demo table (deterministic).

    Args:
        demo: the model.
        table: table index.
        slot_num: slots of the table (from its network).
        dim: vector size of the table.

    Returns:
        ``(keys, vectors)``: int64 ``[rows]`` and float32 ``[rows, dim]``.
    """
    rows = slot_num * demo.rows_per_slot[table]
    rng = np.random.default_rng([demo.seed, table])
    vectors = VECTOR_SCALE * rng.standard_normal((rows, dim), dtype=np.float32)
    return np.arange(rows, dtype=np.int64), vectors


def _table_ok(folder: Path, dim: int, rows: int) -> bool:
    try:
        return inspect_sparse_table(folder, dim).rows == rows
    except HPSError:  # missing, truncated or wrong dim: write it again
        return False


def _dense_ok(path: Path, layout: Any) -> bool:
    try:
        check_dense_blob_size(path, layout)
    except HPSError:
        return False
    return True


def write_ranking_demo(
    demo: RankingDemo, repo: Path, options: ServingOptions | None = None
) -> Path:
    """Write a demo ranking model (and its ``_samples`` twin) into ``repo``.

    Args:
        demo: the model.
        repo: the model repository.
        options: batching and placement.

    Returns:
        The main model folder.
    """
    folder = (repo / demo.name).resolve()
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    network_text = json.dumps(demo.network(), indent=2) + "\n"
    network_file = data / f"{demo.name}.json"
    if not network_file.is_file() or network_file.read_text() != network_text:
        network_file.write_text(network_text)
    graph = build_graph(parse_network_json(network_text, source=str(network_file)))
    dense_file = data / f"{demo.name}_dense.model"
    if not _dense_ok(dense_file, graph.dense_layout()):
        write_dense_blob(random_dense_params(graph.dense_layout(), seed=demo.seed), dense_file)
    embeddings = [node.layer for node in graph.embeddings]
    sparse = [data / f"{node.spec.name}_sparse" for node in graph.embeddings]
    for t, (layer, path) in enumerate(zip(embeddings, sparse, strict=True)):
        rows = layer.slot_num * demo.rows_per_slot[t]
        if not _table_ok(path, layer.vec_size, rows):
            write_sparse_table(path, *table_rows(demo, t, layer.slot_num, layer.vec_size), True)
    nnz = [sparse_input.nnz_per_slot for sparse_input in graph.spec.data.sparse]
    by_top = dict(zip((s.name for s in graph.spec.data.sparse), nnz, strict=True))
    output = graph.output_shape
    assert output is not None  # the demo networks run
    predictions = output.sample_size
    ps = {
        "supportlonglong": True,
        "volatile_db": {"type": "hash_map"},
        "models": [
            {
                "model": demo.name,
                "network_file": str(network_file.relative_to(folder)),
                "dense_file": str(dense_file.relative_to(folder)),
                "sparse_files": [str(p.relative_to(folder)) for p in sparse],
                "embedding_table_names": [node.spec.name for node in graph.embeddings],
                "embedding_vecsize_per_table": [layer.vec_size for layer in embeddings],
                "maxnum_catfeature_query_per_table_per_sample": [
                    layer.slot_num * by_top[layer.sparse_input] for layer in embeddings
                ],
                "default_value_for_each_table": [0.0] * len(embeddings),
                "deployed_device_list": [0],
                "max_batch_size": MAX_BATCH_SIZE,
                "maxnum_des_feature_per_sample": graph.spec.data.dense_dim,
                "slot_num": sum(layer.slot_num for layer in embeddings),
                "label_dim": predictions,
                "gpucache": True,
                "gpucacheper": 0.5,
                "hit_rate_threshold": 0.9,
            }
        ],
    }
    config = parse_ps_config(ps, base_dir=folder)
    options = options or ServingOptions()
    return write_ranking_model(repo, config, config.models[0], options)[0]


def write_dcn_demo(repo: Path, options: ServingOptions | None = None) -> Path:
    """Write the ``dcn`` demo model; see :func:`write_ranking_demo`."""
    return write_ranking_demo(DCN, repo, options)


def write_wdl_demo(repo: Path, options: ServingOptions | None = None) -> Path:
    """Write the ``wdl`` demo model; see :func:`write_ranking_demo`."""
    return write_ranking_demo(WDL, repo, options)
