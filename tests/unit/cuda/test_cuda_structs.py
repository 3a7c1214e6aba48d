"""The NumPy mirrors in ``hps_core/cuda/structs.py`` match the CUDA structs byte for byte.

The kernel files are compiled by nvcc (host and device code, as one unit) with a ``main`` that
prints ``sizeof`` and ``offsetof`` of every field; each must equal the dtype's. Skipped where
nvcc is not installed (the CI machine); NVRTC at run time would not catch a mismatch, it
would read the wrong bytes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hps_core.cuda import kernels
from hps_core.cuda.structs import MISS_DTYPE, PENDING_DTYPE, SPAN_DTYPE, TABLE_DTYPE
from hps_core.infer.gpu.constants import bank_defines

NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize(
    ("file", "struct", "dtype"),
    [
        ("bank", "Table", TABLE_DTYPE),
        ("bank", "Miss", MISS_DTYPE),
        ("bank", "Pending", PENDING_DTYPE),
        ("copy", "Span", SPAN_DTYPE),
    ],
)
def test_dtype_mirrors_the_cuda_struct(
    tmp_path: Path, file: str, struct: str, dtype: np.dtype
) -> None:
    prints = "".join(
        f'printf("{name} %zu\\n", offsetof({struct}, {name}));' for name in dtype.names
    )
    main = (
        "\n#include <cstddef>\n#include <cstdio>\n"
        f'int main() {{ printf("sizeof %zu\\n", sizeof({struct})); {prints} return 0; }}\n'
    )
    source = tmp_path / "layout.cu"
    source.write_text(kernels.source(file, bank_defines() if file == "bank" else None) + main)
    binary = tmp_path / "layout"
    subprocess.run(
        [NVCC, "--std=c++17", "-o", str(binary), str(source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    printed = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    got = {name: int(value) for name, value in (line.split() for line in printed.splitlines())}
    want = {"sizeof": dtype.itemsize} | {name: dtype.fields[name][1] for name in dtype.names}
    assert got == want
