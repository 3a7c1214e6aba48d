"""Compute precision: names, storage dtypes, and float32 accumulation under FP16."""

from __future__ import annotations

import numpy as np
import pytest

from hps_core.errors import ConfigError
from hps_core.nn import ComputeContext, Precision


def test_parse_names_and_members():
    assert Precision.parse("FP16") is Precision.FP16
    assert Precision.parse(Precision.FP32) is Precision.FP32
    with pytest.raises(ConfigError, match="unknown precision 'int8'; expected one of fp32, fp16"):
        Precision.parse("int8")


def test_storage_dtypes():
    assert ComputeContext(np).dtype == np.float32
    assert ComputeContext(np, Precision.FP16).dtype == np.float16
    assert ComputeContext(np, Precision.TF32).dtype == np.float32


@pytest.mark.parametrize("n", [4096, 10001, 30000])
def test_fp16_products_and_sums_accumulate_in_float32(n):
    # A float16 accumulator stops growing at 2048 when adding ones; float32 does not. The
    # product is then rounded once to float16, the storage dtype.
    ctx = ComputeContext(np, Precision.FP16)
    ones = np.ones((2, n), dtype=np.float16)
    product = ctx.matmul(ones, ones.T)
    assert product.dtype == np.float16 and np.all(product == np.float16(n))
    total = ctx.sum(ones, axis=1)
    assert total.dtype == np.float32 and np.all(total == n)
    assert ctx.cast(total).dtype == np.float16
