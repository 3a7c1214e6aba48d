"""TorchRec's sparse feature types, or minimal equivalents where TorchRec is not installed.

The TorchRec-shaped tables of :mod:`hps_core.hps_torchrec` take a ``KeyedJaggedTensor`` and
return a ``KeyedTensor`` (pooled) or ``JaggedTensor`` s (sequences), as TorchRec's modules do.
Where TorchRec imports, these names are TorchRec's own classes, so a TorchRec model's inputs
and outputs flow through unchanged. TorchRec needs FBGEMM, whose GPU wheel is not everywhere
(not on a serving machine with its own CUDA stack, say): there these small classes stand in,
holding the accessors the tables and a model's code use (``keys()``, ``values()``,
``lengths()``, ``offsets()``, ``stride()``, ``to_dict()``, ``[key]``), with TorchRec's
semantics (values grouped by key, then by sample).

Example:
    >>> import torch
    >>> from hps_core.jagged import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor.from_lengths_sync(
    ...     keys=["user", "item"], values=torch.tensor([7, 8, 9]),
    ...     lengths=torch.tensor([2, 0, 1, 0]))
    >>> kjt.stride(), kjt.offset_per_key()
    (2, [0, 2, 3])
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

__all__ = ["HAVE_TORCHREC", "JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"]


def _offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    """CSR offsets (``len(lengths) + 1``, from 0) of per-bag lengths."""
    offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths.to(torch.int64), dim=0, out=offsets[1:])
    return offsets


class _JaggedTensor:
    """Bags of values of one feature: ``values`` cut by ``lengths`` (or ``offsets``).

    Args (TorchRec's order):
        values: the bags' values, back to back.
        weights: one weight per value, or None.
        lengths: each bag's length (one of ``lengths``, ``offsets``).
        offsets: each bag's start, plus the end.
    """

    def __init__(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("JaggedTensor: give lengths or offsets")
        self._values, self._weights = values, weights
        self._lengths = lengths if lengths is not None else torch.diff(offsets)
        self._offsets = offsets if offsets is not None else _offsets_of(lengths)

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        return self._offsets

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def to_dense(self) -> list[torch.Tensor]:
        """Each bag's values as a tensor of its own."""
        return list(torch.split(self._values, self._lengths.tolist()))


class _KeyedJaggedTensor:
    """Several features' bags, TorchRec's layout: every bag of the first key (one per sample),
    then every bag of the second, and so on.

    Args (TorchRec's order):
        keys: the feature names.
        values: the values of every bag, back to back.
        weights: one weight per value, or None.
        lengths: ``len(keys) * stride`` bag lengths (one of ``lengths``, ``offsets``).
        offsets: the bags' starts, plus the end.
        stride: samples per key (default: the bags over the keys).
        length_per_key: each key's number of values, where the caller knows it on the host
            (then nothing reads the lengths back from a GPU to find where a key starts).
    """

    def __init__(
        self,
        keys: list[str],
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        stride: int | None = None,
        length_per_key: list[int] | None = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise ValueError("KeyedJaggedTensor: give lengths or offsets")
        self._keys = list(keys)
        self._values, self._weights = values, weights
        self._lengths = lengths if lengths is not None else torch.diff(offsets)
        self._offsets = offsets if offsets is not None else _offsets_of(lengths)
        bags = int(self._lengths.shape[0])
        if stride is None:
            stride = bags // len(self._keys) if self._keys else 0
        if bags != stride * len(self._keys):
            raise ValueError(
                f"KeyedJaggedTensor: {bags} bag lengths for {len(self._keys)} keys of "
                f"{stride} samples"
            )
        self._stride = stride
        self._offset_per_key: list[int] | None = None
        if length_per_key is not None:
            if len(length_per_key) != len(self._keys):
                raise ValueError(
                    f"KeyedJaggedTensor: {len(length_per_key)} lengths per key for "
                    f"{len(self._keys)} keys"
                )
            self._offset_per_key = [0, *itertools.accumulate(int(n) for n in length_per_key)]

    @classmethod
    def from_lengths_sync(
        cls,
        keys: list[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> _KeyedJaggedTensor:
        return cls(keys, values, weights, lengths=lengths, stride=stride)

    @classmethod
    def from_offsets_sync(
        cls,
        keys: list[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> _KeyedJaggedTensor:
        return cls(keys, values, weights, offsets=offsets, stride=stride)

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        return self._offsets

    def stride(self) -> int:
        return self._stride

    def variable_stride_per_key(self) -> bool:
        return False

    def offset_per_key(self) -> list[int]:
        """Where each key's values start, plus the end (read from the device once)."""
        if self._offset_per_key is None:
            self._offset_per_key = self._offsets[:: max(self._stride, 1)].tolist()
            if not self._stride:
                self._offset_per_key = [0] * (len(self._keys) + 1)
        return self._offset_per_key

    def length_per_key(self) -> list[int]:
        starts = self.offset_per_key()
        return [b - a for a, b in itertools.pairwise(starts)]

    def length_per_key_or_none(self) -> list[int] | None:
        """Each key's number of values where already known on the host, else None."""
        if self._offset_per_key is None:
            return None
        return [b - a for a, b in itertools.pairwise(self._offset_per_key)]

    def __getitem__(self, key: str) -> _JaggedTensor:
        i = self._keys.index(key)
        starts, b = self.offset_per_key(), self._stride
        first, end = starts[i], starts[i + 1]
        weights = None if self._weights is None else self._weights[first:end]
        return _JaggedTensor(
            self._values[first:end], offsets=self._offsets[i * b : (i + 1) * b + 1] - first,
            weights=weights,
        )  # fmt: skip

    def to_dict(self) -> dict[str, _JaggedTensor]:
        return {key: self[key] for key in self._keys}


class _KeyedTensor:
    """Pooled features side by side: ``values`` is ``[samples, sum(length_per_key)]`` (with
    ``key_dim`` 1), key ``k``'s columns after those of the keys before it.

    Args:
        keys: the feature names.
        length_per_key: each key's width.
        values: the tensor.
        key_dim: the dimension the keys are laid along.
    """

    def __init__(
        self, keys: list[str], length_per_key: list[int], values: torch.Tensor, key_dim: int = 1
    ) -> None:
        self._keys, self._lengths = list(keys), list(length_per_key)
        self._values, self._key_dim = values, key_dim

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def length_per_key(self) -> list[int]:
        return self._lengths

    def offset_per_key(self) -> list[int]:
        starts = [0]
        for n in self._lengths:
            starts.append(starts[-1] + n)
        return starts

    def __getitem__(self, key: str) -> torch.Tensor:
        i = self._keys.index(key)
        start = self.offset_per_key()[i]
        return self._values.narrow(self._key_dim, start, self._lengths[i])

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {key: self[key] for key in self._keys}


JaggedTensor: Any
KeyedJaggedTensor: Any
KeyedTensor: Any
try:  # TorchRec's classes where it is installed: its models' inputs pass through unchanged
    from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

    HAVE_TORCHREC = True
except (ImportError, OSError):  # not installed, or FBGEMM's libraries do not load
    JaggedTensor, KeyedJaggedTensor, KeyedTensor = _JaggedTensor, _KeyedJaggedTensor, _KeyedTensor
    HAVE_TORCHREC = False
