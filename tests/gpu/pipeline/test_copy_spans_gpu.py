"""``copy_spans`` (``hps_core/cuda/kernels/copy.cu``): many byte spans copied in one launch,
against NumPy copies of the same spans, at every alignment the kernel distinguishes."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from hps_core.cuda import kernels  # noqa: E402
from hps_core.cuda.structs import SPAN_DTYPE  # noqa: E402
from hps_core.infer.gpu.uploads import _COPY_THREADS  # noqa: E402


@pytest.mark.parametrize("blocks", [1, 3, 64])
def test_spans_copy_like_numpy(blocks: int) -> None:
    rng = np.random.default_rng(blocks)
    source = rng.integers(0, 256, 1 << 21, dtype=np.uint8)
    poison = np.full(1 << 21, 0xAB, dtype=np.uint8)
    src, dst = cupy.asarray(source), cupy.asarray(poison)
    # (source offset, target offset, bytes): 16-, 8-, 4- and 1-byte words, empty and large
    # spans, a span that ends one byte short of 16.
    cases = [
        (0, 0, 4096), (16, 8192, 15), (8, 16392, 800), (4, 20004, 4), (1, 30001, 1),
        (33, 40003, 1001), (64, 50000, 0), (4096, 1 << 20, 1 << 19),
    ]  # fmt: skip
    spans = np.zeros(len(cases), SPAN_DTYPE)
    for span, (a, b, n) in zip(spans, cases, strict=True):
        span["src"], span["dst"], span["nbytes"] = src.data.ptr + a, dst.data.ptr + b, n
    table = cupy.asarray(spans.view(np.uint8))
    copy = kernels.module("copy", 0).get_function("copy_spans")
    copy((blocks, len(cases)), (_COPY_THREADS,), (table,))
    want = poison.copy()
    for a, b, n in cases:
        want[b : b + n] = source[a : a + n]
    np.testing.assert_array_equal(dst.get(), want)
