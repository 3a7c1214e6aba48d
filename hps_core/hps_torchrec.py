"""TorchRec's embedding collections over a ps.json's tables: drop-in replacements for
``torchrec.EmbeddingBagCollection`` (``KeyedJaggedTensor`` in, ``KeyedTensor`` out) and
``torchrec.EmbeddingCollection`` (``dict[str, JaggedTensor]`` out).

A TorchRec model keeps its code; its tables move to the HPS (GPU cache, host tier, Redis,
RocksDB, Kafka updates). ``hps convert torchrec`` writes the trained tables as HugeCTR sparse
files and a ps.json whose ``embedding_table_names`` are TorchRec's; then::

    from hps_core import hps_torchrec
    arch = model.sparse_arch
    arch.embedding_bag_collection = hps_torchrec.EmbeddingBagCollection.from_torchrec(
        arch.embedding_bag_collection, "ps.json", "dlrm")

Every table of a call is looked up in one call of the model's lookup (on a GPU, one batch of
the cache bank's kernels where that engine serves); the features of one table are asked as one
query. The HPS opens on the first forward. Where TorchRec is not installed the modules take
and return :mod:`hps_core.jagged`'s stand-ins. Inference only.

Example:
    >>> tables = [hps_torchrec.TableSpec("t_cat_0", 128, ("cat_0",))]  # doctest: +SKIP
    >>> ebc = hps_torchrec.EmbeddingBagCollection("ps.json", "dlrm", tables)  # doctest: +SKIP
    >>> ebc(kjt).values().shape  # doctest: +SKIP
    torch.Size([1024, 128])
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hps_core.errors import RequestError
from hps_core.hps import HPS
from hps_core.hps_torch import looked_up_many, looked_up_side_by_side
from hps_core.jagged import JaggedTensor, KeyedTensor
from hps_core.lookup.model_lookup import TableQuery
from hps_core.nn.layers.embedding import Combiner

__all__ = ["EmbeddingBagCollection", "EmbeddingCollection", "TableSpec"]

_POOLINGS = {"sum": Combiner.SUM, "mean": Combiner.MEAN}


@dataclass(frozen=True)
class TableSpec:
    """One table of a collection, as TorchRec's ``EmbeddingBagConfig``/``EmbeddingConfig``
    describe it.

    Args:
        name: the table's name: one of the ps.json model's ``embedding_table_names``.
        embedding_dim: its width (checked against the ps.json on the first forward).
        feature_names: the features looked up in it.
        pooling: ``"sum"`` or ``"mean"`` (pooled collections), ``"none"`` (sequences).
    """

    name: str
    embedding_dim: int
    feature_names: tuple[str, ...]
    pooling: str = "sum"

    @classmethod
    def of(cls, config: Any) -> TableSpec:
        """The spec of a TorchRec table config (anything with ``name``, ``embedding_dim``,
        ``feature_names`` and, pooled, ``pooling``), or a spec as it is."""
        if isinstance(config, TableSpec):
            return config
        pooling = getattr(config, "pooling", None)
        # TorchRec's PoolingType: SUM, MEAN or NONE (an enum whose value is the name).
        pooling = "none" if pooling is None else str(getattr(pooling, "value", pooling)).lower()
        return cls(str(config.name), int(config.embedding_dim), tuple(config.feature_names),
                   pooling)  # fmt: skip


class _Collection(torch.nn.Module):
    """What both collections share: their tables, resolved in the ps.json on first use."""

    kind = "collection"

    def __init__(
        self,
        ps_config_file: str | os.PathLike[str],
        model_name: str,
        tables: Iterable[Any],
    ) -> None:
        super().__init__()
        self.ps_config_file = str(Path(ps_config_file))
        self.model_name = model_name
        self.tables = [TableSpec.of(t) for t in tables]
        if not self.tables:
            raise ValueError(f"{self.kind}: no tables")
        features = [f for t in self.tables for f in t.feature_names]
        doubled = sorted({f for f in features if features.count(f) > 1})
        if doubled:
            raise ValueError(f"{self.kind}: features in more than one table: {doubled}")
        self._table_ids: list[int] | None = None

    def extra_repr(self) -> str:
        return (
            f"ps_config_file={self.ps_config_file!r}, model_name={self.model_name!r}, "
            f"tables={[t.name for t in self.tables]}"
        )

    def _opened(self) -> tuple[HPS, list[int]]:
        """The HPS and each table's index in the ps.json model (resolved once)."""
        hps = HPS(self.ps_config_file)
        if self._table_ids is None:
            model = hps.config.model(self.model_name)
            names = list(model.embedding_table_names)
            ids = []
            for spec in self.tables:
                if spec.name not in names:
                    raise RequestError(
                        f"{self.kind}: table '{spec.name}' is not in model '{self.model_name}' "
                        f"of {self.ps_config_file} (embedding_table_names: {names}); "
                        "hps convert torchrec names the tables as TorchRec does"
                    )
                index = names.index(spec.name)
                width = model.tables[index].dim
                if width != spec.embedding_dim:
                    raise RequestError(
                        f"{self.kind}: table '{spec.name}' is {spec.embedding_dim} wide here "
                        f"and {width} in {self.ps_config_file}"
                    )
                ids.append(index)
            self._table_ids = ids
        return hps, self._table_ids

    def _looked_up(self, features: Any, weighted: bool) -> list[tuple[_TableKeys, torch.Tensor]]:
        """Each table's keys gathered from ``features`` and its answer (pooled bags, or a row
        per key for sequences and weighted bags), every table in one lookup call."""
        hps, gathered, queries, dims = self._queries(features, weighted)
        answers = looked_up_many(hps, self.model_name, features.values().device, queries, dims)
        return list(zip(gathered, answers, strict=True))

    def _pooled_side_by_side(self, features: Any) -> torch.Tensor:
        """Every table's pooled bags side by side, ``[batch, sum of widths]``, in table
        order (tables of one feature each, unweighted): on a GPU the cache bank pools them
        into their columns itself."""
        hps, _, queries, dims = self._queries(features, False)
        device = features.values().device
        return looked_up_side_by_side(hps, self.model_name, device, queries, dims)

    def _queries(
        self, features: Any, weighted: bool
    ) -> tuple[HPS, list[_TableKeys], list[TableQuery], list[int]]:
        """The HPS, each table's keys gathered from ``features``, its lookup and width."""
        hps, table_ids = self._opened()
        gathered = self._per_table(features, weighted)
        queries = [g.query(t) for g, t in zip(gathered, table_ids, strict=True)]
        return hps, gathered, queries, [g.spec.embedding_dim for g in gathered]

    def _per_table(self, features: Any, weighted: bool) -> list[_TableKeys]:
        """Each table's keys gathered from ``features``, in table order."""
        if getattr(features, "variable_stride_per_key", lambda: False)():
            raise RequestError(f"{self.kind}: features of a variable batch size per key")
        keys = list(features.keys())
        where = {name: i for i, name in enumerate(keys)}
        missing = [f for t in self.tables for f in t.feature_names if f not in where]
        if missing:
            raise RequestError(f"{self.kind}: features {missing} not in the input ({keys})")
        values = features.values()
        if values.dtype not in (torch.int32, torch.int64):
            raise RequestError(
                f"{self.kind}: feature ids must be int32 or int64, got {values.dtype}"
            )
        weights = features.weights_or_none() if weighted else None
        if weighted and weights is None:
            raise RequestError(f"{self.kind}: a weighted collection needs weights")
        samples = int(features.stride())
        known = getattr(features, "length_per_key_or_none", lambda: None)()
        if values.is_cuda and known is not None and len(known) == len(keys):
            # Where each feature starts is known on the host (TorchRec's length_per_key):
            # nothing waits for the GPU, and the bag lengths stay unread (every pooled table
            # goes by offsets).
            starts = [0, *itertools.accumulate(int(n) for n in known)]
            one_lengths: list[int | None] = [None] * len(keys)
        else:
            starts, one_lengths = _feature_layout(features.lengths(), len(keys), samples)
        hotness = [_table_hotness(t, where, one_lengths, weighted) for t in self.tables]
        values = values.to(torch.int64)
        # Bags of one length are pooled by hotness: their offsets are neither cut nor sent.
        bags = None
        if any(h is None for h in hotness):
            bags = _rebased_offsets(features.offsets(), len(keys), samples)
        if not values.is_cuda:
            # Host keys are cut as NumPy arrays: a slice of one costs a tenth of a tensor's,
            # and the host tier reads NumPy (a model of 26 tables cuts 26 of each per call).
            values = values.numpy()
            bags = None if bags is None else bags.numpy()
            weights = None if weights is None else weights.numpy()
        return _TableKeys.gather(
            self.tables, where, samples, starts, values, bags, weights, hotness
        )


@dataclass
class _TableKeys:
    """The keys of one table's features, back to back, and their bags: offsets from 0, or
    None where every bag has ``hotness`` keys (NumPy arrays for host keys, tensors on the
    keys' device otherwise)."""

    spec: TableSpec
    keys: Any
    offsets: Any
    weights: Any
    counts: list[int]  # keys per feature
    samples: int
    hotness: int | None = None  # every bag's length, where they are all one (no offsets)

    @classmethod
    def gather(
        cls,
        tables: Sequence[TableSpec],
        where: dict[str, int],
        samples: int,
        starts: list[int],
        values: Any,
        rebased: Any,
        weights: Any,
        hotness: list[int | None],
    ) -> list[_TableKeys]:
        """Each table's keys, bags and weights out of the whole input's (``rebased``: every
        feature's CSR offsets from 0, ``[features, samples + 1]``, or None where every
        table goes by hotness)."""
        cat = np.concatenate if isinstance(values, np.ndarray) else torch.cat
        found = []
        for spec, hot in zip(tables, hotness, strict=True):
            keys, bags, scales, counts, base = [], [], [], [], 0
            for j, name in enumerate(spec.feature_names):
                i = where[name]
                first, end = starts[i], starts[i + 1]
                keys.append(values[first:end])
                if weights is not None:
                    scales.append(weights[first:end])
                if hot is None:  # a later feature's bags after the earlier ones' keys
                    bags.append(rebased[i] if j == 0 else rebased[i][1:] + base)
                counts.append(end - first)
                base += end - first
            found.append(
                cls(
                    spec,
                    keys[0] if len(keys) == 1 else cat(keys),
                    None if hot is not None else bags[0] if len(bags) == 1 else cat(bags),
                    None if weights is None else cat(scales),
                    counts,
                    samples,
                    hot,
                )
            )
        return found

    def query(self, table_id: int) -> TableQuery:
        """Its lookup: a row per key for sequences and weighted bags, else pooled bags."""
        if self.spec.pooling == "none" or self.weights is not None:
            return TableQuery(table_id, self.keys)
        combiner = _POOLINGS[self.spec.pooling]
        if self.hotness is not None:  # bags of one length: pooled without offsets
            return TableQuery(table_id, self.keys, combiner, hotness=self.hotness)
        return TableQuery(table_id, self.keys, combiner, offsets=self.offsets)

    def weighted_bags(self, rows: torch.Tensor) -> torch.Tensor:
        """Each bag's rows scaled by their weights and summed."""
        bags = int(self.offsets.shape[0]) - 1
        lengths = torch.diff(torch.as_tensor(self.offsets)).to(torch.int64)
        bag_of = torch.repeat_interleave(
            torch.arange(bags, device=rows.device), lengths, output_size=int(rows.shape[0])
        )
        scaled = rows * torch.as_tensor(self.weights).to(rows.dtype).reshape(-1, 1)
        out = torch.zeros((bags, rows.shape[1]), dtype=rows.dtype, device=rows.device)
        return out.index_add_(0, bag_of, scaled)


def _feature_layout(
    lengths: torch.Tensor, features: int, samples: int
) -> tuple[list[int], list[int | None]]:
    """Where each feature's ids start in the values (``features + 1`` positions), and per
    feature the length of every one of its bags where it is one and not 0 (one-hot features,
    multi-hot ones of a fixed hotness), else None. One pass over the lengths and, for lengths
    on a GPU, one wait for its result (TorchRec's ``offset_per_key`` waits as long; the bag
    lengths come back in the same copy)."""
    if not samples or not features:
        return [0] * (features + 1), [None] * features
    table = lengths.reshape(features, samples).to(torch.int64)
    first = table[:, 0]
    one = (table == first[:, None]).all(dim=1) & (first > 0)
    sums, firsts, ones = torch.stack([table.sum(dim=1), first, one.to(torch.int64)]).tolist()
    starts = [0, *itertools.accumulate(sums)]
    return starts, [n if ok else None for n, ok in zip(firsts, ones, strict=True)]


def _rebased_offsets(offsets: torch.Tensor, features: int, samples: int) -> torch.Tensor:
    """Every feature's CSR offsets from 0, ``[features, samples + 1]``, out of the whole
    input's ``features * samples + 1`` offsets in two operations, whatever the number of
    features (overlapping windows less their first): int32 on a GPU, the bank's width (no
    conversion per table there), int64 on the host."""
    offsets = offsets.contiguous()
    windows = offsets.as_strided((features, samples + 1), (samples, 1))
    rebased = windows - windows[:, :1]
    return rebased.to(torch.int32) if rebased.is_cuda else rebased.to(torch.int64)


def _table_hotness(
    spec: TableSpec, where: dict[str, int], one_lengths: list[int | None], weighted: bool
) -> int | None:
    """The length of every bag of a table's features where it is one (they are then pooled
    by hotness, without offsets); None for sequences, weighted bags and bags of several
    lengths, which keep their offsets."""
    if spec.pooling == "none" or weighted:
        return None
    lengths = {one_lengths[where[name]] for name in spec.feature_names}
    return lengths.pop() if len(lengths) == 1 else None


class EmbeddingBagCollection(_Collection):
    """TorchRec's ``EmbeddingBagCollection`` over a ps.json model's tables: each feature's
    bags pooled (sum or mean; weighted sums where ``is_weighted``).

    Args:
        ps_config_file: the ps.json.
        model_name: a ``model`` of it.
        tables: TorchRec ``EmbeddingBagConfig`` s or :class:`TableSpec` s (pooling sum or
            mean), named as the model's ``embedding_table_names``.
        is_weighted: the input carries a weight per id (``KeyedJaggedTensor.weights()``).

    Example:
        >>> ebc = EmbeddingBagCollection.from_torchrec(  # doctest: +SKIP
        ...     model.ebc, "ps.json", "dlrm")
        >>> ebc(kjt).values().shape  # a KeyedTensor: [batch, sum of widths]  # doctest: +SKIP
    """

    kind = "EmbeddingBagCollection"

    def __init__(
        self,
        ps_config_file: str | os.PathLike[str],
        model_name: str,
        tables: Iterable[Any],
        is_weighted: bool = False,
    ) -> None:
        super().__init__(ps_config_file, model_name, tables)
        bad = [t.name for t in self.tables if t.pooling not in _POOLINGS]
        if bad:
            raise ValueError(f"{self.kind}: tables {bad} must pool by sum or mean")
        if is_weighted and any(t.pooling != "sum" for t in self.tables):
            raise ValueError(f"{self.kind}: weighted bags pool by sum only")
        self._weighted = bool(is_weighted)

    @classmethod
    def from_torchrec(
        cls, module: Any, ps_config_file: str | os.PathLike[str], model_name: str
    ) -> EmbeddingBagCollection:
        """The replacement of a TorchRec ``EmbeddingBagCollection`` (its table configs and
        weighting; its weights are not read: the ps.json's files hold them)."""
        return cls(ps_config_file, model_name, module.embedding_bag_configs(),
                   bool(module.is_weighted()))  # fmt: skip

    def is_weighted(self) -> bool:
        return self._weighted

    def embedding_bag_configs(self) -> list[TableSpec]:
        return list(self.tables)

    @torch.compiler.disable  # the lookup runs as Python (the ps.json's tiers), between graphs
    def forward(self, features: Any) -> Any:
        """Pool every feature's bags.

        Args:
            features: a ``KeyedJaggedTensor`` holding every feature of the tables (others
                are ignored), int32/int64 ids, on the CPU or a CUDA device.

        Returns:
            A ``KeyedTensor``: float32 ``[batch, sum of widths]`` on the ids' device, the
            features in table order; an empty bag pools to zeros, an unknown id reads the
            table's default vector.

        Raises:
            RequestError: features missing from the input, ids that are not integers, tables
                that do not match the ps.json.
        """
        if not self._weighted and all(len(t.feature_names) == 1 for t in self.tables):
            names = [t.feature_names[0] for t in self.tables]
            widths = [t.embedding_dim for t in self.tables]
            values = self._pooled_side_by_side(features)
            return KeyedTensor(keys=names, length_per_key=widths, values=values)
        columns, names, widths = [], [], []
        for g, answer in self._looked_up(features, self._weighted):
            pooled = g.weighted_bags(answer) if g.weights is not None else answer
            if len(g.spec.feature_names) == 1:
                columns.append(pooled)
            else:
                columns.extend(torch.split(pooled, g.samples))  # a [batch, dim] per feature
            names.extend(g.spec.feature_names)
            widths.extend([g.spec.embedding_dim] * len(g.spec.feature_names))
        return KeyedTensor(keys=names, length_per_key=widths, values=torch.cat(columns, dim=1))


class EmbeddingCollection(_Collection):
    """TorchRec's ``EmbeddingCollection`` over a ps.json model's tables: a row per id,
    each feature's rows a ``JaggedTensor`` cut as its bags (sequence models).

    Args:
        ps_config_file: the ps.json.
        model_name: a ``model`` of it.
        tables: TorchRec ``EmbeddingConfig`` s or :class:`TableSpec` s, named as the
            model's ``embedding_table_names``.

    Example:
        >>> ec = EmbeddingCollection.from_torchrec(model.ec, "ps.json", "hstu")  # doctest: +SKIP
        >>> ec(kjt)["item_id"].values().shape  # doctest: +SKIP
        torch.Size([5120, 256])
    """

    kind = "EmbeddingCollection"

    def __init__(
        self,
        ps_config_file: str | os.PathLike[str],
        model_name: str,
        tables: Iterable[Any],
    ) -> None:
        specs = [TableSpec.of(t) for t in tables]
        # TorchRec's EmbeddingConfig has no pooling: a sequence table reads a row per id.
        super().__init__(ps_config_file, model_name,
                         [TableSpec(t.name, t.embedding_dim, t.feature_names, "none")
                          for t in specs])  # fmt: skip

    @classmethod
    def from_torchrec(
        cls, module: Any, ps_config_file: str | os.PathLike[str], model_name: str
    ) -> EmbeddingCollection:
        """The replacement of a TorchRec ``EmbeddingCollection`` (its table configs; its
        weights are not read: the ps.json's files hold them)."""
        return cls(ps_config_file, model_name, module.embedding_configs())

    def embedding_configs(self) -> list[TableSpec]:
        return list(self.tables)

    @torch.compiler.disable  # the lookup runs as Python (the ps.json's tiers), between graphs
    def forward(self, features: Any) -> dict[str, Any]:
        """Each feature's rows.

        Args:
            features: a ``KeyedJaggedTensor`` holding every feature of the tables (others
                are ignored), int32/int64 ids, on the CPU or a CUDA device.

        Returns:
            Per feature (in table order), a ``JaggedTensor`` of float32 ``[ids, dim]`` rows
            on the ids' device, cut by the feature's lengths; an unknown id reads the table's
            default vector.

        Raises:
            RequestError: features missing from the input, ids that are not integers, tables
                that do not match the ps.json.
        """
        found = {}
        for g, rows in self._looked_up(features, False):
            base = 0
            for j, (name, count) in enumerate(zip(g.spec.feature_names, g.counts, strict=True)):
                # int64, whatever width the lookup took them in (int32 on a GPU)
                offsets = torch.as_tensor(g.offsets[j * g.samples : (j + 1) * g.samples + 1])
                offsets = offsets.to(torch.int64) - base
                found[name] = JaggedTensor(
                    values=rows[base : base + count], lengths=torch.diff(offsets), offsets=offsets
                )
                base += count
        return found
