"""Every kernel file compiles, with the constants and template instantiations it is compiled
with at run time (NVRTC, no GPU needed: see ``nvrtc.py``). What the kernels compute is checked
on the GPU (``tests/gpu``); this catches a kernel that would not build, on any machine."""

from __future__ import annotations

import pytest
from nvrtc import LIBRARY, compile_log

from hps_core.cache.kernel_consts import KERNEL_FILE, cuda_defines
from hps_core.cuda import kernels
from hps_core.cuda.dense_defines import DENSE_TEMPLATES, dense_defines
from hps_core.infer.gpu.constants import bank_defines

pytestmark = pytest.mark.skipif(
    LIBRARY is None, reason="NVRTC is not installed (pip install nvidia-cuda-nvrtc-cu12)"
)


@pytest.mark.parametrize(
    ("file", "defines", "templates"),
    [
        ("bank", bank_defines(), ()),
        (KERNEL_FILE, cuda_defines(), ()),
        ("copy", None, ()),
        ("dense", dense_defines(), DENSE_TEMPLATES),
    ],
)
def test_every_kernel_file_compiles(file: str, defines: str | None, templates: tuple) -> None:
    ok, log = compile_log(f"{file}.cu", kernels.source(file, defines), templates)
    assert ok, log


def test_a_kernel_that_does_not_compile_fails_with_the_compilers_message() -> None:
    """The check can fail: a constant left undefined is NVRTC's error, naming it."""
    ok, log = compile_log("dense.cu", kernels.source("dense"), DENSE_TEMPLATES)
    assert not ok and "CONCAT_INPUTS" in log
