"""Compute precision of the dense network and the array helpers that depend on it.

Three modes, each with the same meaning on NumPy (CPU instances, and CI) and CuPy (GPU):

- **FP32** (default): float32 storage, float32 products and sums.
- **TF32**: float32 storage; the operands of every matrix product are rounded to TF32 (float32's
  8-bit exponent, 10 of its 23 mantissa bits) and the products accumulate in float32, as
  Ampere-and-later tensor cores do. Element-wise layers and reductions stay float32.
- **FP16**: float16 storage of activations and weights (HugeCTR's mixed-precision inference);
  matrix products take float16 operands, accumulate in float32 and round the result to float16
  once; reductions accumulate in float32.

How each mode runs:

=========  =====================================  ==========================================
mode       CuPy                                   NumPy
=========  =====================================  ==========================================
FP32       cuBLAS GEMM, ``CUBLAS_COMPUTE_32F``;   sgemm
           large fully connected layers on TF32
           tensor cores as 3xTF32 (float32-class
           accuracy, :mod:`hps_core.cuda.linear`;
           ``HPS_FP32_GEMM=sgemm`` turns it off)
TF32       cuBLAS GEMM on TF32 tensor cores       :func:`round_to_tf32` on both operands,
           (``CUBLAS_COMPUTE_32F_FAST_TF32``)     then sgemm (an emulation for checking)
FP16       cuBLAS on float16 operands, float32    both operands widened to float32, sgemm,
           compute type (tensor cores)            result rounded to float16
=========  =====================================  ==========================================

On CuPy the products go through :mod:`hps_core.cuda.blas`, which calls cuBLAS directly with the
compute type of the mode (no process-wide switch) and can be recorded in a CUDA graph, which
CuPy's own ``matmul`` cannot. A product whose result is one element is computed in float32
from the rounded operands on both array modules (``ComputeContext._dot_in_float32``): cuBLAS
may run such a product without tensor cores, where TF32 would not be applied.

Accuracy measured on the CPU (NumPy) on the four HugeCTR fixture networks (DCN, DeepFM,
DLRM, W&D; parameters from ``random_dense_params(seed=11)``, inputs normal with standard
deviation 0.3) against a float64 interpreter of the network, on the predicted probabilities,
at batch 64 and 1024 (range over networks and both batches):

=========  =============================  =============================
mode       max abs error                  relative L2 error
=========  =============================  =============================
FP32       5.1e-8 .. 1.0e-6 (DeepFM)      3.8e-8 .. 2.6e-7
TF32       2.2e-5 .. 6.9e-5               8.3e-6 .. 4.6e-5
FP16       2.1e-4 .. 1.3e-3 (DeepFM)      1.7e-4 .. 3.6e-4
=========  =============================  =============================

GPU (CuPy, H200) accuracy: to be filled in from ``benchmarks/nn_forward_bench.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from hps_core.errors import ConfigError, NotAvailableError

#: Mantissa bits TF32 keeps of float32's 23.
TF32_MANTISSA_BITS = 10
_DROPPED_BITS = 23 - TF32_MANTISSA_BITS
_HALF_DROPPED = (1 << (_DROPPED_BITS - 1)) - 1  # 0x0FFF: just under half a TF32 step
_KEPT_MASK = (0xFFFFFFFF >> _DROPPED_BITS) << _DROPPED_BITS  # 0xFFFFE000


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


def round_to_tf32(xp: ModuleType, array: Any) -> Any:
    """Round float32 values to TF32: 10 mantissa bits, to nearest with ties to even.

    The result is float32 with the 13 low mantissa bits cleared. Rounding up may carry into
    the exponent (and past the largest finite value, to infinity), exactly as rounding a
    float32 to a shorter mantissa does; subnormals round on the same fixed grid. Infinities
    and NaNs pass through unchanged.

    Args:
        xp: ``numpy`` or ``cupy``.
        array: values of any float dtype (converted to float32 first).

    Returns:
        A new float32 array of the same shape.

    Example:
        >>> import numpy as np
        >>> round_to_tf32(np, np.float32([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-12])).tolist()
        [1.0, 1.001953125, 1.0]
    """
    x = xp.asarray(array, dtype=np.float32)
    bits = x.view(np.uint32)
    # Adding just under half a step, plus one when the last kept bit is odd, then clearing the
    # dropped bits, rounds to nearest with ties to even on the bit pattern.
    odd = (bits >> _DROPPED_BITS) & 1
    rounded = bits + odd
    rounded += _HALF_DROPPED
    rounded &= _KEPT_MASK
    # A NaN's payload could carry into the sign bit: keep every non-finite value as it was.
    return xp.where(xp.isfinite(x), rounded.view(np.float32), x)


@dataclass(frozen=True)
class PaddedBatch:
    """A batch of ``rows`` samples whose first ``count[0]`` are real and the rest padding (the
    GPU pipeline pads a batch to its size bucket, whose CUDA graphs replay for any number of
    real samples). Layers that take statistics over the batch (DIN's Dice) skip the padding;
    every other layer treats each row alone, so the padding's rows change no real one.

    Args:
        count: an int32 array of the pass's array module whose first element is the number
            of real samples; on a GPU it is read by the kernels, never by the host.
        rows: samples in the batch, padding included.

    Example:
        >>> PaddedBatch(np.array([3], np.int32), rows=4).rows_per_sample(12)
        3
    """

    count: Any
    rows: int

    def rows_per_sample(self, rows: int) -> int:
        """Rows per sample of a tensor of ``rows`` rows (DIN's attention holds one per item
        of a sample's history).

        Raises:
            ValueError: ``rows`` is not a whole number of rows per sample.
        """
        if self.rows <= 0 or rows % self.rows:
            raise ValueError(
                f"a tensor of {rows} rows is not whole rows per sample of a batch of "
                f"{self.rows}: its statistics cannot skip the batch's padding"
            )
        return rows // self.rows


@dataclass(frozen=True)
class ComputeContext:
    """The array module and precision one forward pass runs with.

    Args:
        xp: ``numpy`` or ``cupy``.
        precision: the compute mode.
        padded: the padding of the batch being computed (see :class:`PaddedBatch`); None:
            every row is a real sample.

    Raises:
        NotAvailableError: TF32 on a GPU without TF32 tensor cores (compute capability below
            8.0).
    """

    xp: ModuleType
    precision: Precision = Precision.FP32
    padded: PaddedBatch | None = None
    _on_gpu: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        on_gpu = self.xp.__name__ == "cupy"
        object.__setattr__(self, "_on_gpu", on_gpu)
        if on_gpu and self.precision is Precision.TF32:
            _check_tf32_available(self.xp)

    @property
    def on_gpu(self) -> bool:
        """Whether arrays are CuPy's (layers may then use fused GPU kernels)."""
        return self._on_gpu

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
        """Matrix product in this precision, accumulated in float32.

        Both operands are first cast to the storage dtype. A 2-D right operand with a batched
        left operand (``[..., K] @ [K, N]``) is one GEMM over all leading rows.

        Args:
            a: left operand, 2-D or more (batched operands broadcast as in ``xp.matmul``).
            b: right operand, 2-D or more.

        Returns:
            The product in the storage dtype: float32 for FP32 and TF32, float16 (rounded once
            from the float32 accumulator) for FP16.
        """
        a, b = self.cast(a), self.cast(b)
        if b.ndim == 2 and a.ndim > 2:
            rows = a.reshape(-1, a.shape[-1])
            return self.matmul(rows, b).reshape(*a.shape[:-1], b.shape[-1])
        if a.shape[-2] == 1 and b.shape[-1] == 1:
            return self._dot_in_float32(a, b)
        xp = self.xp
        if self._on_gpu:
            from hps_core.cuda.blas import matmul

            return matmul(a, b, self.precision.value)
        if self.precision is Precision.FP32:
            return xp.matmul(a, b)
        if self.precision is Precision.TF32:
            return xp.matmul(round_to_tf32(xp, a), round_to_tf32(xp, b))
        return xp.matmul(self.widen(a), self.widen(b)).astype(np.float16)

    def _dot_in_float32(self, a: Any, b: Any) -> Any:
        """Products with one output element per matrix, from the rounded operands."""
        if self.precision is Precision.TF32:
            a, b = round_to_tf32(self.xp, a), round_to_tf32(self.xp, b)
        a, b = self.widen(a), self.widen(b)
        if self._on_gpu:
            from hps_core.cuda.blas import matmul

            return self.cast(matmul(a, b, Precision.FP32.value))
        return self.cast(self.xp.matmul(a, b))

    def sum(self, array: Any, axis: int, keepdims: bool = False) -> Any:
        """Sum along ``axis`` accumulated in float32, returned in float32."""
        return self.xp.sum(array, axis=axis, dtype=np.float32, keepdims=keepdims)


def _check_tf32_available(cupy: ModuleType) -> None:
    device = cupy.cuda.Device()
    capability = int(device.compute_capability)
    if capability < 80:
        raise NotAvailableError(
            f"precision 'tf32' needs TF32 tensor cores (compute capability 8.0 or newer); "
            f"GPU {device.id} has {capability // 10}.{capability % 10}"
        )
