"""The text the CUDA kernel files are compiled from (built without CuPy: runs without a GPU)."""

from __future__ import annotations

import re

import pytest

from hps_core.cache.kernel_consts import KERNEL_FILE, KERNEL_NAMES, cuda_defines
from hps_core.cuda import kernels
from hps_core.infer.gpu.constants import bank_defines


@pytest.mark.parametrize(
    ("name", "defines", "entries"),
    [
        ("bank", bank_defines(), ("bank_find", "bank_pool", "bank_probe", "bank_insert")),
        (KERNEL_FILE, cuda_defines(), KERNEL_NAMES),
    ],
)
def test_set_helpers_are_inlined_once_after_the_defines(
    name: str, defines: str, entries: tuple[str, ...]
) -> None:
    text = kernels.source(name, defines)
    assert text.startswith(defines)
    assert re.search(r"^\s*#\s*include", text, re.M) is None  # NVRTC sees one compile unit
    for helper in ("find_way", "lru_way", "mix64"):
        assert len(re.findall(rf"__forceinline__ \w+ {helper}\(", text)) == 1, helper
    for entry in entries:
        assert f'extern "C" __global__ void {entry}(' in text, entry
