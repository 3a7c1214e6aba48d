"""TorchRec's DLRM_DCN served by Triton with its tables in the HPS.

The module file of ``hps repo-torch --module dlrm_dcn.py:build``: ``build`` makes the served
module, whose ``forward(dense, sparse)`` takes Triton's tensors (``dense`` float32
``[batch, 13]``, ``sparse`` int64 ``[batch, sum of hotness]``: each table's ids of a sample side
by side, ``hotness[i]`` of table ``i``) and returns the click probability ``[batch, 1]``.
``served_module`` makes the same module around any ``EmbeddingBagCollection``: TorchRec's own
to train, or the HPS's.

Train (or load) with TorchRec's tables, then::

    torch.save(served_module(torchrec_ebc).state_dict(), "model.pt")
    hps convert torchrec --state-dict model.pt --model-name dlrm_dcn --out tables
    hps repo-torch tables/ps.json repo --model dlrm_dcn --module dlrm_dcn.py:build \\
        --state-dict model.pt --input dense:fp32:13 --input sparse:int64:4 --kind KIND_GPU

A model's sizes are a :class:`DlrmDcnShape`. ``SMALL`` (the default of every function here, and
of ``build``) is a small model's: 4 one-hot tables of dim 16. ``mlperf(max_rows)`` is MLPerf
DLRM-v2's: 26 multi-hot tables of dim 128 (``MLPERF_HOTNESS`` ids a sample, 214 in all), a dense
arch 512-256-128, DCN v2 of 3 layers of rank 512, an over arch 1024-1024-512-256-1; its tables'
rows are MLPerf's capped at ``max_rows``. Serve it with the factory ``build_mlperf``::

    hps convert torchrec --state-dict model.pt --model-name dlrm_dcn --out tables \\
        --max-keys-per-table 3-2-1-2-6-1-1-1-1-7-3-8-1-6-9-5-1-1-1-12-100-27-10-3-1-1
    hps repo-torch tables/ps.json repo --model dlrm_dcn --module dlrm_dcn.py:build_mlperf \\
        --state-dict model.pt --input dense:fp32:13 --input sparse:int64:214

The served module does not depend on the tables' row counts (the ps.json's files hold the rows,
and the HPS's collection sizes nothing by them), so ``build_mlperf`` serves tables of any cap;
the cap only sizes TorchRec's tables in training. For another model, write its shape and a
factory ``build_mine(ps, model) = build(ps, model, MY_SHAPE)``.
"""

# No ``from __future__ import annotations``: string annotations make ``dataclass`` look this
# module up in sys.modules, where a file loaded by spec_from_file_location may not be.
from dataclasses import dataclass

import numpy as np
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.models.dlrm import DLRM_DCN

from hps_core import hps_torchrec
from hps_core.jagged import KeyedJaggedTensor


@dataclass(frozen=True)
class DlrmDcnShape:
    """The sizes of a DLRM_DCN.

    Args:
        rows: each table's rows (table ``t_cat_i`` holds feature ``cat_i``).
        dim: every table's width (the dense arch's last layer).
        hotness: each table's ids a sample (bags of a fixed length).
        dense_layers: the dense arch's layer sizes (the last one ``dim``).
        over_layers: the over arch's layer sizes (the last one 1).
        dcn_layers: DCN v2's cross layers.
        dcn_rank: their low rank.
        dense_features: dense features a sample.
    """

    rows: tuple[int, ...]
    dim: int
    hotness: tuple[int, ...]
    dense_layers: tuple[int, ...]
    over_layers: tuple[int, ...]
    dcn_layers: int
    dcn_rank: int
    dense_features: int = 13

    def __post_init__(self) -> None:
        if len(self.hotness) != len(self.rows):
            raise ValueError(f"{len(self.rows)} tables, {len(self.hotness)} hotness values")
        if self.dense_layers[-1] != self.dim:
            raise ValueError(f"the dense arch ends in {self.dense_layers[-1]}, not dim {self.dim}")

    @property
    def sparse_width(self) -> int:
        """Ids a sample: the ``sparse`` input's width."""
        return sum(self.hotness)

    @property
    def inputs(self) -> tuple[str, str]:
        """The served model's inputs, as ``hps repo-torch --input`` takes them."""
        return (f"dense:fp32:{self.dense_features}", f"sparse:int64:{self.sparse_width}")


SMALL = DlrmDcnShape(
    rows=(1000, 40, 7, 300), dim=16, hotness=(1, 1, 1, 1), dense_layers=(32, 16),
    over_layers=(32, 1), dcn_layers=3, dcn_rank=8,
)  # fmt: skip
"""A small model's sizes: every function's default."""

MLPERF_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
"""MLPerf DLRM-v2's rows per table (Criteo 1TB, ids hashed to at most 40M)."""

MLPERF_HOTNESS = (
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
)  # fmt: skip
"""MLPerf DLRM-v2's ids a sample per table (its multi-hot Criteo 1TB)."""

MLPERF_MAX_ROWS = 100_000
"""``mlperf``'s default cap on a table's rows (8 tables capped: 0.47 GB of FP32 rows)."""

INPUTS = SMALL.inputs
"""The small model's inputs, as ``hps repo-torch --input`` takes them."""


def mlperf(max_rows: int | None = MLPERF_MAX_ROWS) -> DlrmDcnShape:
    """MLPerf DLRM-v2's shape.

    Args:
        max_rows: the most rows of a table (MLPerf's largest have 40M); ``None``: MLPerf's.

    Returns:
        26 tables of dim 128, MLPerf's hotness, dense arch 512-256-128, over arch
        1024-1024-512-256-1, DCN v2 of 3 layers of rank 512.
    """
    rows = MLPERF_ROWS if max_rows is None else tuple(min(r, max_rows) for r in MLPERF_ROWS)
    return DlrmDcnShape(
        rows=rows, dim=128, hotness=MLPERF_HOTNESS, dense_layers=(512, 256, 128),
        over_layers=(1024, 1024, 512, 256, 1), dcn_layers=3, dcn_rank=512,
    )  # fmt: skip


def table_configs(shape: DlrmDcnShape = SMALL) -> list[EmbeddingBagConfig]:
    """TorchRec's configs of the tables: table ``t_cat_i`` holds feature ``cat_i``.

    Args:
        shape: the model's sizes.

    Returns:
        One sum-pooled config a table.
    """
    return [
        EmbeddingBagConfig(name=f"t_cat_{i}", embedding_dim=shape.dim, num_embeddings=rows,
                           feature_names=[f"cat_{i}"])
        for i, rows in enumerate(shape.rows)
    ]  # fmt: skip


class ServedDLRM(torch.nn.Module):
    """DLRM_DCN over Triton's ``dense`` and ``sparse`` tensors.

    Args:
        ebc: the tables (TorchRec's, or the HPS's), one feature a table, in ``shape``'s order.
        shape: the model's sizes.
    """

    def __init__(self, ebc: torch.nn.Module, shape: DlrmDcnShape = SMALL) -> None:
        super().__init__()
        self.features = [f for c in ebc.embedding_bag_configs() for f in c.feature_names]
        if len(self.features) != len(shape.hotness):
            raise ValueError(f"{len(self.features)} features, {len(shape.hotness)} hotness values")
        self.hotness = list(shape.hotness)
        self._hotness: dict[torch.device, torch.Tensor] = {}
        self.uniform = len(set(self.hotness)) == 1
        self.dlrm = DLRM_DCN(
            embedding_bag_collection=ebc,
            dense_in_features=shape.dense_features,
            dense_arch_layer_sizes=list(shape.dense_layers),
            over_arch_layer_sizes=list(shape.over_layers),
            dcn_num_layers=shape.dcn_layers,
            dcn_low_rank_dim=shape.dcn_rank,
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """The click probability of each sample.

        Args:
            dense: float32 ``[batch, dense features]``.
            sparse: int64 ``[batch, sum of hotness]``, each table's ids side by side.

        Returns:
            float32 ``[batch, 1]``.
        """
        samples, features = sparse.shape[0], len(self.features)
        # TorchRec's layout: every sample's ids of the first feature, then the second, ...
        if self.uniform:
            values = sparse.reshape(samples, features, self.hotness[0]).transpose(0, 1).reshape(-1)
        else:
            values = torch.cat([part.reshape(-1) for part in sparse.split(self.hotness, dim=1)])
        # Every feature's ids a sample are fixed, so where each feature starts is known here
        # (length_per_key): the tables need not read the lengths back from a GPU.
        kjt = KeyedJaggedTensor(
            keys=self.features,
            values=values,
            lengths=self.hotness_on(sparse.device).repeat_interleave(samples),
            length_per_key=[samples * h for h in self.hotness],
        )
        return torch.sigmoid(self.dlrm(dense, kjt))

    def hotness_on(self, device: torch.device) -> torch.Tensor:
        """Each feature's ids a sample, int32 on ``device`` (copied there once: a copy from
        a Python list each forward would wait for the GPU's queued work)."""
        found = self._hotness.get(device)
        if found is None:
            found = self._hotness[device] = torch.tensor(
                self.hotness, dtype=torch.int32, device=device
            )
        return found


def served_module(ebc: torch.nn.Module, shape: DlrmDcnShape = SMALL) -> ServedDLRM:
    """The served module around ``ebc`` (TorchRec's, to train; the HPS's, to serve).

    Args:
        ebc: the tables.
        shape: the model's sizes.

    Returns:
        The module taking ``dense`` and ``sparse``.
    """
    return ServedDLRM(ebc, shape)


def build(ps_config_file: str, model_name: str, shape: DlrmDcnShape = SMALL) -> torch.nn.Module:
    """The module Triton serves: its tables the ps.json's (``hps convert torchrec``'s).

    Args:
        ps_config_file: the ps.json.
        model_name: its model holding the tables.
        shape: the model's sizes (``hps repo-torch`` passes none: ``SMALL``).

    Returns:
        The served module over an ``hps_torchrec.EmbeddingBagCollection``.
    """
    ebc = hps_torchrec.EmbeddingBagCollection(
        ps_config_file, model_name, [hps_torchrec.TableSpec.of(c) for c in table_configs(shape)]
    )
    return served_module(ebc, shape)


def build_mlperf(ps_config_file: str, model_name: str) -> torch.nn.Module:
    """``build`` at MLPerf DLRM-v2's shape (``--module dlrm_dcn.py:build_mlperf``): tables of
    any row cap (the served module does not depend on rows).

    Args:
        ps_config_file: the ps.json.
        model_name: its model holding the tables.

    Returns:
        The served module over an ``hps_torchrec.EmbeddingBagCollection``.
    """
    return build(ps_config_file, model_name, mlperf())


def torchrec_collection(shape: DlrmDcnShape = SMALL) -> EmbeddingBagCollection:
    """The tables as TorchRec holds them in training.

    Args:
        shape: the model's sizes.

    Returns:
        TorchRec's collection on the CPU, randomly initialised.
    """
    return EmbeddingBagCollection(tables=table_configs(shape), device=torch.device("cpu"))


def sample_inputs(
    rng: np.random.Generator, samples: int, shape: DlrmDcnShape = SMALL
) -> dict[str, np.ndarray]:
    """Random requests of ``samples`` samples: dense features and each table's ids (uniform
    over its rows).

    Args:
        rng: the random generator.
        samples: samples in the request.
        shape: the model's sizes.

    Returns:
        ``dense`` float32 ``[samples, dense features]`` and ``sparse`` int64
        ``[samples, sum of hotness]``.
    """
    dense = rng.standard_normal((samples, shape.dense_features), dtype=np.float32)
    sparse = np.concatenate(
        [rng.integers(0, rows, (samples, hot))
         for rows, hot in zip(shape.rows, shape.hotness, strict=True)], axis=1,
    )  # fmt: skip
    return {"dense": dense, "sparse": sparse.astype(np.int64)}
