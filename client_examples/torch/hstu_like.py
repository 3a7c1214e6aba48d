"""A sequence recommender in the shape of NV Embedding Cache's Triton HSTU sample, served by
Triton with its tables in the HPS: a user's item history and the actions on those items, read
unpooled (``EmbeddingCollection``: a row per id, cut per user), then a transformer block over
the history, scoring a candidate item.

The module file of ``hps repo-torch --module hstu_like.py:build``. ``forward(history,
actions, length, candidate)`` takes Triton's tensors: the last ``MAX_HISTORY`` item ids and
action ids of each user, left-aligned (int64 ``[batch, MAX_HISTORY]``; positions past
``length`` are ignored), ``length`` (int64 ``[batch, 1]``, 1 to ``MAX_HISTORY``) and
``candidate`` (int64 ``[batch, 1]``); it returns the candidate's probability ``[batch, 1]``.
``served_module`` makes the same module around any ``EmbeddingCollection``: TorchRec's own to
train, the HPS's to serve.
"""

from __future__ import annotations

import numpy as np
import torch
from torchrec import EmbeddingCollection, EmbeddingConfig

from hps_core import hps_torchrec
from hps_core.jagged import KeyedJaggedTensor

ITEMS = 5000
ACTIONS = 8
DIM = 32
MAX_HISTORY = 20
HEADS = 4
INPUTS = (f"history:int64:{MAX_HISTORY}", f"actions:int64:{MAX_HISTORY}", "length:int64:1",
          "candidate:int64:1")  # fmt: skip
"""The served model's inputs, as ``hps repo-torch --input`` takes them."""


def table_configs() -> list[EmbeddingConfig]:
    """TorchRec's configs: items (the history and the candidate) and actions."""
    return [
        EmbeddingConfig(name="t_item", embedding_dim=DIM, num_embeddings=ITEMS,
                        feature_names=["history", "candidate"]),
        EmbeddingConfig(name="t_action", embedding_dim=DIM, num_embeddings=ACTIONS,
                        feature_names=["actions"]),
    ]  # fmt: skip


def torchrec_collection() -> EmbeddingCollection:
    """The tables as TorchRec holds them in training."""
    return EmbeddingCollection(tables=table_configs(), device=torch.device("cpu"))


class SequenceScorer(torch.nn.Module):
    """Item and action rows of the history, positions, one transformer block, then the last
    valid position's output against the candidate's row."""

    def __init__(self, collection: torch.nn.Module) -> None:
        super().__init__()
        self.collection = collection
        self.positions = torch.nn.Parameter(torch.randn(MAX_HISTORY, DIM) * 0.02)
        self.block = torch.nn.TransformerEncoderLayer(
            DIM, HEADS, dim_feedforward=2 * DIM, dropout=0.0, batch_first=True
        )
        self.out = torch.nn.Linear(DIM, DIM)

    def forward(self, history: torch.Tensor, actions: torch.Tensor, length: torch.Tensor,
                candidate: torch.Tensor) -> torch.Tensor:  # fmt: skip
        samples = history.shape[0]
        lengths = length.reshape(-1).clamp(1, MAX_HISTORY)
        valid = torch.arange(MAX_HISTORY, device=history.device) < lengths[:, None]
        ones = torch.ones(samples, dtype=lengths.dtype, device=history.device)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=["history", "actions", "candidate"],
            values=torch.cat([history[valid], actions[valid], candidate.reshape(-1)]),
            lengths=torch.cat([lengths, lengths, ones]),
        )
        rows = self.collection(kjt)
        # The jagged rows back to [samples, MAX_HISTORY, DIM], zeros past each length.
        sequence = torch.zeros(samples, MAX_HISTORY, DIM, device=history.device)
        sequence[valid] = rows["history"].values() + rows["actions"].values()
        hidden = self.block(sequence + self.positions, src_key_padding_mask=~valid)
        last = hidden[torch.arange(samples, device=history.device), lengths - 1]
        score = (self.out(last) * rows["candidate"].values()).sum(dim=1, keepdim=True)
        return torch.sigmoid(score)


def served_module(collection: torch.nn.Module) -> SequenceScorer:
    """The served module around ``collection`` (TorchRec's, to train; the HPS's, to serve)."""
    return SequenceScorer(collection)


def build(ps_config_file: str, model_name: str) -> torch.nn.Module:
    """The module Triton serves: its tables the ps.json's (``hps convert torchrec``'s)."""
    collection = hps_torchrec.EmbeddingCollection(
        ps_config_file, model_name, [hps_torchrec.TableSpec.of(c) for c in table_configs()]
    )
    return served_module(collection)


def sample_inputs(rng: np.random.Generator, samples: int) -> dict[str, np.ndarray]:
    """Random requests of ``samples`` users (histories of 1 to MAX_HISTORY items)."""
    length = rng.integers(1, MAX_HISTORY + 1, (samples, 1))
    return {
        "history": rng.integers(0, ITEMS, (samples, MAX_HISTORY)),
        "actions": rng.integers(0, ACTIONS, (samples, MAX_HISTORY)),
        "length": length,
        "candidate": rng.integers(0, ITEMS, (samples, 1)),
    }
