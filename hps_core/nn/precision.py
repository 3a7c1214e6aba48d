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
FP32       cuBLAS SGEMM-class GEMM (SIMT)         sgemm
TF32       cuBLAS on TF32 tensor cores            :func:`round_to_tf32` on both operands,
           (:func:`_tf32_tensor_cores`)           then sgemm (an emulation for checking)
FP16       cuBLAS on float16 operands, float32    both operands widened to float32, sgemm,
           compute type (tensor cores)            result rounded to float16
=========  =====================================  ==========================================

CuPy's ``matmul`` on float16 operands already accumulates in float32: its GEMM calls pass
``CUBLAS_COMPUTE_32F`` for half-precision outputs whatever compute type is configured (only
``COMPUTE_TYPE_PEDANTIC`` changes it, to ``CUBLAS_COMPUTE_32F_PEDANTIC``). A product whose
result is one element is not a GEMM in CuPy (it runs a reduction kernel that would add in the
output dtype), so :meth:`ComputeContext.matmul` computes that case in float32 from the rounded
operands on both array modules.

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

import contextlib
import enum
from collections.abc import Iterator
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

#: ``cublasMath_t`` value of ``CUBLAS_TF32_TENSOR_OP_MATH`` (cublas_api.h); CuPy's ``cublas``
#: module names only ``CUBLAS_DEFAULT_MATH`` and ``CUBLAS_TENSOR_OP_MATH``.
CUBLAS_TF32_TENSOR_OP_MATH = 3


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
class ComputeContext:
    """The array module and precision one forward pass runs with.

    Args:
        xp: ``numpy`` or ``cupy``.
        precision: the compute mode.

    Raises:
        NotAvailableError: TF32 on a GPU without TF32 tensor cores (compute capability below
            8.0), or with a CuPy that lacks the switches :func:`_tf32_tensor_cores` uses.
    """

    xp: ModuleType
    precision: Precision = Precision.FP32
    _on_gpu: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        on_gpu = self.xp.__name__ == "cupy"
        object.__setattr__(self, "_on_gpu", on_gpu)
        if on_gpu and self.precision is Precision.TF32:
            _check_tf32_available(self.xp)

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
        if self.precision is Precision.FP32:
            return xp.matmul(a, b)
        if self.precision is Precision.TF32:
            if self._on_gpu:
                with _tf32_tensor_cores(xp):
                    return xp.matmul(a, b)
            return xp.matmul(round_to_tf32(xp, a), round_to_tf32(xp, b))
        if self._on_gpu:
            return xp.matmul(a, b)
        return xp.matmul(self.widen(a), self.widen(b)).astype(np.float16)

    def _dot_in_float32(self, a: Any, b: Any) -> Any:
        """Products with one output element per matrix, from the rounded operands."""
        if self.precision is Precision.TF32:
            a, b = round_to_tf32(self.xp, a), round_to_tf32(self.xp, b)
        product = self.xp.matmul(self.widen(a), self.widen(b))
        return self.cast(product)

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
    try:
        from cupy._core import _routines_linalg as linalg
    except ImportError as exc:
        raise NotAvailableError(f"precision 'tf32': {exc}") from None
    needed = (
        (linalg, "get_compute_type"),
        (linalg, "set_compute_type"),
        (linalg, "COMPUTE_TYPE_TF32"),
        (cupy.cuda.cublas, "getMathMode"),
        (cupy.cuda.cublas, "setMathMode"),
        (cupy.cuda.device, "get_cublas_handle"),
    )
    missing = [f"{module.__name__}.{name}" for module, name in needed if not hasattr(module, name)]
    if missing:
        raise NotAvailableError(
            f"precision 'tf32' needs switches this CuPy {cupy.__version__} lacks: "
            + ", ".join(missing)
        )


@contextlib.contextmanager
def _tf32_tensor_cores(cupy: ModuleType) -> Iterator[None]:
    """Let float32 products issued inside the block run on TF32 tensor cores.

    Two switches are set because CuPy's ``matmul`` reaches cuBLAS two ways (read in CuPy's
    ``cupy/_core/_routines_linalg.pyx``):

    - 2-D products call ``cublasGemmEx`` with an explicit compute type taken from CuPy's
      per-dtype setting (``cupy._core._routines_linalg.get_compute_type``):
      ``CUBLAS_COMPUTE_32F`` by default, ``CUBLAS_COMPUTE_32F_FAST_TF32`` when float32's
      setting is ``COMPUTE_TYPE_TF32``. The explicit fast-TF32 compute type is the documented
      way to ask cuBLAS for TF32, so this setting is the switch for them. ``CUPY_TF32=1``
      seeds the same setting, but once per process and for every product, which is why it is
      not used here.
    - Batched products (the Interaction's Gram matrices) call
      ``cublasGemmStridedBatchedEx`` (or ``cublasSgemmBatched``) with the legacy
      ``CUDA_R_32F`` compute type and never read CuPy's setting; for those the handle's math
      mode ``CUBLAS_TF32_TENSOR_OP_MATH`` is the only switch.

    ``tests/gpu/nn/test_nn_tf32_fp16.py`` checks that both kinds of product really round their
    operands to TF32 (and that full float32 is back after the block). Both settings are
    restored even on error, so other float32 products of the process keep full precision.
    CuPy keeps the compute-type setting per process, not per thread: do not issue float32
    products from other threads while a TF32 product is being issued.
    """
    from cupy._core import _routines_linalg as linalg

    cublas = cupy.cuda.cublas
    handle = cupy.cuda.device.get_cublas_handle()
    previous_mode = cublas.getMathMode(handle)
    previous_type = linalg.get_compute_type(np.float32)
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
    try:
        cublas.setMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH)
        yield
    finally:
        cublas.setMathMode(handle, previous_mode)
        linalg.set_compute_type(np.float32, previous_type)
