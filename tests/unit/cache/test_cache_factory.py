"""make_cache: kind and array module pick the implementation; bad requests say why."""

from __future__ import annotations

import types
from enum import Enum

import numpy as np
import pytest

from hps_core.cache import StaticTable, make_cache, num_sets_for
from hps_core.errors import ConfigError, NotAvailableError


class Kind(str, Enum):
    DYNAMIC = "dynamic"
    STATIC = "static"


@pytest.mark.parametrize(("rows", "sets"), [(0, 1), (1, 1), (64, 1), (65, 2), (6400, 100)])
def test_dynamic_caches_are_sized_like_hps(rows: int, sets: int) -> None:
    assert num_sets_for(rows) == sets  # whole 64-row sets, at least one


def test_a_dynamic_cache_in_host_memory_is_refused() -> None:
    # Only the tests' NumPy twin lives in host memory; no serving path has such a cache.
    with pytest.raises(TypeError, match=r"'m\.t0': a dynamic cache lives on a GPU"):
        make_cache(Kind.DYNAMIC, 10, 2, np, name="m.t0")


def test_enum_members_are_accepted_as_kind() -> None:
    contents = (np.array([1, 2]), np.ones((2, 2), np.float32))
    assert isinstance(make_cache(Kind.STATIC, 2, 2, contents=contents), StaticTable)


def test_static_cache_holds_its_contents() -> None:
    keys = np.array([5, -5, 9])
    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    table = make_cache("static", 3, 2, np, contents=(keys, values))
    got, hit = table.query(np.array([-5, 4]))
    assert hit.tolist() == [True, False]
    np.testing.assert_array_equal(got[0], [2, 3])


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"kind": "lru"}, ConfigError, "unknown cache kind 'lru'"),
        ({"kind": "uvm"}, NotAvailableError, "'uvm' is not implemented"),
        ({"kind": "stochastic"}, NotAvailableError, "not implemented"),
        ({"kind": "static"}, ValueError, "needs contents"),
        ({"contents": ([1], [[1.0, 2.0]])}, ValueError, "starts empty"),
        ({"capacity_rows": -1}, ValueError, "must not be negative"),
        ({"capacity_rows": 2.5}, ValueError, "must be an integer"),
        ({"xp": types.SimpleNamespace(__name__="torch")}, TypeError, "numpy or cupy"),
        (
            {"kind": "static", "contents": ([1, 2], np.ones((2, 3), np.float32))},
            ValueError,
            "width 3",
        ),
        (
            {"kind": "static", "capacity_rows": 1, "contents": ([1, 2], np.ones((2, 2)))},
            ValueError,
            "at most 1 rows",
        ),
    ],
)
def test_bad_requests_are_explained(kwargs: dict, error: type, fragment: str) -> None:
    args = {"kind": "dynamic", "capacity_rows": 100, "dim": 2, "xp": np, "name": "m.t3"}
    args.update(kwargs)
    with pytest.raises(error) as info:
        make_cache(**args)
    assert fragment in str(info.value)
    assert "m.t3" in str(info.value)
