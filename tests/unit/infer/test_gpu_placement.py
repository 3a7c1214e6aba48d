"""Where the GPU pipeline places a model's tables, and how it cuts a batch into lookups
(``hps_core.infer.gpu.placement``, NumPy only), against values worked out by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hps_core.cache.kernel_consts import LANES, THREADS
from hps_core.infer.gpu.constants import COMBINER_MEAN, POOL_ROWS
from hps_core.infer.gpu.placement import Placement, PoolPlan, pool_split
from hps_core.infer.inputs.layout import RankingLayout, TableFeed
from hps_core.nn import Combiner


def feed(table: int, slots: int, dim: int, keys: int, hotness: int = 1, mean=False) -> TableFeed:
    combiner = Combiner.MEAN if mean else Combiner.SUM
    return TableFeed(table, f"t{table}", f"emb{table}", slots, dim, combiner, keys, hotness)


def layout_of(*feeds: TableFeed) -> RankingLayout:
    return RankingLayout("m", 13, 1, 1024, feeds)


def test_tables_with_outputs_of_their_own_are_padded_to_16_bytes():
    lay = layout_of(feed(0, 1, 3, 1), feed(1, 2, 4, 5, mean=True), feed(2, 1, 8, 1))
    placement = Placement.of(lay, lay.tables, concat=False, groups=8)
    t0, t1, t2 = placement.tables
    assert (t0.keys_at, t1.keys_at, t2.keys_at) == (0, 1, 6)
    assert (t0.offsets_at, t1.offsets_at, t2.offsets_at) == (0, 1, 3)
    # 3 floats round up to 4; 2 slots x 4 = 8; then 8.
    assert (t0.out_at, t1.out_at, t2.out_at) == (0, 4, 12)
    assert (t0.out_stride, t1.out_stride, t2.out_stride) == (3, 8, 8)
    assert t1.combiner == COMBINER_MEAN and t0.combiner == 0
    assert placement.out_per_sample == 20
    assert placement.keys_per_sample == 7
    assert placement.slot_table.tolist() == [0, 1, 1, 2]
    assert placement.slot_local.tolist() == [0, 0, 1, 0]
    assert placement.key_table.tolist() == [0, 1, 1, 1, 1, 1, 2]
    assert placement.slot_table.dtype == placement.key_table.dtype == np.int32


def test_a_concat_of_every_embedding_is_one_output_each_table_a_column_range():
    lay = layout_of(feed(0, 2, 16, 2), feed(1, 3, 16, 3))
    placement = Placement.of(lay, lay.tables, concat=True, groups=8)
    t0, t1 = placement.tables
    assert (t0.out_at, t0.out_shift, t0.out_stride) == (0, 0, 5 * 16)
    assert (t1.out_at, t1.out_shift, t1.out_stride) == (0, 2 * 16, 5 * 16)
    assert placement.out_per_sample == 5 * 16


def test_a_concat_pooled_into_a_wider_row_keeps_its_columns_there():
    lay = layout_of(feed(0, 2, 16, 2), feed(1, 3, 16, 3))
    placement = Placement.of(lay, lay.tables, concat=True, groups=8, concat_row=(128, 44))
    t0, t1 = placement.tables
    assert (t0.out_at, t0.out_shift, t0.out_stride) == (0, 44, 128)
    assert (t1.out_at, t1.out_shift, t1.out_stride) == (0, 44 + 2 * 16, 128)
    assert placement.out_per_sample == 128
    for row in [(128, 2), (126, 44), (100, 44)]:  # unaligned, or too narrow for 80 floats
        with pytest.raises(ValueError, match="cannot pool 80 floats"):
            Placement.of(lay, lay.tables, concat=True, groups=8, concat_row=row)


def test_groups_cut_tables_by_key_room_and_every_slot_is_in_one_group():
    feeds = [feed(t, 1, 8, keys) for t, keys in enumerate([1, 1, 1, 1, 100, 1, 1, 1])]
    lay = layout_of(*feeds)
    placement = Placement.of(lay, lay.tables, concat=True, groups=4)
    assert len(placement.group_keys) <= 4
    # Key columns of the groups tile [0, keys_per_sample) in order.
    assert placement.group_keys[0][0] == 0
    assert placement.group_keys[-1][1] == placement.keys_per_sample == 107
    for (_, stop), (first, _) in itertools.pairwise(placement.group_keys):
        assert stop == first
    slots = [s for first, stop in placement.group_slots for s in range(first, stop)]
    assert slots == list(range(placement.slots))
    parts = placement.parts(4096, grouped=True)
    assert [p[0] for p in parts] == list(placement.group_keys)
    assert all(p[2] == (0, 4096) for p in parts)
    assert placement.parts(64, grouped=False) == (((0, 107), (0, 8), (0, 64)),)


@pytest.mark.parametrize("hotness, sample_major", [((1, 1), True), ((2, 1), False)])
def test_sample_rows_are_cut_only_for_requests_that_fill_every_room(hotness, sample_major):
    lay = layout_of(feed(0, 1, 8, 1, hotness[0]), feed(1, 1, 8, 1, hotness[1]))
    placement = Placement.of(lay, lay.tables, concat=True, groups=3)
    assert (placement.sample_hotness is not None) == sample_major
    rows = placement.row_parts(16, grouped=True)
    if sample_major:
        assert [p[2] for p in rows] == [(0, 5), (5, 10), (10, 16)]
        assert all(p[:2] == ((0, 2), (0, 2)) for p in rows)
    else:
        assert rows == ()
    assert placement.row_parts(16, grouped=False) == ()


@pytest.mark.parametrize(
    ("slots", "keys", "split"),
    [(1, 1, POOL_ROWS), (2, 2, POOL_ROWS), (2, 3, 1), (1, 2 * LANES, 1), (1, 2 * LANES + 1, 2),
     (1, 27, 2), (1, 4 * LANES, 2), (1, 100, 4), (2, 200, 4), (1, 10_000, 4), (3, 6, 1)],
)  # fmt: skip
def test_pool_split_grows_with_the_keys_of_a_bag(slots: int, keys: int, split: int):
    assert pool_split(feed(0, slots, 8, keys)) == split


def test_pool_plans_put_alike_slots_in_segments_longest_bags_first():
    # Slots per table 1, 2, 3, 1, 2, 1 holding at most 1, 2 (one per slot), 6, 1, 2, 100 keys.
    feeds = [feed(0, 1, 8, 1), feed(1, 2, 8, 2), feed(2, 3, 8, 6), feed(3, 1, 8, 1)]
    feeds += [feed(4, 2, 8, 2), feed(5, 1, 8, 100)]
    lay = layout_of(*feeds)
    placement = Placement.of(lay, lay.tables, concat=True, groups=8)
    assert placement.slot_split == (0, 0, 0, 1, 1, 1, 0, 0, 0, 4)
    assert placement.pool_plan(0, 10).segments == (
        (4, (9,)), (1, (3, 4, 5)), (POOL_ROWS, (0, 1, 2, 6, 7, 8)),
    )  # fmt: skip
    assert placement.pool_plan(2, 7).segments == ((1, (3, 4, 5)), (POOL_ROWS, (2, 6)))
    assert placement.pool_plan(3, 3).segments == ()
    plan = placement.pool_plan(2, 7)
    # segments, then (split, count, where its slots are listed) each, then the lists
    np.testing.assert_array_equal(plan.words(), [2, 1, 3, 7, POOL_ROWS, 2, 10, 3, 4, 5, 2, 6])
    assert plan.words().dtype == np.int32


def covered_bags(plan: PoolPlan, samples: int) -> list[tuple[int, int]]:
    """The (slot, sample) bags that ``bank_pool``'s threads serve, read from the plan's words
    as the kernel reads them (each segment's threads start a block of THREADS)."""
    words = plan.words()
    bags = []
    first_block = 0
    for k in range(words[0]):
        split, count, at = (int(w) for w in words[1 + 3 * k : 4 + 3 * k])
        slots = words[at : at + count]
        if split == POOL_ROWS:
            groups_per_slot = -(-samples // LANES)
            lanes = groups_per_slot * LANES * count
            for group in range(groups_per_slot * count):
                first = (group % groups_per_slot) * LANES
                for sample in range(first, min(first + LANES, samples)):
                    bags.append((int(slots[group // groups_per_slot]), sample))
        else:
            lanes = samples * count * LANES * split
            bags += [(int(slots[b // samples]), b % samples) for b in range(samples * count)]
        first_block += -(-lanes // THREADS)
    assert first_block == plan.blocks(samples)
    return bags


@pytest.mark.parametrize("samples", [1, 7, 8, 9, 100, 2048])
@pytest.mark.parametrize(("first", "stop"), [(0, 10), (2, 7), (9, 10), (4, 4)])
def test_a_pool_plan_serves_every_bag_of_its_slots_once(samples: int, first: int, stop: int):
    feeds = [feed(0, 1, 8, 1), feed(1, 2, 8, 2), feed(2, 3, 8, 6), feed(3, 1, 8, 1)]
    feeds += [feed(4, 2, 8, 2), feed(5, 1, 8, 100)]
    lay = layout_of(*feeds)
    plan = Placement.of(lay, lay.tables, concat=True, groups=8).pool_plan(first, stop)
    got = sorted(covered_bags(plan, samples))
    assert got == [(s, b) for s in range(first, stop) for b in range(samples)]
