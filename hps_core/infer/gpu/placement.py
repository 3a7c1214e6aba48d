"""Where a model's tables sit in the GPU pipeline's buffers, and how a batch is cut into
lookups (NumPy only, fixed when the pipeline is made).

A batch of ``B`` samples (its size bucket) holds, per table the dense network reads, room for
``max_keys_per_sample`` keys per sample (:class:`TablePlacement`), its slots' row offsets, and
its pooled output: each table's own ``[B, S_t, D_t]`` region, or its slots' columns of the one
``[B, S, D]`` output of a Concat of every embedding. Large batches are copied and looked up in
parts, so that the lookup of one part runs while the next is copied: runs of tables of about
equal key room (a batch staged table by table) or ranges of samples (a batch staged as its
request's ``[B, K]`` key matrix).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hps_core.cache.kernel_consts import LANES, THREADS, WARP
from hps_core.infer.gpu.constants import COMBINER_MEAN, POOL_ROWS
from hps_core.infer.inputs.layout import RankingLayout, TableFeed
from hps_core.nn import Combiner

Part = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
"""Key columns, slots and samples ``[first, stop)`` of one ``bank_find`` + ``bank_pool``."""

_MAX_SPLIT = WARP // LANES
"""Most groups of ``LANES`` lanes that share a bag in ``bank_pool`` (a warp)..."""
_KEYS_PER_GROUP = 2 * LANES
"""... one more group (doubling) per this many keys a bag of the slot holds: a bag of 100 keys
takes 4 groups, one of 27 two, one of 12 one, so that the longest bags of a part do not keep
one group busy while the others are done."""


def pool_split(feed: TableFeed) -> int:
    """How ``bank_pool`` pools the slots of a table: ``POOL_ROWS`` when it holds at most one
    key per slot and sample (its bags are copied as rows), else the groups of ``LANES`` lanes
    that share a bag (1, 2 or 4, from the keys of an average bag).

    Example:
        >>> [pool_split(f) for f in layout.tables]  # doctest: +SKIP
        [0, 1, 4]
    """
    if feed.max_keys_per_sample <= feed.slot_num:
        return POOL_ROWS
    keys = -(-feed.max_keys_per_sample // max(feed.slot_num, 1))
    split = 1
    while split < _MAX_SPLIT and keys > split * _KEYS_PER_GROUP:
        split *= 2
    return split


@dataclass(frozen=True)
class PoolPlan:
    """The pooling of a range of slots in one ``bank_pool`` launch: the slots in segments of
    alike slots (each pooled one way), the longest bags first.

    Args:
        segments: ``(split, slots)`` per segment, in launch order (``split`` as
            :func:`pool_split`).
    """

    segments: tuple[tuple[int, tuple[int, ...]], ...]

    @classmethod
    def of(cls, splits: Sequence[int], first: int, stop: int) -> PoolPlan:
        """The plan of slots ``[first, stop)`` given each slot's split: segments by split,
        the largest first and the one-key slots last, each listing its slots in order."""
        by_split: dict[int, list[int]] = {}
        for slot in range(first, stop):
            by_split.setdefault(int(splits[slot]), []).append(slot)
        order = sorted(by_split, key=lambda split: -split if split != POOL_ROWS else 1)
        return cls(tuple((split, tuple(by_split[split])) for split in order))

    def words(self) -> np.ndarray:
        """The plan as ``bank_pool`` reads it (int32): the number of segments, per segment its
        split, slot count and where its slots are listed, then the lists."""
        head = 1 + 3 * len(self.segments)
        words = [len(self.segments)]
        at = head
        for split, slots in self.segments:
            words += [split, len(slots), at]
            at += len(slots)
        for _, slots in self.segments:
            words += slots
        return np.asarray(words, dtype=np.int32)

    def blocks(self, samples: int) -> int:
        """Blocks of ``THREADS`` threads of a launch over ``samples`` samples (as ``bank_pool``
        cuts them: every segment's threads start a block)."""
        total = 0
        for split, slots in self.segments:
            if split == POOL_ROWS:
                lanes = -(-samples // LANES) * LANES * len(slots)
            else:
                lanes = samples * len(slots) * LANES * split
            total += -(-lanes // THREADS)
        return total


@dataclass(frozen=True)
class TablePlacement:
    """Where one table's keys and pooled outputs sit in a batch of ``B`` samples (elements).

    Args:
        table: the table's index in the model.
        slot_num: slots per sample.
        combiner: ``0`` sum, ``1`` mean (``constants.COMBINER_*``).
        keys_at: its keys start at ``B * keys_at`` of the key buffer.
        offsets_at: its row offsets start at ``B * offsets_at + position`` of the offset buffer
            (``position``: its index among the placed tables).
        out_at, out_shift, out_stride: its output for sample ``b``, slot ``s`` starts at
            ``B * out_at + out_shift + b * out_stride + s * dim`` of the output buffer.
        keys_cap: key room per sample (``B * keys_cap`` keys from ``B * keys_at`` on).
    """

    table: int
    slot_num: int
    combiner: int
    keys_at: int
    offsets_at: int
    out_at: int
    out_shift: int
    out_stride: int
    keys_cap: int


@dataclass(frozen=True)
class Placement:
    """Every placed table of a model, and the per-slot and per-key tables the kernels read.

    Build it with :meth:`of`.

    Args:
        feeds: the tables the dense network reads, in model order.
        tables: where each of them sits (same order).
        slot_table, slot_local: per slot of a sample (all tables), its table's position among
            ``feeds`` and its slot within that table (int32).
        key_table: per key column of a sample, its table's position (int32).
        keys_per_sample: key room per sample, all tables.
        out_per_sample: floats of pooled output per sample.
        slot_split: per slot, how ``bank_pool`` pools it (:func:`pool_split` of its table).
        sample_hotness: the hotness with which a request's ``[B, K]`` key matrix is staged as
            it is (its columns are exactly every table's key room), or None.
        table_group: per table, its group (a run of tables of about equal key room).
        group_keys, group_slots: per group, its key columns and its slots ``[first, stop)``.
        groups: most groups (and ranges of samples) a batch is cut into.
    """

    feeds: tuple[TableFeed, ...]
    tables: tuple[TablePlacement, ...]
    slot_table: np.ndarray
    slot_local: np.ndarray
    key_table: np.ndarray
    keys_per_sample: int
    out_per_sample: int
    slot_split: tuple[int, ...]
    sample_hotness: tuple[int, ...] | None
    table_group: tuple[int, ...]
    group_keys: tuple[tuple[int, int], ...]
    group_slots: tuple[tuple[int, int], ...]
    groups: int

    @classmethod
    def of(
        cls,
        layout: RankingLayout,
        feeds: Sequence[TableFeed],
        concat: bool,
        groups: int,
        concat_row: tuple[int, int] | None = None,
    ) -> Placement:
        """The placement of ``feeds`` (the tables of ``layout`` the dense network reads).

        Args:
            layout: the model's tables and widths.
            feeds: the tables to place, in model order.
            concat: the network reads one Concat of every embedding (one ``[B, S, D]``
                output; each table a column range of it) rather than one output per table;
                tables of several widths are then side by side in ``[B, sum of S_t * D_t]``.
            groups: cut large batches into at most this many parts.
            concat_row: ``(width, at)``: that Concat's ``[B, S * D]`` output is columns
                ``[at, at + S * D)`` of a ``[B, width]`` tensor (a later Concat's output the
                embeddings are pooled into, ``DenseExecutor.pooled_concat``); both multiples
                of 4, so that every pooled row stays 16-byte aligned.

        Example:
            >>> placement = Placement.of(layout, layout.tables, True, 8)  # doctest: +SKIP
            >>> placement.parts(16384, grouped=True)[0]  # doctest: +SKIP
            ((0, 3), (0, 3), (0, 16384))
        """
        feeds = tuple(feeds)
        tables, out_per_sample = _place(feeds, concat, concat_row)
        keys_per_sample = sum(f.max_keys_per_sample for f in feeds)
        table_group, group_keys = _groups(feeds, tables, keys_per_sample, groups)
        # A batch keeping its request's [B, K] keys is staged as it is when its K columns are
        # exactly the key room of every table, in table order: when the samples contract's
        # hotness fills every table's room (then its header is always the same).
        every_room_filled = len(feeds) == layout.num_tables and all(
            f.sample_width == f.max_keys_per_sample for f in feeds
        )
        return cls(
            feeds=feeds,
            tables=tables,
            slot_table=_per_table([np.full(f.slot_num, u) for u, f in enumerate(feeds)]),
            slot_local=_per_table([np.arange(f.slot_num) for f in feeds]),
            key_table=_per_table([np.full(f.max_keys_per_sample, u) for u, f in enumerate(feeds)]),
            keys_per_sample=keys_per_sample,
            out_per_sample=out_per_sample,
            slot_split=tuple(pool_split(f) for f in feeds for _ in range(f.slot_num)),
            sample_hotness=layout.hotness if every_room_filled else None,
            table_group=table_group,
            group_keys=group_keys,
            group_slots=_slots_of_groups(feeds, table_group),
            groups=groups,
        )

    @property
    def slots(self) -> int:
        """Slots per sample, all tables."""
        return len(self.slot_table)

    def parts(self, size: int, grouped: bool) -> tuple[Part, ...]:
        """The parts of a batch of ``size`` samples looked up one ``bank_find`` +
        ``bank_pool`` each: every group of tables' for a grouped bucket, else one for all."""
        rows = (0, size)
        if grouped:
            return tuple(
                (cols, slots, rows)
                for cols, slots in zip(self.group_keys, self.group_slots, strict=True)
            )
        return (((0, self.keys_per_sample), (0, self.slots), rows),)

    def pool_plan(self, first: int, stop: int) -> PoolPlan:
        """The ``bank_pool`` plan of slots ``[first, stop)`` (a part's slots).

        Example:
            >>> placement.pool_plan(0, 5).segments  # doctest: +SKIP
            ((4, (4,)), (1, (0, 1)), (0, (2, 3)))
        """
        return PoolPlan.of(self.slot_split, first, stop)

    def row_parts(self, size: int, grouped: bool) -> tuple[Part, ...]:
        """The parts of a sample-major batch in a grouped bucket: every table of a range of
        samples (``groups`` ranges), each looked up as soon as it is copied; none for a
        bucket that is not grouped or a model whose requests are never sample-major."""
        if not grouped or self.sample_hotness is None:
            return ()
        cuts = [size * i // self.groups for i in range(self.groups + 1)]
        every = ((0, self.keys_per_sample), (0, self.slots))
        return tuple((*every, (a, b)) for a, b in itertools.pairwise(cuts) if b > a)


def _per_table(columns: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(columns or [np.empty(0)]).astype(np.int32)


def _place(
    feeds: tuple[TableFeed, ...], concat: bool, concat_row: tuple[int, int] | None
) -> tuple[tuple[TablePlacement, ...], int]:
    """Each table's placement, and the floats of pooled output per sample.

    With a Concat of all embeddings the output is that Concat's ``[B, S, D]`` tensor (or its
    columns of a wider ``concat_row``); otherwise each table has its own ``[B, S_t, D_t]``
    region, regions padded to whole 16-byte units so every row stays aligned for vector loads.
    """
    placements = []
    keys_at = offsets_at = out_at = column = 0
    # Side by side, each table's slots take their own width (a Concat's tables all have one).
    stacked = sum(f.slot_num * f.vec_size for f in feeds)
    width, first = concat_row or (stacked, 0)
    if concat_row is not None and (width % 4 or first % 4 or first + stacked > width):
        raise ValueError(f"cannot pool {stacked} floats per sample into {concat_row}")
    for f in feeds:
        if concat:
            shift, stride, at = first + column, width, 0
        else:
            shift, stride, at = 0, f.slot_num * f.vec_size, out_at
        combiner = COMBINER_MEAN if f.combiner is Combiner.MEAN else 0
        placements.append(
            TablePlacement(
                f.table, f.slot_num, combiner, keys_at, offsets_at, at, shift, stride,
                f.max_keys_per_sample,
            )
        )  # fmt: skip
        keys_at += f.max_keys_per_sample
        offsets_at += f.slot_num
        out_at += -(-f.slot_num * f.vec_size // 4) * 4
        column += f.slot_num * f.vec_size
    out_per_sample = width if concat and feeds else out_at
    return tuple(placements), out_per_sample


def _groups(
    feeds: tuple[TableFeed, ...],
    tables: tuple[TablePlacement, ...],
    keys_per_sample: int,
    groups: int,
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Tables cut into up to ``groups`` runs of about equal key room: the group of each
    table, and each group's key columns ``[first, stop)`` (in units of ``size`` keys, as
    ``TablePlacement.keys_at``)."""
    total = max(keys_per_sample, 1)
    table_group: list[int] = []
    bounds: list[list[int]] = []
    last = None
    for f, p in zip(feeds, tables, strict=True):
        group = min(groups - 1, p.keys_at * groups // total)
        if group != last:
            bounds.append([p.keys_at, p.keys_at])
            last = group
        table_group.append(len(bounds) - 1)
        bounds[-1][1] = p.keys_at + f.max_keys_per_sample
    return tuple(table_group), tuple((a, b) for a, b in bounds)


def _slots_of_groups(
    feeds: tuple[TableFeed, ...], table_group: tuple[int, ...]
) -> tuple[tuple[int, int], ...]:
    """Each group's slots ``[first, stop)`` (its tables' slots are consecutive)."""
    bounds: dict[int, list[int]] = {}
    at = 0
    for f, group in zip(feeds, table_group, strict=True):
        bounds.setdefault(group, [at, at])[1] = at + f.slot_num
        at += f.slot_num
    return tuple((a, b) for a, b in bounds.values()) or ((0, 0),)
