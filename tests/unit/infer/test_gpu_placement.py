"""Where the GPU pipeline places a model's tables, and how it cuts a batch into lookups
(``hps_core.infer.gpu.placement``, NumPy only), against values worked out by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hps_core.cache.kernel_consts import LANES
from hps_core.infer.gpu.constants import COMBINER_MEAN
from hps_core.infer.gpu.placement import Placement
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


def test_long_bags_are_bags_longer_than_a_group_of_lanes():
    short = layout_of(feed(0, 2, 8, 2 * LANES))
    long = layout_of(feed(0, 1, 8, LANES + 1))
    assert not Placement.of(short, short.tables, True, 8).long_bags
    assert Placement.of(long, long.tables, True, 8).long_bags


def test_pool_runs_cut_slots_where_one_key_tables_meet_multi_key_ones():
    # Slots per table 1, 2, 3, 1, 2 holding at most 1, 2 (one per slot), 6, 1, 2 keys a sample.
    feeds = [feed(0, 1, 8, 1), feed(1, 2, 8, 2), feed(2, 3, 8, 6), feed(3, 1, 8, 1)]
    feeds.append(feed(4, 2, 8, 2))
    lay = layout_of(*feeds)
    placement = Placement.of(lay, lay.tables, concat=True, groups=8)
    assert placement.pool_runs == ((0, 3, True), (3, 6, False), (6, 9, True))
    assert placement.pool_launches(0, 9) == placement.pool_runs
    assert placement.pool_launches(2, 7) == ((2, 3, True), (3, 6, False), (6, 7, True))
    assert placement.pool_launches(4, 5) == ((4, 5, False),)
    assert placement.pool_launches(3, 3) == ()
    every_kind = Placement.of(layout_of(feed(0, 2, 8, 5)), [feed(0, 2, 8, 5)], True, 8)
    assert every_kind.pool_runs == ((0, 2, False),)
