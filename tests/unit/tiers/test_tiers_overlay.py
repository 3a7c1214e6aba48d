"""The update overlay (``hps_core.tiers.overlay``) against a dict: inserts, overwrites,
repeated keys in one insert (the last wins), removal, unknown tables and keys, wrong widths.
Its bounds (ps.json ``volatile_db.overflow_*``) against a plain-dict model of HugeCTR's
policies: the margin per partition after every insert, the rows evicted, storage reused, and
the factory passing the fields through."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiers_testdata import one_model_ps

from hps_core.config import OverflowPolicy, load_ps_config
from hps_core.errors import RequestError
from hps_core.formats.sparse_writer import write_sparse_table
from hps_core.tiers.factory import open_table_tiers
from hps_core.tiers.overlay import OverlayStore


def test_overlay_matches_a_dict_over_random_inserts(rng: np.random.Generator) -> None:
    store, reference, dim = OverlayStore(), {}, 5
    for _ in range(40):
        n = int(rng.integers(0, 3000))
        keys = rng.integers(-50_000, 50_000, n).astype(np.int64)  # repeats within and across
        vectors = rng.standard_normal((n, dim)).astype(np.float32)
        store.insert("t", keys, vectors)
        reference.update(zip(keys.tolist(), vectors, strict=True))  # the last occurrence wins
        probe = rng.integers(-60_000, 60_000, 500).astype(np.int64)
        values, found = store.lookup("t", probe, dim, default=-2.0)
        for key, value, hit in zip(probe.tolist(), values, found, strict=True):
            assert hit == (key in reference)
            np.testing.assert_array_equal(value, reference.get(key, np.full(dim, -2.0)))
    assert store.rows("t") == len(reference)
    assert store.tables() == ["t"] and store.errors == 0


def test_remove_forgets_keys_and_tables_are_separate() -> None:
    store = OverlayStore()
    store.insert("a", np.array([1, 2, 3]), np.arange(6, dtype=np.float32).reshape(3, 2))
    store.insert("b", np.array([1]), np.full((1, 2), 9, np.float32))
    store.remove("a", np.array([2, 99]))
    values, found = store.lookup("a", np.array([1, 2, 3]), 2)
    assert found.tolist() == [True, False, True]
    assert values.tolist() == [[0, 1], [0, 0], [4, 5]]
    assert store.lookup("b", np.array([1]), 2)[0].tolist() == [[9, 9]]
    assert store.lookup("none", np.array([1]), 2)[1].tolist() == [False]
    store.insert("a", np.array([2]), np.full((1, 2), 7, np.float32))  # back after removal
    assert store.lookup("a", np.array([2]), 2)[0].tolist() == [[7, 7]]
    store.close()
    assert store.tables() == []


def test_bad_shapes_are_refused_and_change_nothing() -> None:
    store = OverlayStore()
    store.insert("t", np.array([1]), np.ones((1, 4), np.float32))
    with pytest.raises(RequestError, match="4"):
        store.insert("t", np.array([2]), np.ones((1, 3), np.float32))
    with pytest.raises(RequestError, match="2 keys"):
        store.insert("t", np.array([2, 3]), np.ones((1, 4), np.float32))
    assert store.rows("t") == 1


# --- bounds: volatile_db.overflow_margin / overflow_policy / overflow_resolution_target ------

_MASK = (1 << 64) - 1


def _rotr(x: int, n: int) -> int:
    return ((x >> n) | (x << (64 - n))) & _MASK


def hugectr_partition(key: int, partitions: int) -> int:
    """HugeCTR's ``rrxmrrxmsx_0(key) % num_partitions`` on Python integers."""
    x = key & _MASK
    x ^= _rotr(x, 25) ^ _rotr(x, 50)
    x = (x * 0xA24BAED4963EE407) & _MASK
    x ^= _rotr(x, 24) ^ _rotr(x, 49)
    x = (x * 0x9FB21C651E98DF25) & _MASK
    x ^= x >> 28
    return x % partitions


class BoundedReference:
    """The overlay's bounds as plain dicts: per key its vector, the tick of its last insert
    (or hit, for ``evict_oldest``) and its uses since the last insert; a partition above the
    margin after an insert loses its excess, oldest (or fewest uses, then oldest) first."""

    def __init__(self, margin: int, policy: OverflowPolicy, target: float, partitions: int):
        self.margin, self.policy, self.partitions = margin, policy, partitions
        self.resolution = int(margin * target + 0.5)
        self.rows: dict[int, np.ndarray] = {}
        self.tick: dict[int, int] = {}
        self.uses: dict[int, int] = {}
        self.clock = 0
        self.evictions = 0

    def part(self, key: int) -> int:
        return hugectr_partition(key, self.partitions)

    def sizes(self) -> list[int]:
        sizes = [0] * self.partitions
        for key in self.rows:
            sizes[self.part(key)] += 1
        return sizes

    def insert(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        for key, vector in zip(keys.tolist(), vectors, strict=True):
            self.clock += 1
            self.rows[key], self.tick[key], self.uses[key] = vector.copy(), self.clock, 0
        for part, size in enumerate(self.sizes()):
            if size > self.margin:
                self._evict(part)

    def _evict(self, part: int) -> None:
        members = [k for k in self.rows if self.part(k) == part]
        if self.policy is OverflowPolicy.EVICT_OLDEST:
            members.sort(key=lambda k: self.tick[k])
        else:
            members.sort(key=lambda k: (self.uses[k], self.tick[k]))
        excess = len(members) - self.resolution
        for key in members[:excess]:
            del self.rows[key], self.tick[key], self.uses[key]
        self.evictions += excess
        survivors = members[excess:]
        if self.policy is OverflowPolicy.EVICT_LEAST_USED and survivors:
            least = self.uses[survivors[0]]
            for key in survivors:
                self.uses[key] = (self.uses[key] - least) // 2

    def lookup(self, keys: np.ndarray, dim: int, default: float) -> tuple[np.ndarray, np.ndarray]:
        values = np.full((len(keys), dim), default, np.float32)
        found = np.zeros(len(keys), bool)
        for i, key in enumerate(keys.tolist()):
            if key in self.rows:
                values[i], found[i] = self.rows[key], True
                if self.policy is OverflowPolicy.EVICT_OLDEST:
                    self.clock += 1
                    self.tick[key] = self.clock
                else:
                    self.uses[key] += 1
        return values, found


def random_message(
    rng: np.random.Generator, universe: int, most: int, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``most`` keys of ``universe`` (spread over int64, repeats likely) and vectors."""
    n = int(rng.integers(0, most + 1))
    keys = (rng.integers(0, universe, n) * 0x9E3779B97F4A7 - 2**62).astype(np.int64)
    return keys, rng.standard_normal((n, dim)).astype(np.float32)


def assert_bounded(store: OverlayStore, margin: int, partitions: int, largest: int) -> None:
    """Every partition within the margin; storage within the bound plus the largest message."""
    sizes = store.partition_sizes("t")
    assert len(sizes) == partitions and max(sizes) <= margin
    assert sum(sizes) == store.rows("t") == len(store.keys("t"))
    assert store.allocated("t") <= margin * partitions + largest


CASES = [
    pytest.param(margin, parts, dim, id=f"margin{margin}-parts{parts}-dim{dim}")
    for margin, parts, dim in [
        (1, 1, 1),
        (1, 3, 16),
        (7, 1, 128),
        (7, 5, 1),
        (7, 16, 16),
        (1000, 1, 16),
        (1000, 4, 128),
    ]
]


@pytest.mark.parametrize(
    "policy", [OverflowPolicy.EVICT_OLDEST, OverflowPolicy.EVICT_LEAST_USED], ids=lambda p: p.value
)
@pytest.mark.parametrize(("margin", "parts", "dim"), CASES)
def test_oldest_and_least_used_match_a_dict_model(
    rng: np.random.Generator, policy: OverflowPolicy, margin: int, parts: int, dim: int
) -> None:
    target = float(rng.choice([0.5, 0.8, 0.99]))
    store = OverlayStore(margin=margin, policy=policy, target=target, partitions=parts)
    reference = BoundedReference(margin, policy, target, parts)
    universe = 3 * margin * parts + 2
    most = min(3000, 2 * margin * parts + 2)
    largest = 0
    for _ in range(30):
        keys, vectors = random_message(rng, universe, most, dim)
        store.insert("t", keys, vectors)
        reference.insert(keys, vectors)
        largest = max(largest, len(keys))
        assert_bounded(store, margin, parts, largest)
        assert store.keys("t").tolist() == sorted(reference.rows)
        assert store.partition_sizes("t") == reference.sizes()
        # Lookups move keys up the policy's order (hits, repeats, misses).
        for _ in range(int(rng.integers(0, 3))):
            probe, _ = random_message(rng, universe, 2 * margin * parts + 2, 0)
            values, found = store.lookup("t", probe, dim, default=-3.0)
            want, want_found = reference.lookup(probe, dim, -3.0)
            np.testing.assert_array_equal(found, want_found)
            np.testing.assert_array_equal(values, want)
    assert store.evictions == store.table_evictions("t") == reference.evictions > 0
    everything = np.array(sorted(reference.rows), np.int64)
    np.testing.assert_array_equal(
        store.lookup("t", everything, dim)[0], reference.lookup(everything, dim, 0.0)[0]
    )


@pytest.mark.parametrize(("margin", "parts", "dim"), CASES)
def test_random_eviction_keeps_the_bound_and_the_last_rows(
    rng: np.random.Generator, margin: int, parts: int, dim: int
) -> None:
    target = 0.8
    store = OverlayStore(margin=margin, target=target, partitions=parts, seed=7)
    resolution = int(margin * target + 0.5)
    written: dict[int, np.ndarray] = {}  # every key ever written: its last vector
    held: set[int] = set()
    universe = 3 * margin * parts + 2
    most = min(3000, 2 * margin * parts + 2)
    evicted = largest = 0
    for _ in range(30):
        keys, vectors = random_message(rng, universe, most, dim)
        before = store.partition_sizes("t")
        store.insert("t", keys, vectors)
        written.update(zip(keys.tolist(), vectors, strict=True))
        largest = max(largest, len(keys))
        assert_bounded(store, margin, parts, largest)
        # Each partition holds what it held plus the message's new keys, or, if that went
        # past the margin, exactly the resolution target.
        grown = list(before)
        for key in set(keys.tolist()) - held:
            grown[hugectr_partition(key, parts)] += 1
        after = store.partition_sizes("t")
        for size, want in zip(after, grown, strict=True):
            assert size == (want if want <= margin else resolution)
        survivors = set(store.keys("t").tolist())
        assert survivors <= held | set(keys.tolist())
        evicted += len(held | set(keys.tolist())) - len(survivors)
        held = survivors
        assert store.evictions == evicted
        # Survivors answer their last vector; evicted and unknown keys are not found.
        probe = np.array([*sorted(written), 2**62 + 5], np.int64)
        values, found = store.lookup("t", probe, dim, default=-3.0)
        assert found.tolist() == [k in held for k in probe.tolist()]
        want = [written[k] if k in held else np.full(dim, -3.0) for k in probe.tolist()]
        np.testing.assert_array_equal(values, np.array(want, np.float32).reshape(len(probe), dim))
    assert evicted > 0


@pytest.mark.parametrize("policy", list(OverflowPolicy), ids=lambda p: p.value)
def test_bounded_insert_is_all_or_nothing(rng: np.random.Generator, policy: OverflowPolicy) -> None:
    store = OverlayStore(margin=7, policy=policy, partitions=3, seed=1)
    keys, vectors = random_message(rng, 100, 60, 4)
    store.insert("t", keys, vectors)
    state = (
        store.keys("t").tolist(),
        store.partition_sizes("t"),
        store.evictions,
        store.allocated("t"),
        store.lookup("t", keys, 4)[0].tolist(),
    )
    big = (np.arange(40) + 1000).astype(np.int64)
    with pytest.raises(RequestError, match="4"):
        store.insert("t", big, np.ones((40, 5), np.float32))  # wrong width
    with pytest.raises(RequestError, match="40 keys"):
        store.insert("t", big, np.ones((39, 4), np.float32))  # one vector short
    with pytest.raises(RequestError, match="40 keys"):
        store.insert("t", big, np.ones(40 * 4, np.float32))  # not [n, dim]
    assert state == (
        store.keys("t").tolist(),
        store.partition_sizes("t"),
        store.evictions,
        store.allocated("t"),
        store.lookup("t", keys, 4)[0].tolist(),
    )


def test_no_margin_evicts_nothing(rng: np.random.Generator) -> None:
    store = OverlayStore(policy=OverflowPolicy.EVICT_LEAST_USED, partitions=4)
    keys = np.arange(50_000, dtype=np.int64) * 31
    vectors = rng.standard_normal((50_000, 2)).astype(np.float32)
    for start in range(0, 50_000, 5000):
        store.insert("t", keys[start : start + 5000], vectors[start : start + 5000])
    values, found = store.lookup("t", keys, 2)
    assert found.all() and store.evictions == 0 and store.rows("t") == 50_000
    np.testing.assert_array_equal(values, vectors)


@pytest.mark.parametrize("policy", list(OverflowPolicy), ids=lambda p: p.value)
def test_a_key_inserted_again_after_its_eviction_is_found(policy: OverflowPolicy) -> None:
    store = OverlayStore(margin=2, policy=policy, target=0.5)
    for key in (1, 2, 3):
        store.insert("t", np.array([key]), np.full((1, 2), key, np.float32))
    assert store.rows("t") == 1 and store.evictions == 2  # 3 rows > 2: shrunk to 1
    gone = min({1, 2, 3} - set(store.keys("t").tolist()))
    assert not store.lookup("t", np.array([gone]), 2)[1][0]
    store.insert("t", np.array([gone]), np.full((1, 2), 5, np.float32))  # 2 rows: no eviction
    values, found = store.lookup("t", np.array([gone]), 2)
    assert found.tolist() == [True] and values.tolist() == [[5, 5]]
    assert store.allocated("t") <= 3


def test_oldest_keeps_the_recently_read_and_least_used_the_often_read() -> None:
    ones = np.ones((4, 1), np.float32)
    # Margin 4, target 0.75: a fifth row shrinks the table to 3.
    oldest = OverlayStore(margin=4, policy=OverflowPolicy.EVICT_OLDEST, target=0.75)
    oldest.insert("t", np.array([1, 2, 3, 4]), ones)
    oldest.lookup("t", np.array([1, 2]), 1)  # 3 and 4 are now the oldest
    oldest.insert("t", np.array([5]), ones[:1])
    assert oldest.keys("t").tolist() == [1, 2, 5]
    least = OverlayStore(margin=4, policy=OverflowPolicy.EVICT_LEAST_USED, target=0.75)
    least.insert("t", np.array([1, 2, 3, 4]), ones)
    least.lookup("t", np.array([4, 4, 3, 9]), 1)
    least.insert("t", np.array([5]), ones[:1])  # 1, 2 and 5 unused: 1 and 2 (older) go
    assert least.keys("t").tolist() == [3, 4, 5]
    least.lookup("t", np.array([3, 5, 4, 4]), 1)
    least.insert("t", np.array([4]), ones[:1])  # an update resets its count to 0
    least.insert("t", np.array([6, 7]), ones[:2])  # 4, 6, 7 unused: 4 and 6 (older) go
    assert least.keys("t").tolist() == [3, 5, 7]


@pytest.mark.parametrize("policy", [OverflowPolicy.EVICT_OLDEST, OverflowPolicy.EVICT_LEAST_USED])
def test_uncounted_reads_do_not_change_what_is_evicted(policy: OverflowPolicy) -> None:
    """The updater's own reads (``count=False``) are not uses: 1 and 2 stay the oldest and
    least used, and go first."""
    ones = np.ones((4, 1), np.float32)
    store = OverlayStore(margin=4, policy=policy, target=0.75)
    store.insert("t", np.array([1, 2, 3, 4]), ones)
    store.lookup("t", np.array([3, 4]), 1)
    values, found = store.lookup("t", np.array([1, 2, 1, 9]), 1, count=False)
    assert found.tolist() == [True, True, True, False] and values[:3].all()
    store.insert("t", np.array([5]), ones[:1])
    assert store.keys("t").tolist() == [3, 4, 5]


def test_removed_and_evicted_rows_are_reused(rng: np.random.Generator) -> None:
    store = OverlayStore()
    store.insert("t", np.arange(3000), np.ones((3000, 8), np.float32))
    allocated = store.allocated("t")
    for round_ in range(1, 6):
        store.remove("t", np.arange(3000) + 3000 * (round_ - 1))
        store.insert("t", np.arange(3000) + 3000 * round_, np.ones((3000, 8), np.float32))
        assert store.rows("t") == 3000 and store.allocated("t") == allocated
    bounded = OverlayStore(margin=100, partitions=2, seed=3)
    for start in range(0, 100_000, 1000):
        bounded.insert("t", np.arange(start, start + 1000), np.ones((1000, 8), np.float32))
        assert bounded.allocated("t") <= 200 + 1000
    assert bounded.evictions == 100_000 - bounded.rows("t")


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="overflow_margin"):
        OverlayStore(margin=0)
    with pytest.raises(ValueError, match="num_partitions"):
        OverlayStore(margin=5, partitions=0)
    with pytest.raises(ValueError, match="overflow_resolution_target"):
        OverlayStore(margin=5, target=0.0)


@pytest.mark.parametrize("volatile_type", ["hash_map", "parallel_hash_map", "disabled"])
def test_the_factory_bounds_the_overlay_with_the_volatile_db_fields(
    tmp_path: Path, volatile_type: str
) -> None:
    write_sparse_table(tmp_path / "t0", np.arange(5), np.ones((5, 4), np.float32))
    volatile = {
        "type": volatile_type,
        "num_partitions": 3,
        "overflow_margin": 20,
        "overflow_policy": "evict_least_used",
        "overflow_resolution_target": 0.5,
    }
    ps = one_model_ps(
        volatile_db=volatile,
        persistent_db={"type": "disabled"},
        update_source={"type": "kafka_message_queue"},
    )
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(ps))
    cfg = load_ps_config(path)
    table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    try:
        tier = table.lower_store("overlay")
        assert tier is not None
        overlay = tier.store
        assert isinstance(overlay, OverlayStore)
        assert (overlay.margin, overlay.resolution, overlay.partitions) == (20, 10, 3)
        assert overlay.policy is OverflowPolicy.EVICT_LEAST_USED
        overlay.insert(tier.table, np.arange(100, 400), np.ones((300, 4), np.float32))
        assert max(overlay.partition_sizes(tier.table)) <= 20
        assert overlay.rows(tier.table) < 60 and overlay.evictions > 0
    finally:
        table.close()
    # Without overflow_margin: unbounded, as before.
    del ps["volatile_db"]["overflow_margin"]
    path.write_text(json.dumps(ps))
    cfg = load_ps_config(path)
    table = open_table_tiers(cfg, "m", cfg.models[0].tables[0])
    try:
        overlay = table.lower_store("overlay").store
        overlay.insert("x", np.arange(3000), np.ones((3000, 4), np.float32))
        assert overlay.margin is None and overlay.rows("x") == 3000 and overlay.evictions == 0
    finally:
        table.close()
