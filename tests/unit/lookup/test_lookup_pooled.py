"""Pooled forms of ``HPS.lookup`` on the host tier (fixed hotness, CSR offsets; sum, mean)
against a NumPy float64 pooling of the files' rows; and their errors."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from lookup_testdata import write_models

from hps_core import HPS
from hps_core.errors import RequestError


def pooled_reference(rows: np.ndarray, offsets: np.ndarray, combiner: str) -> np.ndarray:
    """Each bag's rows summed (or averaged) in float64; an empty bag is zeros."""
    out = np.zeros((len(offsets) - 1, rows.shape[1]), np.float64)
    for i, (a, b) in enumerate(itertools.pairwise(offsets)):
        if b > a:
            out[i] = rows[a:b].astype(np.float64).sum(axis=0)
            if combiner == "mean":
                out[i] /= b - a
    return out


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("hotness", [1, 3, 64])
def test_fixed_hotness_pools_each_bag(tmp_path: Path, combiner: str, hotness: int) -> None:
    ps, data = write_models(tmp_path)
    table = data["dcn"][0]
    rng = np.random.default_rng(hotness)
    for bags in (1, 7, 300):
        keys = table.queries(rng, bags * hotness)[: bags * hotness]  # known, unknown, repeats
        got = HPS(ps).lookup(keys, "dcn", 0, hotness=hotness, combiner=combiner)
        offsets = np.arange(0, bags * hotness + 1, hotness)
        want = pooled_reference(table.expected(keys), offsets, combiner)
        assert got.dtype == np.float32 and got.shape == (bags, table.vectors.shape[1])
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("combiner", [None, "sum", "mean"])
def test_offsets_pool_bags_of_any_length(tmp_path: Path, combiner: str | None) -> None:
    ps, data = write_models(tmp_path)
    table = data["wdl"][1]
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 9, size=200)
    lengths[:3] = [0, 0, 1]  # empty bags first, one of one key
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    keys = table.queries(rng, int(offsets[-1]))[: int(offsets[-1])]
    got = HPS(ps).lookup(keys, "wdl", 1, offsets=offsets.astype(np.int32), combiner=combiner)
    want = pooled_reference(table.expected(keys), offsets, combiner or "sum")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    assert not got[:2].any()  # empty bags are zeros, not default vectors


def test_pooled_lookups_refuse_what_does_not_fit(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    keys = data["dcn"][0].keys[:10]
    with pytest.raises(RequestError, match="10 keys do not fill bags of 3"):
        hps.lookup(keys, "dcn", 0, hotness=3)
    with pytest.raises(RequestError, match="hotness of at least 1"):
        hps.lookup(keys, "dcn", 0, hotness=0)
    with pytest.raises(RequestError, match=r"rise from 0 to the number of keys \(10\), got 0 .. 9"):
        hps.lookup(keys, "dcn", 0, offsets=[0, 4, 9])
    with pytest.raises(RequestError, match=r"offsets\[2\] = 3 is below offsets\[1\] = 6"):
        hps.lookup(keys, "dcn", 0, offsets=[0, 6, 3, 10])
    with pytest.raises(RequestError, match="1-D integers"):
        hps.lookup(keys, "dcn", 0, offsets=np.array([0.0, 10.0]))
    with pytest.raises(RequestError, match="hotness or offsets, not both"):
        hps.lookup(keys, "dcn", 0, hotness=5, offsets=[0, 10])
    with pytest.raises(RequestError, match="combiner must be 'sum' or 'mean', got 'max'"):
        hps.lookup(keys, "dcn", 0, hotness=5, combiner="max")
    with pytest.raises(RequestError, match="give hotness or offsets with it"):
        hps.lookup(keys, "dcn", 0, combiner="mean")
    # The instance still answers.
    np.testing.assert_array_equal(hps.lookup(keys, "dcn", 0), data["dcn"][0].expected(keys))
