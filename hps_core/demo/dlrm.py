"""``dlrm``: a PyTorch DLRM (facebookresearch/dlrm ``DLRM_Net``) shaped like Criteo, exported.

13 dense features and 26 one-hot categorical features, one table each (embedding size 16),
bottom MLP 13-64-32-16, dot interaction, top MLP 64-32-1 with a sigmoid. The table sizes are
Criteo's cardinalities (Kaggle, as in HugeCTR's ``dlrm_1gpu.json``) capped at
``MAX_TABLE_ROWS``; row ``i`` of a table has key ``i``. The weights are a NumPy state dict
drawn from ``SEED`` only (:func:`dlrm_state`), written through
:func:`hps_core.export.export_dlrm`; so a ``DLRM_Net`` loaded with the same state dict
predicts what the server predicts. Files go to ``dlrm/data/``, exported only when missing or
damaged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hps_core.config import load_ps_config
from hps_core.errors import HPSError
from hps_core.export import DlrmArch, export_dlrm
from hps_core.infer import load_ranking_graph
from hps_core.model_check import check_ps_json
from hps_core.triton_repo import ServingOptions, write_ranking_model

NAME = "dlrm"
SEED = 20261201
MAX_TABLE_ROWS = 2000
MAX_BATCH_SIZE = 256
EMBEDDING_SCALE = 0.5
# Criteo Kaggle cardinalities of the 26 categorical features.
CRITEO_CARDINALITIES = (
    381808, 22456, 14763, 7118, 19308, 4, 6443, 1259, 54, 341642, 112151, 94957, 11,
    2188, 8399, 61, 4, 949, 15, 382633, 246818, 370704, 92823, 9773, 78, 34,
)  # fmt: skip
ARCH = DlrmArch(
    sparse_feature_size=16,
    embedding_sizes=tuple(min(n, MAX_TABLE_ROWS) for n in CRITEO_CARDINALITIES),
    bottom_mlp=(13, 64, 32, 16),
    top_mlp=(64, 32, 1),
)


def dlrm_state(seed: int = SEED, arch: DlrmArch = ARCH) -> dict[str, np.ndarray]:
    """The demo's weights as a ``DLRM_Net`` state dict of float32 NumPy arrays.

    Linear layers are initialised as dlrm's ``create_mlp`` does (weights normal with standard
    deviation ``sqrt(2 / (in + out))``, biases ``sqrt(1 / out)``); embeddings are normal with
    standard deviation ``EMBEDDING_SCALE``, wider than dlrm's ``±sqrt(1 / rows)`` so that the
    predictions of an untrained model still depend visibly on the keys.

    Args:
        seed: random seed.
        arch: the architecture.

    Returns:
        ``{"emb_l.0.weight": [rows, 16], ..., "bot_l.0.weight": [out, in], ...}``.
    """
    rng = np.random.default_rng(seed)
    state: dict[str, np.ndarray] = {}
    for key, shape in arch.expected_shapes().items():
        if key.startswith("emb_l."):
            values = rng.normal(0.0, EMBEDDING_SCALE, shape)
        elif key.endswith(".weight"):
            values = rng.normal(0.0, np.sqrt(2.0 / (shape[0] + shape[1])), shape)
        else:
            values = rng.normal(0.0, np.sqrt(1.0 / shape[0]), shape)
        state[key] = values.astype(np.float32)
    return state


def _exported(ps_json: Path) -> bool:
    if not ps_json.is_file() or check_ps_json(ps_json).problems:
        return False
    try:
        load_ranking_graph(load_ps_config(ps_json).model(NAME))
    except HPSError:  # e.g. a truncated dense file
        return False
    return True


def write_dlrm_demo(repo: Path, options: ServingOptions | None = None) -> Path:
    """Write the ``dlrm`` model folder (and ``dlrm_samples``) into ``repo``.

    Args:
        repo: the model repository.
        options: batching and placement.

    Returns:
        The ``dlrm`` model folder.
    """
    data = (repo / NAME / "data").resolve()
    if not _exported(data / "ps.json"):
        export_dlrm(
            dlrm_state(), data, NAME, arch=ARCH, max_batch_size=MAX_BATCH_SIZE, overwrite=True
        )
    config = load_ps_config(data / "ps.json")
    return write_ranking_model(repo, config, config.model(NAME), options or ServingOptions())[0]
