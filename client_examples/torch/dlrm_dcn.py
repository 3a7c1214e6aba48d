"""TorchRec's DLRM_DCN served by Triton with its tables in the HPS.

The module file of ``hps repo-torch --module dlrm_dcn.py:build``: ``build`` makes the served
module, whose ``forward(dense, sparse)`` takes Triton's tensors (``dense`` float32
``[batch, 13]``, ``sparse`` int64 ``[batch, features * HOTNESS]``: each feature's ids of a
sample side by side) and returns the click probability ``[batch, 1]``. ``served_module`` makes
the same module around any ``EmbeddingBagCollection``: TorchRec's own to train, or the HPS's.

Train (or load) with TorchRec's tables, then::

    torch.save(served_module(torchrec_ebc).state_dict(), "model.pt")
    hps convert torchrec --state-dict model.pt --model-name dlrm_dcn --out tables
    hps repo-torch tables/ps.json repo --model dlrm_dcn --module dlrm_dcn.py:build \\
        --state-dict model.pt --input dense:fp32:13 --input sparse:int64:4 --kind KIND_GPU

The sizes here are a small model's; MLPerf DLRM-v2's are 26 tables of dim 128, DCN v2 of 3
layers of rank 512 (set TABLE_ROWS, DIM, HOTNESS and the layer sizes to match your model).
"""

from __future__ import annotations

import numpy as np
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.models.dlrm import DLRM_DCN

from hps_core import hps_torchrec
from hps_core.jagged import KeyedJaggedTensor

TABLE_ROWS = (1000, 40, 7, 300)
DIM = 16
HOTNESS = 1
DENSE_FEATURES = 13
DENSE_LAYERS = [32, DIM]
OVER_LAYERS = [32, 1]
DCN_LAYERS = 3
DCN_RANK = 8
INPUTS = ("dense:fp32:13", f"sparse:int64:{len(TABLE_ROWS) * HOTNESS}")
"""The served model's inputs, as ``hps repo-torch --input`` takes them."""


def table_configs() -> list[EmbeddingBagConfig]:
    """TorchRec's configs of the tables: table ``t_cat_i`` holds feature ``cat_i``."""
    return [
        EmbeddingBagConfig(name=f"t_cat_{i}", embedding_dim=DIM, num_embeddings=rows,
                           feature_names=[f"cat_{i}"])
        for i, rows in enumerate(TABLE_ROWS)
    ]  # fmt: skip


class ServedDLRM(torch.nn.Module):
    """DLRM_DCN over Triton's ``dense`` and ``sparse`` tensors."""

    def __init__(self, ebc: torch.nn.Module) -> None:
        super().__init__()
        self.features = [f for c in ebc.embedding_bag_configs() for f in c.feature_names]
        self.dlrm = DLRM_DCN(
            embedding_bag_collection=ebc,
            dense_in_features=DENSE_FEATURES,
            dense_arch_layer_sizes=DENSE_LAYERS,
            over_arch_layer_sizes=OVER_LAYERS,
            dcn_num_layers=DCN_LAYERS,
            dcn_low_rank_dim=DCN_RANK,
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        samples, features = sparse.shape[0], len(self.features)
        # TorchRec's layout: every sample's ids of the first feature, then the second, ...
        values = sparse.reshape(samples, features, HOTNESS).transpose(0, 1).reshape(-1)
        lengths = torch.full((features * samples,), HOTNESS, dtype=torch.int32,
                             device=sparse.device)  # fmt: skip
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self.features, values=values, lengths=lengths
        )
        return torch.sigmoid(self.dlrm(dense, kjt))


def served_module(ebc: torch.nn.Module) -> ServedDLRM:
    """The served module around ``ebc`` (TorchRec's, to train; the HPS's, to serve)."""
    return ServedDLRM(ebc)


def build(ps_config_file: str, model_name: str) -> torch.nn.Module:
    """The module Triton serves: its tables the ps.json's (``hps convert torchrec``'s)."""
    ebc = hps_torchrec.EmbeddingBagCollection(
        ps_config_file, model_name, [hps_torchrec.TableSpec.of(c) for c in table_configs()]
    )
    return served_module(ebc)


def torchrec_collection() -> EmbeddingBagCollection:
    """The tables as TorchRec holds them in training."""
    return EmbeddingBagCollection(tables=table_configs(), device=torch.device("cpu"))


def sample_inputs(rng: np.random.Generator, samples: int) -> dict[str, np.ndarray]:
    """Random requests of ``samples`` samples: dense features and one id per table."""
    dense = rng.standard_normal((samples, DENSE_FEATURES), dtype=np.float32)
    sparse = np.stack(
        [rng.integers(0, rows, (samples, HOTNESS)) for rows in TABLE_ROWS], axis=1
    ).reshape(samples, -1)
    return {"dense": dense, "sparse": sparse.astype(np.int64)}
