"""HugeCTR's hps_torch demo model served by Triton: eight tables of dim 128 read by
``LookupLayer``s under ``torch.jit.fork``, their rows summed per sample, concatenated and
scored by a small MLP; static tables, 32-bit keys (``supportlonglong: false``). Written for
HugeCTR's plugin it differs in its import line only (``import hps_torch`` there).

The module file of ``hps repo-torch --module hps_torch_demo.py:build``: ``forward(keys)``
takes int32 ``[batch, TABLES, HOTNESS]`` keys (each table's keys of a sample) and returns
``[batch, 1]``. ``served_module`` makes the same module over any tables (``torch.nn.Embedding``
with the same rows: the plain-PyTorch model it is checked against).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from hps_core import hps_torch
from hps_core.formats.sparse_writer import write_sparse_table

TABLES = 8
DIM = 128
ROWS = 10_000
HOTNESS = 3
INPUTS = (f"keys:int32:{TABLES}x{HOTNESS}",)
"""The served model's inputs, as ``hps repo-torch --input`` takes them."""


class DemoModel(torch.nn.Module):
    """One lookup per table, run under ``torch.jit.fork`` as the demo notebook does."""

    def __init__(self, tables: list[torch.nn.Module]) -> None:
        super().__init__()
        self.lookups = torch.nn.ModuleList(tables)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(TABLES * DIM, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        futures = [torch.jit.fork(layer, keys[:, t]) for t, layer in enumerate(self.lookups)]
        vectors = [torch.jit.wait(f).sum(dim=1) for f in futures]
        return torch.sigmoid(self.mlp(torch.cat(vectors, dim=1)))


def served_module(tables: list[torch.nn.Module]) -> DemoModel:
    """The model over ``tables`` (LookupLayers to serve, ``torch.nn.Embedding`` to compare)."""
    return DemoModel(tables)


def build(ps_config_file: str, model_name: str) -> torch.nn.Module:
    """The module Triton serves: a LookupLayer per table of the ps.json model."""
    return served_module(
        [hps_torch.LookupLayer(ps_config_file, model_name, t, DIM) for t in range(TABLES)]
    )


def write_tables(folder: Path, seed: int) -> tuple[Path, list[np.ndarray]]:
    """The demo's tables as HugeCTR sparse files (row ``i`` under key ``i``) and a ps.json of
    static tables with 32-bit keys; returns it and the rows."""
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal((ROWS, DIM), dtype=np.float32) * 0.1 for _ in range(TABLES)]
    for t, vectors in enumerate(rows):
        write_sparse_table(folder / f"table{t}", np.arange(ROWS, dtype=np.int64), vectors)
    model = {
        "model": "hps_torch_demo",
        "sparse_files": [str(folder / f"table{t}") for t in range(TABLES)],
        "embedding_table_names": [f"table{t}" for t in range(TABLES)],
        "embedding_vecsize_per_table": [DIM] * TABLES,
        "maxnum_catfeature_query_per_table_per_sample": [HOTNESS] * TABLES,
        "default_value_for_each_table": [0.0] * TABLES,
        "deployed_device_list": [0],
        "max_batch_size": 1024,
        "gpucache": True,
        "gpucacheper": 1.0,
        "use_static_table": True,
    }
    ps = folder / "ps.json"
    ps.write_text(json.dumps({"supportlonglong": False, "models": [model]}, indent=1))
    return ps, rows


def plain_tables(rows: list[np.ndarray]) -> list[torch.nn.Module]:
    """The same rows as ``torch.nn.Embedding`` tables."""
    return [torch.nn.Embedding.from_pretrained(torch.from_numpy(r)) for r in rows]


def sample_inputs(rng: np.random.Generator, samples: int) -> dict[str, np.ndarray]:
    """Random requests of ``samples`` samples."""
    return {"keys": rng.integers(0, ROWS, (samples, TABLES, HOTNESS)).astype(np.int32)}
