"""The process-wide HPS object: one per ps.json, lazy tables, lookups against dicts, threads."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from lookup_testdata import MODELS, write_models

from hps_core import HPS
from hps_core.errors import ConfigError, RequestError
from hps_core.lookup.model_lookup import DEFAULT_OPTIONS, LookupOptions
from hps_core.lookup.table_lookup import together_positions
from hps_core.tiers.hash_layout import SEARCH_KEYS


def data_files(shm_path: Path) -> list[Path]:
    return sorted(shm_path.glob("*.data"))


def test_one_instance_per_resolved_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ps, _ = write_models(tmp_path)
    hps = HPS(ps)
    assert HPS(str(ps)) is hps and HPS.get(ps) is hps
    monkeypatch.chdir(tmp_path / "wdl")
    assert HPS("../ps.json") is hps
    link = tmp_path / "link.json"
    link.symlink_to(ps)
    assert HPS(link) is hps

    other_dir = tmp_path / "copy"
    other_dir.mkdir()
    other_ps = other_dir / "ps.json"
    other_ps.write_text(ps.read_text().replace('"wdl/', '"../wdl/').replace('"dcn/', '"../dcn/'))
    assert HPS(other_ps) is not hps


def test_creating_the_object_opens_no_table(tmp_path: Path, shm_path: Path) -> None:
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    assert list(shm_path.iterdir()) == []
    hps.lookup(data["wdl"][1].keys[:3], "wdl", 1)
    assert len(data_files(shm_path)) == 1  # only the table that was asked for
    hps.model("dcn").open_all()
    assert len(data_files(shm_path)) == 2


def test_lookup_matches_reference_for_each_table(tmp_path: Path, shm_path: Path) -> None:
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    rng = np.random.default_rng(11)
    for model, tables in data.items():
        for t, table in enumerate(tables):
            queries = table.queries(rng, 2000)
            values = hps.lookup(queries, model, t)
            assert values.dtype == np.float32
            assert values.shape == (len(queries), MODELS[model][t][1])
            np.testing.assert_array_equal(values, table.expected(queries))
    assert len(data_files(shm_path)) == 3


def test_lookup_key_dtypes_and_shapes(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    table = data["dcn"][0]
    small = np.concatenate([np.arange(-5, 5), table.keys[:6]]).astype(np.int64)
    expected = table.expected(small)
    np.testing.assert_array_equal(hps.lookup(small.reshape(2, 8), "dcn", 0), expected)
    np.testing.assert_array_equal(hps.lookup(small.tolist(), "dcn", 0), expected)
    np.testing.assert_array_equal(
        hps.lookup(np.arange(-5, 5, dtype=np.int32), "dcn", 0), expected[:10]
    )
    with pytest.raises(RequestError, match="keys must be integers, got float64"):
        hps.lookup(np.array([1.0, 2.0]), "dcn", 0)
    assert hps.lookup(np.empty(0, np.int64), "dcn", 0).shape == (0, 8)


def test_unknown_model_names_the_known_ones(tmp_path: Path, shm_path: Path) -> None:
    ps, _ = write_models(tmp_path)
    with pytest.raises(ConfigError) as info:
        HPS(ps).lookup(np.array([1], np.int64), "dnc", 0)
    message = str(info.value)
    assert 'no model named "dnc"' in message
    assert '"wdl"' in message and '"dcn"' in message
    assert list(shm_path.iterdir()) == []


@pytest.mark.parametrize(("model", "table_id"), [("wdl", 2), ("wdl", -1), ("dcn", 1)])
def test_table_id_out_of_range(tmp_path: Path, model: str, table_id: int) -> None:
    ps, _ = write_models(tmp_path)
    tables = len(MODELS[model])
    with pytest.raises(
        RequestError, match=f"table_id {table_id} out of range: model '{model}' has {tables}"
    ):
        HPS(ps).lookup(np.array([1], np.int64), model, table_id)


def test_concurrent_lookups_from_threads(tmp_path: Path, shm_path: Path) -> None:
    ps, data = write_models(tmp_path)
    rng = np.random.default_rng(12)
    tasks = [
        (model, t, table.queries(rng, int(rng.integers(4, 600))))
        for _ in range(16)
        for model, tables in data.items()
        for t, table in enumerate(tables)
    ]
    tasks = [tasks[i] for i in rng.permutation(len(tasks))]

    def run(task: tuple[str, int, np.ndarray]) -> np.ndarray:
        model, t, queries = task
        # Every thread asks for the instance too: the first calls race to open the tables.
        return HPS(ps).lookup(queries, model, t)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, tasks))
    for (model, t, queries), values in zip(tasks, results, strict=True):
        np.testing.assert_array_equal(values, data[model][t].expected(queries))
    assert len(data_files(shm_path)) == 3  # each table opened once
    for model, tables in data.items():
        counters = HPS(ps).model(model).counters()
        for t in range(len(tables)):
            mine = [len(q) for m, i, q in tasks if (m, i) == (model, t)]
            assert (counters[t].lookups, counters[t].keys) == (len(mine), sum(mine))


def test_first_calls_released_together_share_one_instance_and_one_table(
    tmp_path: Path, shm_path: Path
) -> None:
    ps, data = write_models(tmp_path)
    table = data["wdl"][1]
    threads = 8
    start = threading.Barrier(threads)

    def first_call(seed: int) -> tuple[HPS, np.ndarray, np.ndarray]:
        queries = table.queries(np.random.default_rng(seed), 200)
        start.wait()  # no HPS and no table exist yet when all threads go
        hps = HPS(ps)
        return hps, queries, hps.lookup(queries, "wdl", 1)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(first_call, range(threads)))
    assert len({id(hps) for hps, _, _ in results}) == 1
    for _, queries, values in results:
        np.testing.assert_array_equal(values, table.expected(queries))
    assert len(data_files(shm_path)) == 1


def test_counters_count_lookups_and_keys(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    queries = data["wdl"][0].queries(np.random.default_rng(13), 100)
    hps.lookup(queries, "wdl", 0)
    hps.lookup(queries[:5], "wdl", 0)
    counters = hps.model("wdl").counters()
    assert (counters[0].lookups, counters[0].keys) == (2, len(queries) + 5)
    assert (counters[1].lookups, counters[1].keys, counters[1].unknown_keys) == (0, 0, 0)


def unknown_occurrences(keys: np.ndarray, known: set[int]) -> int:
    """The positions of ``keys`` whose key ``known`` lacks: each occurrence counted."""
    return sum(k not in known for k in keys.reshape(-1).tolist())


# Calls of up to SEARCH_KEYS keys look each key up, longer ones their distinct keys once;
# either way the counters count key occurrences, and the tier counters each call's distinct
# keys (what the host tier is asked).
@pytest.mark.parametrize("size", [100, SEARCH_KEYS + 500])
def test_counters_count_key_occurrences_per_call(tmp_path: Path, size: int) -> None:
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    table = data["wdl"][0]
    known = set(table.rows.keys())
    calls = [table.queries(np.random.default_rng(seed), size) for seed in (13, 14)]
    calls.append(np.array([1, 1, 1, 2, int(table.keys[0]), int(table.keys[0])], np.int64))
    assert not {1, 2} & known
    for queries in calls:
        np.testing.assert_array_equal(hps.lookup(queries, "wdl", 0), table.expected(queries))
    distinct = [set(q.tolist()) for q in calls]
    [counters, _] = hps.model("wdl").counters()
    assert (counters.lookups, counters.keys) == (3, sum(len(q) for q in calls))
    assert counters.unknown_keys == sum(unknown_occurrences(q, known) for q in calls)
    assert counters.unknown_keys > sum(len(d - known) for d in distinct)  # repeats counted
    assert counters.tier_default_keys == sum(len(d - known) for d in distinct)
    assert counters.tier_host_hits == sum(len(d & known) for d in distinct)
    assert counters.cache_hits == counters.cache_misses == 0  # no GPU cache on the host
    assert counters.hit_rate == 0.0


@pytest.mark.parametrize("size", [8, SEARCH_KEYS - 4, SEARCH_KEYS + 500])
def test_distinct_rows_index_to_what_lookup_returns_and_count_alike(
    tmp_path: Path, size: int
) -> None:
    """``lookup_distinct`` (a row per distinct key, or per key for a few keys) gives
    ``lookup``'s result through its index, unknown keys and repeats included, and counts the
    call as ``lookup`` does."""
    ps, data = write_models(tmp_path)
    model = HPS(ps).model("wdl")
    table = data["wdl"][0]
    queries = table.queries(np.random.default_rng(size), size)  # repeats and unknown keys
    n, distinct = len(queries), set(queries.tolist())
    rows, index = model.lookup_rows_many([0], [queries])[0]
    got = rows if index is None else rows[index]
    assert (index is None) == (n <= SEARCH_KEYS)
    assert index is None or len(rows) == len(distinct)
    np.testing.assert_array_equal(got, table.expected(queries))
    np.testing.assert_array_equal(got, model.lookup(0, queries))
    [first, _] = model.counters()
    assert (first.lookups, first.keys) == (2, 2 * n)
    assert first.unknown_keys == 2 * unknown_occurrences(queries, set(table.rows.keys()))
    assert first.tier_default_keys == 2 * len(distinct - table.rows.keys())


@pytest.mark.parametrize("size", [8, SEARCH_KEYS - 4, SEARCH_KEYS + 500])
def test_tables_looked_up_together_answer_and_count_as_one_by_one(
    tmp_path: Path, size: int
) -> None:
    """Several tables of a few keys each are looked up together (one hashing of every key,
    one count of each table's distinct keys): the vectors equal the dict reference for each
    table (a table asked twice, no keys, 2-D keys, repeats and unknown keys), and each
    table's counters count its lookups as one-by-one lookups would. A table over SEARCH_KEYS
    keys is looked up alone, beside the others together, with the same answers."""
    ps, data = write_models(tmp_path)
    model = HPS(ps).model("wdl")
    rng = np.random.default_rng(size)
    one = data["wdl"][1].keys[:1]  # asked alone twice in a row: two tables' keys meet
    ids = [0, 1, 0, 1, 1, 1]
    keys = [
        data["wdl"][0].queries(rng, size),
        data["wdl"][1].queries(rng, 40).reshape(-1, 2)[: size // 2 + 1],  # 2-D, a row per sample
        np.empty(0, np.int64),
        data["wdl"][1].queries(rng, 24),
        one,
        one.copy(),
    ]
    picked = together_positions([model.table(t) for t in ids], keys)
    assert picked == list(range(len(ids)) if len(keys[0]) <= SEARCH_KEYS else range(1, len(ids)))
    assert together_positions([model.table(0)], keys[:1]) == []  # one table: looked up alone
    got = model.lookup_many(ids, keys)
    for t, k, values in zip(ids, keys, got, strict=True):
        np.testing.assert_array_equal(values, data["wdl"][t].expected(k.reshape(-1)))
    pairs = model.lookup_rows_many(ids, keys)
    for t, k, (rows, index) in zip(ids, keys, pairs, strict=True):
        np.testing.assert_array_equal(rows if index is None else rows[index],
                                      data["wdl"][t].expected(k.reshape(-1)))  # fmt: skip
    counters = model.counters()
    for t in (0, 1):
        asked = [k.reshape(-1) for i, k in zip(ids, keys, strict=True) if i == t]
        distinct = [set(k.tolist()) for k in asked]
        known = data["wdl"][t].rows.keys()
        c = counters[t]
        assert (c.lookups, c.keys) == (2 * len(asked), 2 * sum(len(k) for k in asked))
        assert c.unknown_keys == 2 * sum(unknown_occurrences(k, set(known)) for k in asked)
        assert c.tier_default_keys == 2 * sum(len(d - known) for d in distinct)
        assert c.tier_host_hits == 2 * sum(len(d & known) for d in distinct)
        assert c.seconds > 0
        assert all(type(v) is int for v in (c.keys, c.unknown_keys, c.tier_host_hits))  # JSON


def test_tables_looked_up_together_refuse_keys_of_another_dtype(tmp_path: Path) -> None:
    ps, _ = write_models(tmp_path)
    model = HPS(ps).model("wdl")
    with pytest.raises(TypeError, match="keys must be int64, got int32"):
        model.lookup_many([0, 1], [np.arange(3, dtype=np.int64), np.arange(3, dtype=np.int32)])


def test_lookup_tables_checks_the_table_count(tmp_path: Path) -> None:
    ps, data = write_models(tmp_path)
    lookup = HPS(ps).model("wdl")
    keys = [data["wdl"][0].keys[:3], data["wdl"][1].keys[:2]]
    values = lookup.lookup_tables(keys)
    np.testing.assert_array_equal(values[0], data["wdl"][0].vectors[:3])
    np.testing.assert_array_equal(values[1], data["wdl"][1].vectors[:2])
    with pytest.raises(RequestError, match="got keys for 1 table, model 'wdl' has 2"):
        lookup.lookup_tables(keys[:1])


def test_close_releases_segments_and_forgets_the_instance(tmp_path: Path, shm_path: Path) -> None:
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    for model, tables in data.items():
        for t, table in enumerate(tables):
            hps.lookup(table.keys[:4], model, t)
    assert len(data_files(shm_path)) == 3
    hps.close()
    assert list(shm_path.iterdir()) == []
    again = HPS(ps)
    assert again is not hps
    values = again.lookup(data["dcn"][0].keys[:4], "dcn", 0)
    np.testing.assert_array_equal(values, data["dcn"][0].vectors[:4])
    HPS.close_all()
    assert list(shm_path.iterdir()) == []
    assert HPS(ps) is not again


def test_a_lookup_two_holders_opened_closes_with_the_last(tmp_path: Path, shm_path: Path) -> None:
    """Two holders of one model, device and options (two instances of a Triton model in one
    process) share one lookup: the first to close leaves it serving the other."""
    ps, data = write_models(tmp_path)
    hps = HPS(ps)
    first, second = hps.open_model("dcn"), hps.open_model("dcn")
    assert first is second
    table = data["dcn"][0]
    first.lookup(0, table.keys[:4])
    hps.close_model("dcn")
    np.testing.assert_array_equal(second.lookup(0, table.keys[:4]), table.vectors[:4])
    assert hps.model("dcn") is second  # still the one lookup
    hps.close_model("dcn")
    assert hps.model("dcn") is not second  # the last hold closed it; a new one opens
    hps.close()
    assert list(shm_path.iterdir()) == []


def test_a_served_lookup_is_what_the_models_own_layers_get(tmp_path: Path, shm_path: Path) -> None:
    """A Triton instance serving a user's PyTorch model opens its lookup as served: the
    layers' ``HPS.model(name)`` (no options) is then that lookup, until it closes."""
    ps, _ = write_models(tmp_path)
    hps = HPS(ps)
    options = LookupOptions(share_caches=True)  # not the defaults (no effect on the host)
    plain = hps.model("dcn")
    served = hps.open_model("dcn", None, options, served=True)
    assert served is not plain and hps.model("dcn") is served
    assert hps.model("dcn", None, DEFAULT_OPTIONS) is plain  # asked by options: as before
    assert hps.model("wdl") is not served  # another model: its own
    hps.close_model("dcn", None, options)
    assert hps.model("dcn") is plain
    hps.close()
    assert list(shm_path.iterdir()) == []


def test_two_instances_of_different_ps_json_share_the_tables(
    tmp_path: Path, shm_path: Path
) -> None:
    ps, data = write_models(tmp_path)
    copy = tmp_path / "ps_copy.json"
    copy.write_text(ps.read_text())
    first, second = HPS(ps), HPS(copy)
    assert first is not second
    keys = data["dcn"][0].keys[:8]
    np.testing.assert_array_equal(first.lookup(keys, "dcn", 0), second.lookup(keys, "dcn", 0))
    assert len(data_files(shm_path)) == 1
    first.close()
    np.testing.assert_array_equal(second.lookup(keys, "dcn", 0), data["dcn"][0].vectors[:8])
    second.close()
    assert list(shm_path.iterdir()) == []


def test_broken_ps_json_is_not_cached(tmp_path: Path) -> None:
    ps = tmp_path / "ps.json"
    ps.write_text("{")
    with pytest.raises(ConfigError, match="malformed JSON"):
        HPS(ps)
    good, _ = write_models(tmp_path / "good")
    os.replace(good, ps)
    ps.write_text(ps.read_text().replace('"wdl/', '"good/wdl/').replace('"dcn/', '"good/dcn/'))
    assert HPS(ps).config.model_names == ("wdl", "dcn")


def test_update_source_tables_answer_the_files_through_the_cascade(
    tmp_path: Path, shm_path: Path
) -> None:
    ps, _ = write_models(tmp_path)
    obj = json.loads(ps.read_text())
    obj["update_source"] = {"type": "kafka_message_queue"}
    ps.write_text(json.dumps(obj))
    hps = HPS(ps)
    with_updates = hps.lookup(np.arange(3, dtype=np.int64), "wdl", 0)
    assert hps.model("wdl").table(0).host.has_lower_tiers  # the update overlay below
    hps.close()
    obj["update_source"] = {"type": "null"}
    ps.write_text(json.dumps(obj))
    np.testing.assert_array_equal(
        with_updates, HPS(ps).lookup(np.arange(3, dtype=np.int64), "wdl", 0)
    )


_SCRIPT = """
import os, sys
import numpy as np
from hps_core import HPS
hps = HPS(sys.argv[1])
hps.lookup(np.arange(3, dtype=np.int64), "wdl", 0)
hps.lookup(np.arange(3, dtype=np.int64), "dcn", 0)
if sys.argv[2] == "fork":
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a forked child exits normally: its parent's segments must stay
    os.waitpid(pid, 0)
    print(len([n for n in os.listdir(os.environ["HPS_SHM_DIR"]) if n.endswith(".data")]))
"""


@pytest.mark.parametrize("mode", ["plain", "fork"])
def test_a_script_that_never_closes_leaves_no_segment(tmp_path: Path, shm_path: Path, mode) -> None:
    import subprocess
    import sys

    ps, _ = write_models(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(ps), mode],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "HPS_SHM_DIR": str(shm_path)},
    )  # fmt: skip
    if mode == "fork":
        assert done.stdout.split() == ["2"]  # both tables still there after the child exited
    assert "Traceback" not in done.stderr
    assert list(shm_path.iterdir()) == []  # the script's exit removed what it built
