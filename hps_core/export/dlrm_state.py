"""Check a ``DLRM_Net`` state dict against its architecture and turn it into NumPy arrays.

A state dict carries no flags, so its shapes are compared with the :class:`DlrmArch` one by
one: every problem (a missing key, an unexpected key, a shape that disagrees with the flags)
is reported at once, naming the tensor key and both shapes. The tensors may be PyTorch tensors
(any floating dtype, any device) or NumPy arrays; this module never imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from hps_core.errors import ConfigError, Problem
from hps_core.export.dlrm_arch import (
    EMBEDDING_SIZE_FLAG,
    MLP_BOT_FLAG,
    MLP_TOP_FLAG,
    SPARSE_FEATURE_SIZE_FLAG,
    DlrmArch,
)
from hps_core.export.dlrm_files import TableSource

_WEIGHTED_POOLING = re.compile(r"^v_W_l\.\d+$")


@dataclass(frozen=True)
class DlrmState:
    """The parameters of a checked ``DLRM_Net``, as float32 NumPy arrays in PyTorch layout.

    Args:
        arch: the architecture they were checked against.
        tables: ``emb_l`` weights, ``[rows, D]`` each, in table order.
        dense: the MLP tensors by state-dict key (``bot_l.0.weight`` ``[out, in]``, ...).
    """

    arch: DlrmArch
    tables: tuple[np.ndarray, ...]
    dense: Mapping[str, np.ndarray]

    def table_sources(self) -> list[TableSource]:
        """One row source per table, as :func:`~hps_core.export.write_dlrm_model` takes."""
        return [partial(_rows, table) for table in self.tables]


def unwrap_checkpoint(obj: Any, where: str) -> Mapping[str, Any]:
    """Return the state dict inside what ``torch.load`` returned.

    dlrm's ``--save-model`` writes a dict whose ``"state_dict"`` entry holds the model next to
    the training counters; ``torch.save(model.state_dict())`` writes the state dict itself.

    Args:
        obj: the loaded object.
        where: the file it came from, for the message.

    Returns:
        The state dict.

    Raises:
        ConfigError: ``obj`` is neither.
    """
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
        raise ConfigError(
            f"expected a state dict (str -> tensor) or a dlrm checkpoint with a 'state_dict' "
            f"entry, got {type(obj).__name__}",
            where,
        )
    return obj


def infer_dlrm_arch(state: Mapping[str, Any], where: str = "state_dict") -> DlrmArch:
    """Read the architecture off the tensor shapes (what the four flags would say).

    Tables are ``emb_l.0``, ``emb_l.1``, ... up to the first missing index; the MLPs are the
    Linear layers ``bot_l.0``, ``bot_l.2``, ... likewise.

    Args:
        state: the state dict.
        where: its name in messages (a file path).

    Returns:
        The architecture; check the state dict against it with :func:`check_dlrm_state`.

    Raises:
        ConfigError: a part of the model is absent, or a tensor is not 2-D.
    """
    problems: list[Problem] = []

    def weights(prefix: str, step: int, flag: str) -> list[tuple[int, ...]]:
        shapes = []
        while (key := f"{prefix}.{step * len(shapes)}.weight") in state:
            shape = _shape(state[key])
            if len(shape) != 2:
                problems.append(Problem(f"{where}['{key}']", f"must be 2-D, got shape {shape}"))
                return []
            shapes.append(shape)
        if not shapes:
            problems.append(
                Problem(where, f"has no '{prefix}.0.weight'; give {flag} or a DLRM_Net state dict")
            )
        return shapes

    tables = weights("emb_l", 1, EMBEDDING_SIZE_FLAG)
    bottom = weights("bot_l", 2, MLP_BOT_FLAG)
    top = weights("top_l", 2, MLP_TOP_FLAG)
    if problems:
        raise ConfigError(problems)
    return DlrmArch(
        sparse_feature_size=tables[0][1],
        embedding_sizes=tuple(rows for rows, _ in tables),
        bottom_mlp=(bottom[0][1], *(out for out, _ in bottom)),
        top_mlp=tuple(out for out, _ in top),
    )


def check_dlrm_state(
    state: Mapping[str, Any], arch: DlrmArch, where: str = "state_dict"
) -> DlrmState:
    """Check every tensor of ``state`` against ``arch`` and convert it to float32 NumPy.

    Args:
        state: a ``DLRM_Net`` state dict (PyTorch tensors or NumPy arrays).
        arch: the architecture the flags describe.
        where: the state dict's name in messages (a file path).

    Returns:
        The checked parameters.

    Raises:
        ConfigError: listing every missing key, unexpected key, shape that does not match
            the flags (with both shapes and the flag), and non-floating tensor.
    """
    expected = arch.expected_shapes()
    problems = []
    for key, shape in expected.items():
        if key not in state:
            problems.append(Problem(f"{where}['{key}']", f"missing; {_needed_by(key, arch)}"))
            continue
        have = _shape(state[key])
        if have != shape:
            problems.append(
                Problem(
                    f"{where}['{key}']",
                    f"has shape {have}, but {_needed_by(key, arch)} needs shape {shape}",
                )
            )
        elif not _is_floating(state[key]):
            problems.append(
                Problem(f"{where}['{key}']", f"must be floating point, got {_dtype(state[key])}")
            )
    problems += [
        Problem(f"{where}['{key}']", _unexpected(key)) for key in state if key not in expected
    ]
    if problems:
        raise ConfigError(problems)
    arrays = {key: _float32(state[key]) for key in expected}
    tables = tuple(arrays.pop(f"emb_l.{t}.weight") for t in range(arch.num_tables))
    return DlrmState(arch, tables, arrays)


def _needed_by(key: str, arch: DlrmArch) -> str:
    """Which flags fix the shape of ``key``."""
    if key.startswith("emb_l."):
        sizes = "-".join(map(str, arch.embedding_sizes))
        return (
            f"{EMBEDDING_SIZE_FLAG} {sizes} and {SPARSE_FEATURE_SIZE_FLAG} "
            f"{arch.sparse_feature_size}"
        )
    if key.startswith("bot_l."):
        return f"{MLP_BOT_FLAG} {'-'.join(map(str, arch.bottom_mlp))}"
    widths = "-".join(map(str, arch.top_mlp))
    return (
        f"{MLP_TOP_FLAG} {widths} (after the computed interaction width "
        f"{arch.interaction_width} = {arch.num_vectors}*{arch.num_vectors - 1}/2 + "
        f"{arch.bottom_mlp[-1]})"
    )


def _unexpected(key: str) -> str:
    if _WEIGHTED_POOLING.match(key):
        return (
            "unexpected key: learned weighted pooling (dlrm --weighted-pooling learned) is not "
            "supported; HugeCTR pools each slot with a plain sum"
        )
    return (
        "unexpected key: not part of a DLRM_Net with plain EmbeddingBag tables and "
        "Linear/ReLU MLPs of this architecture"
    )


def _rows(table: np.ndarray, start: int, stop: int) -> np.ndarray:
    return table[start:stop]


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in getattr(value, "shape", ()))


def _dtype(value: Any) -> str:
    return str(getattr(value, "dtype", type(value).__name__))


def _is_floating(value: Any) -> bool:
    if hasattr(value, "is_floating_point"):  # a torch.Tensor
        return bool(value.is_floating_point())
    return isinstance(value, np.ndarray) and value.dtype.kind == "f"


def _float32(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch.Tensor: bfloat16 has no NumPy dtype, so cast first
        value = value.detach().cpu().float().numpy()
    return np.ascontiguousarray(value, dtype=np.float32)
