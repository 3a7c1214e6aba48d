"""Instance kinds a served test runs on: always KIND_CPU; KIND_GPU where CUDA is usable.

A test parametrised with :data:`INSTANCE_KINDS` checks the same behaviour on the path that
ships on each kind (the NumPy lookup and network on CPU instances, the GPU pipeline on GPU
instances). On a machine without a usable GPU the KIND_GPU case is skipped with the reason.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """Why CUDA cannot be used here, or None when CuPy sees a device."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not importable: {exc}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return f"no usable CUDA device: {exc}"
    return None if count > 0 else "no CUDA device visible"


def _gpu_param() -> object:
    reason = cuda_unavailable_reason()
    marks = [pytest.mark.gpu]
    if reason is not None:
        marks.append(pytest.mark.skip(reason=reason))
    return pytest.param("KIND_GPU", marks=marks, id="KIND_GPU")


INSTANCE_KINDS = ("KIND_CPU", _gpu_param())
