"""CUDA kernels on the GPU: ``kernels/*.cu`` files compiled once per device.

The ``.cu`` files are plain CUDA C++ (readable and compilable as such): ``bank.cu``,
``dense.cu`` and ``copy.cu`` for the GPU pipeline, ``cache.cu`` for the dynamic cache and the
static table of :mod:`hps_core.cache` (loaded by
:func:`hps_core.cache.cupy_cache.load_kernels`). ``bank.cu`` and ``cache.cu`` share the
set-probing helpers of ``kernels/cache_set.cuh``. The constants a file shares with Python are
prepended as ``#define`` lines written by :func:`define_lines` from the Python modules that
own them, so the two cannot drift apart: the pipeline's by
:func:`hps_core.infer.gpu.constants.bank_defines`, the cache's by
:func:`hps_core.cache.kernel_consts.cuda_defines`, both taking what ``bank.cu`` and ``cache.cu``
share (ways, empty key, lanes per key, threads per block, counter positions) from
:func:`hps_core.cache.kernel_consts.shared_defines`. This package imports nothing of hps_core
but its errors: the cache and the ranking pipeline build on it. Templated kernels are
instantiated through CuPy's ``name_expressions`` (``interaction<float>``,
``interaction<unsigned short>`` for half).

Building the source text needs no CuPy (:func:`source`); compiling it does (:func:`module`
imports CuPy when called).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

from hps_core.errors import HPSError

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([\w.-]+\.cuh)"[ \t]*(?://[^\n]*)?$', re.M)
"""An ``#include "<header>.cuh"`` line of a kernel file (a header of ``kernels/``)."""


class KernelBuildError(HPSError):
    """A kernel file failed to compile or load."""


def define_lines(values: Mapping[str, int | str]) -> str:
    """The ``#define`` lines a kernel file is compiled with: the one writer of CUDA constants,
    whose values come from the Python modules that own them (so the two cannot drift apart).

    Args:
        values: name -> value (an int, or CUDA text such as ``"0xffu"``).

    Returns:
        One ``#define NAME VALUE`` line per entry.
    """
    return "".join(f"#define {name} {value}\n" for name, value in values.items())


def _read(file: str) -> str:
    return resources.files("hps_core.cuda").joinpath("kernels", file).read_text()


def _inline_headers(text: str, file: str, seen: set[str]) -> str:
    """``text`` (of ``kernels/<file>``) with each ``#include "X.cuh"`` line replaced by the text
    of ``kernels/X.cuh`` (itself inlined the same way) the first time, by an empty line after.

    ``#line`` directives around an inlined header keep NVRTC's messages pointing at the file and
    line they are about.
    """

    def inline(match: re.Match[str]) -> str:
        header = match.group(1)
        if header in seen:
            return ""
        seen.add(header)
        body = _inline_headers(_read(header), header, seen).rstrip("\n")
        resume = text.count("\n", 0, match.start()) + 2  # the line after the #include
        return f'#line 1 "kernels/{header}"\n{body}\n#line {resume} "kernels/{file}"'

    return _INCLUDE.sub(inline, text)


def source(name: str, defines: str | None = None) -> str:
    """Text of ``kernels/<name>.cu`` as compiled: constants first, headers inlined.

    NVRTC sees only the text it is given, not the package's files. Each ``#include "X.cuh"``
    line is therefore replaced by the text of ``kernels/X.cuh`` (once per source, whatever
    guard the header has) rather than resolved through an ``-I`` include path, which would need
    the package to be a directory on disk (not so for a zipped install) and would make the
    compiled text depend on files read by the compiler: the returned string is the whole
    compile unit.

    Args:
        name: file stem, e.g. ``"bank"``.
        defines: ``#define`` lines to prepend (:func:`define_lines`), the constants the file
            shares with Python; none for files that share none.

    Returns:
        CUDA C++ text for ``cupy.RawModule(code=...)``.
    """
    file = f"{name}.cu"
    text = _inline_headers(_read(file), file, set())
    prefix = defines or ""
    return f'{prefix}#line 1 "kernels/{file}"\n{text}'


@functools.cache
def module(
    name: str, device_id: int, templates: tuple[str, ...] = (), defines: str | None = None
) -> Any:
    """``kernels/<name>.cu`` compiled for ``device_id`` (once per process and arguments).

    Args:
        name: file stem, e.g. ``"bank"``.
        device_id: CUDA device ordinal.
        templates: template instantiations to make available, e.g. ``("f<float>",)``.
        defines: ``#define`` lines to prepend (see :func:`source`).

    Returns:
        The loaded ``cupy.RawModule``.

    Raises:
        KernelBuildError: NVRTC rejected the source or the module did not load.
    """
    import cupy  # here rather than at import: source() is usable without CuPy

    errors = (
        cupy.cuda.compiler.CompileException,
        cupy.cuda.driver.CUDADriverError,
        cupy.cuda.runtime.CUDARuntimeError,
    )
    with cupy.cuda.Device(device_id):
        try:
            mod = cupy.RawModule(
                code=source(name, defines),
                options=("--std=c++17",),
                name_expressions=templates or None,
            )
            mod.compile()
        except errors as exc:
            raise KernelBuildError(
                f"kernels/{name}.cu failed to build for GPU {device_id}: {exc}"
            ) from exc
    return mod


@functools.cache
def sm_count(device_id: int) -> int:
    """Streaming multiprocessors of GPU ``device_id``, read once per process (CuPy's
    ``Device.attributes`` queries every attribute of the device each time it is read, which
    grid sizing on every launch of an eager layer would pay).

    Example:
        >>> sm_count(0)  # an H200  # doctest: +SKIP
        132
    """
    import cupy

    return int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])
