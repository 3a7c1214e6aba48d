"""NVRTC, CUDA's run-time compiler, called through ctypes: it compiles kernel source to PTX on a
machine without a GPU or a driver (the CI machine), from the ``nvidia-cuda-nvrtc-cu12`` wheel
the test extra installs. What the GPU would run is checked on the GPU; this checks that the
text compiles, and what the compiler knows (struct layouts, through ``static_assert``)."""

from __future__ import annotations

import ctypes
import glob
from collections.abc import Sequence
from pathlib import Path

ARCH = "compute_90"
"""The H200's architecture (the pipeline compiles for the device it runs on)."""


def _library() -> ctypes.CDLL | None:
    try:
        import nvidia.cuda_nvrtc as wheel  # the wheel's namespace package
    except ImportError:
        return None
    found = sorted(glob.glob(str(Path(next(iter(wheel.__path__))) / "lib" / "libnvrtc.so*")))
    return ctypes.CDLL(found[0]) if found else None


LIBRARY = _library()


def compile_log(name: str, text: str, name_expressions: Sequence[str] = ()) -> tuple[bool, str]:
    """Compile ``text`` (a whole compile unit, called ``name``) for :data:`ARCH`.

    Args:
        name: the unit's file name, for messages.
        text: CUDA C++ source.
        name_expressions: template instantiations to compile (as CuPy's ``name_expressions``).

    Returns:
        Whether it compiled, and NVRTC's log.
    """
    assert LIBRARY is not None
    program = ctypes.c_void_p()
    code = LIBRARY.nvrtcCreateProgram(
        ctypes.byref(program), text.encode(), name.encode(), 0, None, None
    )
    assert code == 0, f"nvrtcCreateProgram: {code}"
    try:
        for expression in name_expressions:
            assert LIBRARY.nvrtcAddNameExpression(program, expression.encode()) == 0
        options = [f"-arch={ARCH}".encode(), b"--std=c++17"]
        status = LIBRARY.nvrtcCompileProgram(
            program, len(options), (ctypes.c_char_p * len(options))(*options)
        )
        size = ctypes.c_size_t()
        LIBRARY.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        LIBRARY.nvrtcGetProgramLog(program, log)
        return status == 0, log.value.decode(errors="replace")
    finally:
        LIBRARY.nvrtcDestroyProgram(ctypes.byref(program))
