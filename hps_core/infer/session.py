"""Predictions of a ranking model: keys -> embedding lookup -> pooling -> dense network.

One :class:`RankingSession` per model and process. The whole batch goes through each step at
once: one lookup per table for every key of every sample, one pooling per embedding layer,
one forward pass. Lookups come from the process-wide :class:`~hps_core.hps.HPS` (shared host
tables opened on first use, GPU embedding caches on a GPU); the dense network runs with NumPy
on the host or CuPy on the session's GPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from hps_core.config import ModelConfig
from hps_core.errors import RequestError
from hps_core.hps import HPS
from hps_core.infer.inputs.batch import SparseBatch
from hps_core.infer.inputs.layout import RankingLayout, load_ranking_graph
from hps_core.log_every import LogEvery
from hps_core.lookup.model_lookup import DEFAULT_OPTIONS, LookupOptions, ModelLookup
from hps_core.nn import (
    Combiner,
    DenseExecutor,
    Precision,
    UnpooledEmbedding,
    pool_gathered,
    read_dense_blob,
)
from hps_core.wording import plural

logger = logging.getLogger("hps_core")
_OFF_HOTNESS = LogEvery()  # a line per model and table every 10 s, not per request


def _device(xp: ModuleType, device_id: int | None) -> contextlib.AbstractContextManager:
    # CuPy allocates on the current device; a GPU session makes its own current.
    return contextlib.nullcontext() if device_id is None else xp.cuda.Device(device_id)


def dense_precision(model: ModelConfig, given: str | Precision | None = None) -> str | Precision:
    """The precision a ranking model's dense network runs in: ``given``, else FP16 where the
    ps.json says ``use_mixed_precision`` (as HugeCTR's ``hugectr`` backend reads it, unless
    config.pbtxt's ``mixed_precision`` says otherwise), else FP32.

    Example:
        >>> dense_precision(model, "tf32"), dense_precision(model)  # doctest: +SKIP
        ('tf32', 'fp32')
    """
    if given is not None:
        return given
    return Precision.FP16 if model.use_mixed_precision else Precision.FP32


class EmbeddingSource(Protocol):
    """What the session needs from a model's lookup (:class:`~hps_core.lookup.ModelLookup`):
    the vectors of several tables' keys at once (one table's lookup is a ``TableLookup``)."""

    def lookup_many(self, table_ids: Sequence[int], keys: Sequence[np.ndarray]) -> list[Any]:
        """float32 ``[len(keys[i]), dim]`` vectors of ``keys[i]`` in table ``table_ids[i]``."""
        ...


class RankingSession:
    """Embedding lookup plus dense network of one ps.json model.

    Args:
        layout: which table feeds which embedding layer (see :mod:`hps_core.infer.inputs.layout`).
        lookup: the model's embedding lookup.
        executor: the model's dense network (NumPy, or CuPy on ``device_id``).
        device_id: GPU the lookups and the network run on; ``None`` for the host.
        graphs: on a GPU, record each batch size bucket as CUDA graphs (see
            :mod:`hps_core.infer.gpu.pipeline`).

    Example:
        >>> session = RankingSession.open("model_repository/dlrm/ps.json", "dlrm")  # doctest: +SKIP
        >>> session.predict(batch).shape  # doctest: +SKIP
        (64, 1)
    """

    def __init__(
        self,
        layout: RankingLayout,
        lookup: EmbeddingSource,
        executor: DenseExecutor,
        device_id: int | None = None,
        graphs: bool = True,
    ) -> None:
        self.layout = layout
        self.lookup = lookup
        self.executor = executor
        self.device_id = device_id
        # An embedding layer the prediction does not depend on needs no lookup.
        used = set(executor.embedding_names)
        self._feeds = tuple(feed for feed in layout.tables if feed.layer in used)
        self.pipeline: Any = None
        if device_id is not None and isinstance(lookup, ModelLookup):
            # On a GPU a batch is one pass over the device (hps_core.infer.gpu.pipeline); the
            # per-table path below stays for the host and for lookups of other kinds.
            from hps_core.infer.gpu.pipeline import GpuRankingPipeline

            with _device(executor.ctx.xp, device_id):
                self.pipeline = GpuRankingPipeline(layout, executor, lookup, graphs=graphs)
            lookup.attach(self.pipeline)

    @classmethod
    def open(
        cls,
        ps_json: str | os.PathLike[str],
        model_name: str,
        device_id: int | None = None,
        precision: str | Precision | None = None,
        graphs: bool = True,
        options: LookupOptions = DEFAULT_OPTIONS,
    ) -> RankingSession:
        """Load the network and dense parameters of a ps.json model; tables open on first use.

        Its lookup is the process's :class:`~hps_core.hps.HPS` lookup of the model on that
        device with ``options`` (see :meth:`for_lookup` to hand one over).

        Args:
            ps_json: the ps.json.
            model_name: a model of it with ``network_file`` and ``dense_file``.
            device_id: GPU that runs the lookups (through its embedding caches) and the dense
                network with CuPy; ``None``: the host and NumPy.
            precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``; ``None``: the model's
                (:func:`dense_precision`).
            graphs: on a GPU, record each batch size bucket as CUDA graphs.
            options: how the lookup serves (shared GPU caches).

        Returns:
            The session.

        Raises:
            ConfigError: the model has no network or dense file, or the ps.json and the
                network disagree (each problem names the ps.json field).
            ModelFileError: the dense file does not match the network.
            NotAvailableError: the network has layers the engine cannot run, or the GPU is
                not usable.
        """
        lookup = HPS(ps_json).model(model_name, device_id, options)
        return cls.for_lookup(lookup, precision, graphs)

    @classmethod
    def for_lookup(
        cls,
        lookup: ModelLookup,
        precision: str | Precision | None = None,
        graphs: bool = True,
    ) -> RankingSession:
        """The session of ``lookup``'s model (network and dense parameters loaded now), on
        ``lookup``'s device, looking up through ``lookup``.

        Args:
            lookup: the model's lookup (its tables may still be closed).
            precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``; ``None``: the model's
                (:func:`dense_precision`).
            graphs: on a GPU, record each batch size bucket as CUDA graphs.

        Returns:
            The session. Raises as :meth:`open`.
        """
        config, model = lookup.config, lookup.model
        graph, layout = load_ranking_graph(model, f"models[{config.models.index(model)}]")
        params = read_dense_blob(
            model.dense_file, graph.dense_layout(), model.non_trainable_params_file
        )
        with _device(lookup.xp, lookup.device_id):
            executor = DenseExecutor(graph, params, lookup.xp, dense_precision(model, precision))
        return cls(layout, lookup, executor, lookup.device_id, graphs)

    @property
    def xp(self) -> ModuleType:
        """The array module predictions are computed with."""
        return self.executor.ctx.xp

    def device(self) -> contextlib.AbstractContextManager:
        """Context that makes the session's GPU current (nothing on the host)."""
        return _device(self.xp, self.device_id)

    def embeddings(self, batch: SparseBatch) -> dict[str, Any]:
        """Look up every key of ``batch``: one lookup per table, started together.

        Args:
            batch: the samples.

        Returns:
            Embedding layer name -> its input (in ``xp``), for the layers the prediction
            uses: a table with a fixed hotness (every slot ``h`` keys) pooled here already,
            ``[batch, slots, dim]`` (a view of the vectors for one-hot tables), the others'
            vectors and row offsets as an :class:`~hps_core.nn.UnpooledEmbedding`. All tables
            are looked up in one :meth:`lookup_many` call.
        """
        self._check(batch)
        xp = self.xp
        out: dict[str, Any] = {}
        with _device(xp, self.device_id):
            tables = [feed.table for feed in self._feeds]
            found = self.lookup.lookup_rows_many(tables, [batch.flat_keys(t) for t in tables])
            for feed, (rows, index) in zip(self._feeds, found, strict=True):
                hot = batch.table_hotness(feed.table)
                shape = (batch.batch_size, feed.slot_num, feed.vec_size)
                if hot is not None and hot > 1:
                    # Bags of h keys each need no offsets: summed h rows at a time, straight
                    # from the distinct keys' rows (on the host) or from a row per key.
                    pooled = pool_gathered(rows, index, hot).reshape(shape)
                    if feed.combiner is Combiner.MEAN:
                        pooled /= np.float32(hot)
                    out[feed.layer] = pooled
                    continue
                values = xp.asarray(rows if index is None else rows[index])
                if hot is None:
                    offsets = xp.asarray(batch.table_offsets(feed.table))
                    out[feed.layer] = UnpooledEmbedding(values, offsets)
                else:  # one key per slot: the rows are the pooled tensor
                    out[feed.layer] = values.reshape(shape)
        return out

    def predict(self, batch: SparseBatch) -> Any:
        """Predictions of every sample of ``batch``.

        Args:
            batch: the samples.

        Returns:
            float32 ``[batch_size, label_dim]``: NumPy on the host and from the GPU pipeline,
            ``xp`` otherwise.

        Raises:
            RequestError: the batch does not fit the model (wrong widths, offsets).
        """
        self._warn_off_hotness(batch)
        if self.pipeline is not None:
            self._check(batch)
            return self.pipeline.predict(batch)
        embeddings = self.embeddings(batch)
        with _device(self.xp, self.device_id):
            return self.executor.forward(self.xp.asarray(batch.dense), embeddings)

    def _warn_off_hotness(self, batch: SparseBatch) -> None:
        """Warn of slots whose key count differs from a fixed-length input's hotness.

        HugeCTR pools the keys a slot holds whatever their number, and so does this engine,
        so such a batch is scored; but a network declaring every slot ``h`` keys was trained
        on ``h``, and a request of other lengths is most often a data bug (a column read as
        another), which deserves a line rather than silence."""
        for feed in self.layout.tables:
            offsets = batch.row_offsets[feed.table] if feed.table < len(batch.row_offsets) else None
            if feed.hotness == 1 or not isinstance(offsets, np.ndarray):
                continue  # one-hot (lengths free) or no offsets (every slot holds h keys)
            off = np.flatnonzero(np.diff(offsets) != feed.hotness)
            if off.size == 0:
                continue
            sample, slot = divmod(int(off[0]), feed.slot_num)
            samples = len(np.unique(off // feed.slot_num))
            _OFF_HOTNESS.log(
                logger,
                logging.WARNING,
                (self.layout.model, feed.table),
                "model '%s' table %d ('%s'): slot %d of sample %d of a batch holds %s, but the "
                "network's fixed-length input has %d in every slot (%d of the batch's %d "
                "samples differ); "
                "scored as given, pooled over the keys each slot holds, as HugeCTR does",
                self.layout.model,
                feed.table,
                feed.layer,
                slot,
                sample,
                plural(int(offsets[off[0] + 1] - offsets[off[0]]), "key"),
                feed.hotness,
                samples,
                batch.batch_size,
            )

    def _check(self, batch: SparseBatch) -> None:
        layout = self.layout
        if len(batch.keys) != layout.num_tables or len(batch.row_offsets) != layout.num_tables:
            raise RequestError(
                f"model '{layout.model}' has {plural(layout.num_tables, 'table')}, the batch "
                f"has keys for {len(batch.keys)} and offsets for {len(batch.row_offsets)}"
            )
        n = batch.batch_size
        if batch.dense.shape != (n, layout.dense_dim):
            raise RequestError(
                f"dense features must be [batch, {layout.dense_dim}], got {batch.dense.shape}"
            )
        keys = batch.sample_keys
        if (
            keys is not None
            and keys.shape == (n, layout.sample_width)
            and batch.hotness == layout.hotness
        ):
            return  # the samples contract's key matrix: every table's width checked at once
        for feed in layout.tables:
            offsets = batch.row_offsets[feed.table]
            keys = batch.keys[feed.table]
            if offsets is None:
                hot = batch.table_hotness(feed.table) or 0
                width = feed.slot_num * hot
                rows_ok = keys.ndim == 1 or (keys.ndim == 2 and keys.shape[0] == n)
                if hot < 1 or not rows_ok or keys.size != n * width:
                    raise RequestError(
                        f"table {feed.table} ('{feed.layer}', {feed.slot_num} slots): {n} "
                        f"samples of {hot} keys per slot need {n * width} keys, got "
                        f"{keys.shape}"
                    )
                continue
            if offsets.shape != (n * feed.slot_num + 1,):
                raise RequestError(
                    f"table {feed.table} ('{feed.layer}', {feed.slot_num} slots): "
                    f"{n} samples need {n * feed.slot_num + 1} row offsets, got {offsets.shape}"
                )
