"""``ModelLookup.lookup_side_by_side`` on the host: several tables' answers (unpooled,
pooled by hotness, by offsets) in the columns of one array, as concatenating
``lookup_queries``' answers gives, against the files' rows (dict reference) and a NumPy float64
pooling; refusals of bags that differ and of an output that does not fit. (On a GPU the cache
bank writes the columns itself: tests/gpu/lookup/test_side_by_side_gpu.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lookup_testdata import write_models
from test_lookup_pooled import pooled_reference

from hps_core.errors import RequestError
from hps_core.hps import HPS
from hps_core.lookup.model_lookup import TableQuery
from hps_core.nn import Combiner

MODEL = {"side": ((500, 4, 0.5), (900, 3, -1.0), (700, 8, 0.0))}


@pytest.mark.parametrize("bags", [1, 9, 400])
def test_answers_side_by_side_in_the_order_asked(tmp_path: Path, bags: int) -> None:
    ps, data = write_models(tmp_path, models=MODEL)
    tables = data["side"]
    rng = np.random.default_rng(bags)
    lengths = rng.integers(0, 6, size=bags)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    k0 = tables[0].queries(rng, 4 * bags)[: 2 * bags]
    k1 = tables[1].queries(rng, 4 * bags)[:bags]
    k2 = tables[2].queries(rng, 4 * int(offsets[-1]) + 4)[: int(offsets[-1])]
    queries = [
        TableQuery(2, k2, Combiner.MEAN, offsets=offsets),
        TableQuery(0, k0, Combiner.SUM, hotness=2),
        TableQuery(1, k1),
    ]
    want = np.concatenate(
        [
            pooled_reference(tables[2].expected(k2), offsets, "mean"),
            pooled_reference(tables[0].expected(k0), np.arange(0, 2 * bags + 1, 2), "sum"),
            tables[1].expected(k1),
        ],
        axis=1,
    )
    lookup = HPS(ps).model("side")
    np.testing.assert_allclose(lookup.lookup_side_by_side(queries), want, rtol=1e-5, atol=1e-5)
    out = np.full((bags, 15), np.nan, np.float32)  # poisoned
    assert lookup.lookup_side_by_side(queries, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_refuses_bags_that_differ_and_an_output_that_does_not_fit(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path, models=MODEL)
    keys = data["side"][0].keys[:6]
    lookup = HPS(ps).model("side")
    with pytest.raises(RequestError, match=r"the same bags, got \[3, 6\]"):
        lookup.lookup_side_by_side([TableQuery(0, keys), TableQuery(1, keys, Combiner.SUM, 2)])
    with pytest.raises(RequestError, match=r"out must be float32 \[6, 7\]"):
        lookup.lookup_side_by_side(
            [TableQuery(0, keys), TableQuery(1, keys)], np.empty((6, 8), np.float32)
        )
    both = lookup.lookup_side_by_side([TableQuery(0, keys), TableQuery(1, keys)])
    np.testing.assert_array_equal(both[:, :4], data["side"][0].expected(keys))
