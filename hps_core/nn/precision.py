"""Compute precision of the dense network and the array helpers that depend on it.

FP32 is the default. FP16 keeps activations and weights in float16 (HugeCTR's mixed-precision
inference) while matrix products and reductions accumulate in float32, the way cuBLAS does
for HugeCTR's half-precision layers. TF32 is a named mode so that configurations can ask for
it; it is not implemented yet.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from hps_core.errors import ConfigError, NotAvailableError


class Precision(enum.Enum):
    """Numeric mode of the dense network."""

    FP32 = "fp32"
    FP16 = "fp16"
    TF32 = "tf32"

    @classmethod
    def parse(cls, value: str | Precision) -> Precision:
        """Return the precision named by ``value`` (``"fp32"``, ``"fp16"`` or ``"tf32"``).

        Args:
            value: a name or a :class:`Precision`.

        Returns:
            The matching member.

        Raises:
            ConfigError: the name is not one of the modes.
        """
        if isinstance(value, Precision):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ConfigError(f"unknown precision {value!r}; expected one of {names}") from None


@dataclass(frozen=True)
class ComputeContext:
    """The array module and precision one forward pass runs with.

    Args:
        xp: ``numpy`` or ``cupy``.
        precision: the compute mode.

    Raises:
        NotAvailableError: the precision is TF32, which is not implemented yet.
    """

    xp: ModuleType
    precision: Precision = Precision.FP32

    def __post_init__(self) -> None:
        if self.precision is Precision.TF32:
            raise NotAvailableError("precision 'tf32' is not implemented yet; use fp32 or fp16")

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype of activations and weights."""
        return np.dtype(np.float16 if self.precision is Precision.FP16 else np.float32)

    def cast(self, array: Any) -> Any:
        """Return ``array`` in the storage dtype (no copy when it already is)."""
        return array.astype(self.dtype, copy=False)

    def widen(self, array: Any) -> Any:
        """Return ``array`` as float32 for accumulation (no copy when it already is)."""
        return array.astype(np.float32, copy=False)

    def matmul(self, a: Any, b: Any) -> Any:
        """Matrix product accumulated in float32, returned in float32.

        Args:
            a: left operand (batched operands broadcast as in ``xp.matmul``).
            b: right operand.

        Returns:
            float32 product; callers cast back with :meth:`cast`.
        """
        return self.xp.matmul(self.widen(a), self.widen(b))

    def sum(self, array: Any, axis: int, keepdims: bool = False) -> Any:
        """Sum along ``axis`` accumulated in float32, returned in float32."""
        return self.xp.sum(array, axis=axis, dtype=np.float32, keepdims=keepdims)
