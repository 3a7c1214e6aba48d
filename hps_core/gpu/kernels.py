"""The CUDA kernels of the GPU pipeline: ``kernels/*.cu`` files compiled once per device.

The ``.cu`` files are plain CUDA C++ (readable and compilable as such); the constants they
share with Python are prepended here as ``#define`` lines generated from the Python modules
that own them, so the two cannot drift apart. Templated kernels are instantiated through
CuPy's ``name_expressions`` (``interaction<float>``, ``interaction<unsigned short>`` for half).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import cupy

from hps_core.cache.layout import EMPTY_KEY, WAYS
from hps_core.errors import HPSError
from hps_core.gpu.counters import (
    C_EVICTIONS,
    C_HITS,
    C_INSERTS,
    C_KEYS,
    C_MISSES,
    C_UNKNOWN,
    NUM_COUNTERS,
)

LANES = 8
"""Lanes that serve one bag of ``bank_lookup`` (four bags per warp)."""

THREADS = 256
"""Threads per block of ``bank_lookup`` and ``bank_insert``."""

COMBINER_SUM = 0
COMBINER_MEAN = 1

_CUDA_ERRORS = (
    cupy.cuda.compiler.CompileException,
    cupy.cuda.driver.CUDADriverError,
    cupy.cuda.runtime.CUDARuntimeError,
)


class KernelBuildError(HPSError):
    """A kernel file failed to compile or load."""


def _defines() -> str:
    values = {
        "WAYS": WAYS,
        "LANES": LANES,
        "GROUP_MASK": f"{(1 << LANES) - 1:#x}u",
        "EMPTY_KEY": f"{EMPTY_KEY}LL",
        "C_KEYS": C_KEYS,
        "C_HITS": C_HITS,
        "C_MISSES": C_MISSES,
        "C_UNKNOWN": C_UNKNOWN,
        "C_INSERTS": C_INSERTS,
        "C_EVICTIONS": C_EVICTIONS,
        "NUM_COUNTERS": NUM_COUNTERS,
        "COMBINER_SUM": COMBINER_SUM,
        "COMBINER_MEAN": COMBINER_MEAN,
    }
    return "".join(f"#define {name} {value}\n" for name, value in values.items())


def source(name: str) -> str:
    """Text of ``kernels/<name>.cu`` with the shared constants prepended."""
    text = resources.files("hps_core.gpu").joinpath("kernels", f"{name}.cu").read_text()
    return _defines() + text


@functools.cache
def module(name: str, device_id: int, templates: tuple[str, ...] = ()) -> Any:
    """``kernels/<name>.cu`` compiled for ``device_id`` (once per process).

    Args:
        name: file stem, e.g. ``"bank"``.
        device_id: CUDA device ordinal.
        templates: template instantiations to make available, e.g. ``("f<float>",)``.

    Returns:
        The loaded ``cupy.RawModule``.

    Raises:
        KernelBuildError: NVRTC rejected the source or the module did not load.
    """
    with cupy.cuda.Device(device_id):
        try:
            mod = cupy.RawModule(
                code=source(name), options=("--std=c++17",), name_expressions=templates or None
            )
            mod.compile()
        except _CUDA_ERRORS as exc:
            raise KernelBuildError(
                f"kernels/{name}.cu failed to build for GPU {device_id}: {exc}"
            ) from exc
    return mod
