"""The text the CUDA kernel files are compiled from (built without CuPy: runs without a GPU)."""

from __future__ import annotations

import re

import pytest

from hps_core.cache import stats
from hps_core.cache.kernel_consts import KERNEL_FILE, KERNEL_NAMES, cuda_defines, shared_defines
from hps_core.cuda import kernels
from hps_core.cuda.dense_defines import dense_defines
from hps_core.infer.gpu.constants import bank_defines


@pytest.mark.parametrize(
    ("name", "defines", "entries"),
    [
        (
            "bank",
            bank_defines(),
            ("bank_find", "bank_pool", "bank_probe", "bank_insert"),
        ),
        (KERNEL_FILE, cuda_defines(), KERNEL_NAMES),
    ],
)
def test_set_helpers_are_inlined_once_after_the_defines(
    name: str, defines: str, entries: tuple[str, ...]
) -> None:
    text = kernels.source(name, defines)
    assert text.startswith(defines)
    assert re.search(r"^\s*#\s*include", text, re.M) is None  # NVRTC sees one compile unit
    helpers = (
        "find_way",
        "lru_way",
        "mix64",
        "set_index",
        "set_start",
        "group_way",
        "row_in_bucket",
    )
    for helper in helpers:
        assert len(re.findall(rf"__forceinline__ \w+ {helper}\(", text)) == 1, helper
    for entry in entries:
        bounds = r"(__launch_bounds__\(\w+, \d+\) )?"
        assert re.search(rf'extern "C" __global__ void {bounds}{entry}\(', text), entry


def test_both_files_take_the_shared_constants_from_one_place() -> None:
    shared = kernels.define_lines(shared_defines())
    assert cuda_defines().startswith(shared) and bank_defines().startswith(shared)
    names = ("HITS", "MISSES", "RESERVED_KEY_MISSES", "INSERTS", "EVICTIONS", "UPDATED")
    names += ("KEYS", "UNKNOWN", "HOST_ROWS")
    assert sorted(getattr(stats, n) for n in names) == list(range(stats.NUM_COUNTERS))
    assert all(shared_defines()[n] == getattr(stats, n) for n in (*names, "NUM_COUNTERS"))


@pytest.mark.parametrize(
    ("name", "defines"),
    [("bank", bank_defines()), ("cache", cuda_defines()), ("dense", dense_defines()), ("copy", "")],
)
def test_every_macro_a_file_uses_is_defined_or_generated(name: str, defines: str) -> None:
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", kernels.source(name), flags=re.S)
    own = set(re.findall(r"^\s*#\s*define\s+(\w+)", code, re.M))
    code = re.sub(r"^\s*#[^\n]*", "", code, flags=re.M)
    used = set(re.findall(r"\b([A-Z][A-Z0-9_]*[A-Z0-9])\b", code))
    generated = set(re.findall(r"^#define (\w+)", defines, re.M))
    assert not own & generated
    assert used <= own | generated, used - own - generated
