"""Offline scoring of a ranking model, in the shape of HugeCTR's Python inference API."""

from __future__ import annotations

import dataclasses
import json
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hps_core.arrays import array_module, first_gpu
from hps_core.config import PSConfig, load_ps_config, parse_ps_config
from hps_core.errors import (
    OVERWRITE_HINT,
    ConfigError,
    ModelFileError,
    NotAvailableError,
    RequestError,
)
from hps_core.formats.progress import RowProgress
from hps_core.hps import gpu_engine
from hps_core.infer.contracts import ArrayNames, HugeCTRContract
from hps_core.infer.inputs.batch import SparseBatch
from hps_core.infer.inputs.layout import RankingLayout
from hps_core.infer.session import RankingSession
from hps_core.lookup import ModelLookup
from hps_core.nn import DenseExecutor
from hps_core.offline.dataset import (
    DatasetColumns,
    dataset_columns,
    dataset_files,
    dataset_rows,
    iter_dataset,
    read_ahead,
)
from hps_core.offline.metrics import auc
from hps_core.offline.params import (
    SOURCE,
    Check_t,
    DataReaderType_t,
    InferenceParams,
    log,
    network_model_entry,
    ps_config_of,
    warn_inert,
)

ARGUMENTS = ArrayNames("dense_feature", "embeddingcolumns", "row_ptrs", kind="argument")
"""How errors name :meth:`InferenceModel.predict`'s arrays: HugeCTR's argument names."""


@dataclass(frozen=True)
class DatasetPredictions:
    """The predictions of a whole dataset.

    Args:
        scores: float32 ``[samples, label_dim]``.
        labels: float32 ``[samples, label_dim]``, or None for a dataset without labels.
        columns: the dataset's columns that were read.
    """

    scores: np.ndarray
    labels: np.ndarray | None
    columns: DatasetColumns

    def auc(self) -> float:
        """AUC of the first label and prediction (HugeCTR's ``evaluate``).

        Raises:
            RequestError: the dataset has no labels, or only one class.
        """
        if self.labels is None:
            raise RequestError("the dataset has no label columns: no AUC")
        if not len(self.labels):
            raise RequestError("the dataset has no rows: no AUC")
        return auc(self.labels[:, 0], self.scores[:, 0], f"label column '{self.columns.labels[0]}'")


class InferenceModel:
    """A ranking model scored in this process: HugeCTR's ``InferenceModel`` /
    ``InferenceSession`` for offline prediction.

    ``InferenceModel(model_config_path, inference_params)`` as in HugeCTR: the network JSON
    and an :class:`~hps_core.offline.params.InferenceParams` (fields that change nothing here
    are warned about, values that cannot be served refused naming the field). Or from a
    ps.json (:meth:`from_ps_json`) or the files alone (:meth:`from_files`).

    On a GPU (``device_id``) batches run through the GPU pipeline (embedding caches, CUDA
    graphs); without one, on the CPU with NumPy. Each table's rows are read once into the
    machine's shared host tier.

    Args:
        model_config_path: the network JSON (HugeCTR's ``Model.graph_to_json`` output).
        inference_params: the model's files and settings.

    Raises:
        ConfigError: a field of ``inference_params`` is refused, or the files do not fit
            together (each problem named).

    Example:
        >>> params = InferenceParams(model_name="dlrm", max_batchsize=1024,
        ...     hit_rate_threshold=1.0, dense_model_file="dlrm_dense.model",
        ...     sparse_model_files=["dlrm0_sparse.model"], use_gpu_embedding_cache=True,
        ...     cache_size_percentage=0.5, i64_input_key=True)  # doctest: +SKIP
        >>> model = InferenceModel("dlrm.json", params)  # doctest: +SKIP
        >>> model.predict(1, "val/_file_list.txt", DataReaderType_t.Parquet,
        ...               Check_t.Non).shape  # doctest: +SKIP
        (1024, 1)
        >>> InferenceModel.from_ps_json("ps.json", "dlrm").evaluate("val.parquet")  # doctest: +SKIP
        0.79
        >>> model.check_out_tensor("interaction1").shape  # doctest: +SKIP
        (1024, 480)
    """

    def __init__(
        self, model_config_path: str | os.PathLike[str], inference_params: InferenceParams
    ) -> None:
        if not isinstance(inference_params, InferenceParams):
            raise TypeError(
                "InferenceModel(model_config_path, inference_params): inference_params must "
                f"be an InferenceParams, got {type(inference_params).__name__}"
            )
        config, warnings = ps_config_of(model_config_path, inference_params)
        warn_inert(warnings)
        device_id = _device_of(inference_params.device_id)
        self._attach(_own_session(config, device_id, inference_params.use_cuda_graph))

    @classmethod
    def of_session(cls, session: RankingSession) -> InferenceModel:
        """The model of a loaded session (its lookup stays the caller's to close)."""
        model = cls.__new__(cls)
        model._attach(session)
        return model

    def _attach(self, session: RankingSession) -> None:
        self.session = session
        self._contract = HugeCTRContract(session.layout, names=ARGUMENTS)
        self._last: SparseBatch | None = None
        self._debug: DenseExecutor | None = None

    @classmethod
    def from_ps_json(
        cls,
        ps_json: str | os.PathLike[str],
        model_name: str | None = None,
        device_id: int | str | None = "auto",
        precision: str | None = None,
    ) -> InferenceModel:
        """Open a model of a ps.json (its ``network_file``, ``dense_file`` and tables).

        Args:
            ps_json: the ps.json.
            model_name: the model (default: the only one).
            device_id: GPU to score on; None: the CPU; ``"auto"``: GPU 0 when there is one,
                else the CPU.
            precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``; ``None``: the ps.json's
                ``use_mixed_precision`` (FP16), else FP32, as served.

        Returns:
            The model.

        Raises:
            ConfigError: no such model, or the ps.json and the network disagree.
        """
        if device_id == "auto":
            device_id = first_gpu()
        elif device_id == "cpu":  # as hps predict --device cpu
            device_id = None
        if model_name is None:
            models = load_ps_config(ps_json).models
            if len(models) != 1:
                names = ", ".join(m.name for m in models)
                raise RequestError(f"{ps_json} has {len(models)} models ({names}): name one")
            model_name = models[0].name
        return cls.of_session(RankingSession.open(ps_json, model_name, device_id, precision))

    @classmethod
    def from_files(
        cls,
        network_file: str | os.PathLike[str],
        dense_file: str | os.PathLike[str],
        sparse_files: Sequence[str | os.PathLike[str]],
        *,
        model_name: str = "model",
        max_batch_size: int = 1024,
        default_values: Sequence[float] | None = None,
        device_id: int | str | None = "auto",
        precision: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
    ) -> InferenceModel:
        """Open a model from HugeCTR's files without a ps.json, as ``InferenceParams`` names
        them (see also ``InferenceModel(model_config_path, inference_params)``). No file is
        written unless ``workdir`` asks for the ps.json.

        Args:
            network_file: the network JSON.
            dense_file: the dense model file.
            sparse_files: one sparse model folder per embedding layer, in the network's order.
            model_name: the model's name.
            max_batch_size: most samples per batch (HugeCTR's ``max_batchsize``).
            default_values: the vector value of unknown keys per table (default 0).
            device_id: as :meth:`from_ps_json`.
            precision: ``"fp32"``, ``"tf32"`` or ``"fp16"``; ``None``: the ps.json's
                ``use_mixed_precision`` (FP16), else FP32, as served.
            workdir: a folder to write the ps.json of these files to (``<model_name>_ps.json``,
                for ``hps serve`` or ``hps check``); None: none is written.

        Returns:
            The model.

        Raises:
            RequestError: the network has another number of embedding layers than
                ``sparse_files`` has entries.
            ConfigError: the files do not fit together (each problem named).
        """
        try:
            entry = network_model_entry(network_file, model_name, dense_file, sparse_files)
        except ConfigError as exc:
            if exc.problems[0].where != "sparse_files":
                raise
            raise RequestError(exc.problems[0].message) from None
        if default_values is not None:
            entry["default_value_for_each_table"] = list(default_values)
        entry["max_batch_size"] = max_batch_size
        entry["deployed_device_list"] = [device_id if isinstance(device_id, int) else 0]
        document = {"supportlonglong": True, "models": [entry]}
        if workdir is not None:
            folder = Path(workdir)
            folder.mkdir(parents=True, exist_ok=True)
            ps_json = folder / f"{model_name}_ps.json"
            ps_json.write_text(json.dumps(document, indent=2))
            return cls.from_ps_json(ps_json, model_name, device_id, precision)
        config = parse_ps_config(document, os.getcwd(), source=f"{model_name}_ps.json")
        if device_id == "auto":
            device_id = first_gpu()
        elif device_id == "cpu":
            device_id = None
        return cls.of_session(_own_session(config, device_id, True, precision))

    @property
    def layout(self) -> RankingLayout:
        """The model's tables, slots and widths."""
        return self.session.layout

    # -- scoring ------------------------------------------------------------------------------

    def predict(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """Predict a dataset as HugeCTR's ``InferenceModel.predict`` does, or one batch of
        arrays as HugeCTR's ``InferenceSession.predict`` takes it:

        - ``predict(num_batches, source, data_reader_type, check_type, slot_size_array=[],
          data_source_params=None, reading_file_sequentially=True)``: see
          :meth:`predict_batches`; float32 ``[max_batchsize * num_batches, label_dim]``.
        - ``predict(dense_feature, embeddingcolumns, row_ptrs)``: see :meth:`predict_arrays`;
          float32 ``[B, label_dim]``.
        """
        if _dataset_call(args, kwargs):
            return self.predict_batches(*args, **kwargs)
        return self.predict_arrays(*args, **kwargs)

    def predict_arrays(
        self, dense_feature: Any, embeddingcolumns: Any, row_ptrs: Any
    ) -> np.ndarray:
        """Predict one batch given as HugeCTR's ``predict(dense_feature, embeddingcolumns,
        row_ptrs)`` takes it (the ``hugectr`` backend's ``DES``, ``CATCOLUMN``, ``ROWINDEX``;
        see :mod:`hps_core.infer.contracts`).

        Args:
            dense_feature: ``B * dense_dim`` floats, sample by sample.
            embeddingcolumns: the keys, sample-major (sample 0's keys of every table, then
                sample 1's).
            row_ptrs: per table ``B * S_t + 1`` offsets, concatenated in table order.

        Returns:
            float32 ``[B, label_dim]``.

        Raises:
            RequestError: the arrays do not describe a valid batch (naming the argument).
        """
        batch = self._contract.parse(
            _argument(ARGUMENTS.dense, dense_feature, np.float32),
            _argument(ARGUMENTS.keys, embeddingcolumns, np.int64),
            _argument(ARGUMENTS.row_ptrs, row_ptrs, np.int32),
        )
        return self.predict_batch(batch)

    def predict_batches(
        self,
        num_batches: int,
        source: str | os.PathLike[str],
        data_reader_type: Any = DataReaderType_t.Parquet,
        check_type: Any = Check_t.Non,
        slot_size_array: Sequence[int] = (),
        data_source_params: Any = None,
        reading_file_sequentially: bool = True,
    ) -> np.ndarray:
        """HugeCTR's ``InferenceModel.predict``: ``num_batches`` batches of ``max_batchsize``
        samples of a Parquet dataset, in file and row order, starting over at its first row
        when it has fewer samples (as HugeCTR's reader repeats the dataset).

        Args:
            num_batches: batches to predict.
            source: a Parquet file, a folder of them, or HugeCTR's ``_file_list.txt``
                (local, or a URI such as ``s3://``).
            data_reader_type: ``DataReaderType_t.Parquet`` (the one HugeCTR supports here).
            check_type: accepted; Parquet files have no checksum.
            slot_size_array: each slot's cardinality; when given, each slot's keys are
                shifted by the sum of the slots before it, as HugeCTR's Parquet reader does.
            data_source_params: None (name a remote dataset by URI in ``source``).
            reading_file_sequentially: accepted (files are always read in order).

        Returns:
            float32 ``[max_batchsize * num_batches, label_dim]``.

        Raises:
            RequestError: an argument is refused (naming it), or the dataset has no rows.
            ModelFileError: the dataset does not fit the model (naming file and column).
        """
        scores, _ = self._score_batches(
            num_batches, source, data_reader_type, slot_size_array, data_source_params
        )
        return scores

    def _score_batches(
        self,
        num_batches: Any,
        source: str | os.PathLike[str],
        data_reader_type: Any,
        slot_size_array: Sequence[int],
        data_source_params: Any,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
            raise RequestError(
                f"argument 'num_batches': expected an integer >= 1, got {num_batches!r}"
            )
        if getattr(data_reader_type, "name", data_reader_type) != "Parquet":
            raise NotAvailableError(
                f"argument 'data_reader_type': {data_reader_type} is not read here; "
                "DataReaderType_t.Parquet is (HugeCTR's offline inference reads Parquet)"
            )
        if data_source_params is not None:
            raise NotAvailableError(
                "argument 'data_source_params': name a remote dataset by URI in 'source' "
                "instead (s3://bucket/data/, hdfs://namenode:9000/data/)"
            )
        shift = self._slot_shift(slot_size_array)
        size = self.layout.max_batch_size
        wanted = num_batches * size
        files = dataset_files(source)
        columns = dataset_columns(files, self.layout, source)
        scores: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        got = 0
        while got < wanted:
            before = got
            for batch in _prefix(iter_dataset(files, columns, self.layout, size), wanted - got):
                samples = batch.samples if shift is None else _shift_slots(batch.samples, shift)
                scores.append(self.predict_batch(samples))
                if batch.labels is not None:
                    labels.append(batch.labels)
                got += samples.batch_size
            if got == before:
                raise RequestError(f"{source}: the dataset has no rows to predict")
        return np.concatenate(scores), np.concatenate(labels) if labels else None

    def _slot_shift(self, slot_size_array: Sequence[int]) -> list[np.ndarray] | None:
        """Per table, the offset added to each slot's keys (HugeCTR's ``slot_offset``)."""
        sizes = list(slot_size_array)
        if not sizes:
            return None
        slots = self.layout.total_slots
        if len(sizes) != slots or not all(
            isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 0 for n in sizes
        ):
            raise RequestError(
                f"argument 'slot_size_array': expected {slots} cardinalities (one per slot, "
                f"integers >= 0), got {sizes[:8]}{'...' if len(sizes) > 8 else ''} "
                f"({len(sizes)} entries)"
            )
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)[:-1]])
        return np.split(starts, np.cumsum(self.layout.slot_nums)[:-1])

    def predict_batch(self, batch: SparseBatch) -> np.ndarray:
        """Predict a :class:`~hps_core.infer.SparseBatch` (up to ``max_batch_size``).

        Returns:
            float32 ``[B, label_dim]`` on the host.
        """
        scores = self.session.predict(batch)
        self._last = batch
        return np.asarray(scores.get() if hasattr(scores, "get") else scores, np.float32)

    def predict_dataset(
        self,
        source: str | os.PathLike[str],
        columns: DatasetColumns | None = None,
        batch_size: int | None = None,
        progress: bool | None = None,
    ) -> DatasetPredictions:
        """Predict every sample of a Parquet dataset (see :mod:`hps_core.offline.dataset`).

        Args:
            source: a Parquet file, a folder of them, or HugeCTR's ``_file_list.txt``.
            columns: the columns to read (default: ``_metadata.json``, else Criteo's names
                when the files use them, else by position).
            batch_size: samples per batch (default and most: the model's ``max_batch_size``).
            progress: report progress (a bar on a terminal, else log lines); None: for
                datasets of more than a million rows.

        Returns:
            Scores and labels of every sample, in file and row order.

        Raises:
            ModelFileError: the dataset does not fit the model (naming file and column).
        """
        files = dataset_files(source)
        columns = columns or dataset_columns(files, self.layout, source)
        size = min(batch_size or self.layout.max_batch_size, self.layout.max_batch_size)
        total = dataset_rows(files)
        scores, labels = [], []
        enabled = total > 1_000_000 if progress is None else progress
        with RowProgress(total, f"scoring {source}", enabled) as bar:
            batches = iter_dataset(files, columns, self.layout, size)
            if self.session.xp is not np:
                # On a GPU the next batches are read while this one is scored (on the CPU both
                # would take the same cores: 36.9K against 38.9K rows/s on the 2-core machine).
                batches = read_ahead(batches)
            for batch in batches:
                scores.append(self.predict_batch(batch.samples))
                if batch.labels is not None:
                    labels.append(batch.labels)
                bar.update(batch.samples.batch_size)
        width = self.layout.label_dim
        return DatasetPredictions(
            np.concatenate(scores) if scores else np.empty((0, width), np.float32),
            np.concatenate(labels)
            if labels
            else np.empty((0, len(columns.labels)), np.float32)
            if columns.labels
            else None,
            columns,
        )

    def evaluate(self, *args: Any, **options: Any) -> float:
        """AUC of a labelled dataset (HugeCTR's ``evaluate``), two ways:

        - ``evaluate(num_batches, source, data_reader_type, check_type, slot_size_array=[],
          data_source_params=None, reading_file_sequentially=True)`` as HugeCTR's
          ``InferenceModel.evaluate``: the AUC of the samples :meth:`predict_batches` scores.
        - ``evaluate(source, **options)``: the AUC of the whole dataset, options as
          :meth:`predict_dataset`.
        """
        if not _dataset_call(args, options):
            return self.predict_dataset(*args, **options).auc()
        call = dict(zip(_BATCH_ARGUMENTS, args, strict=False)) | options
        call.pop("check_type", None)
        call.pop("reading_file_sequentially", None)
        scores, labels = self._score_batches(
            call.pop("num_batches"),
            call.pop("source"),
            call.pop("data_reader_type", DataReaderType_t.Parquet),
            call.pop("slot_size_array", ()),
            call.pop("data_source_params", None),
        )
        if call:
            raise TypeError(f"evaluate() got unexpected arguments: {', '.join(call)}")
        if labels is None:
            raise RequestError("the dataset has no label columns: no AUC")
        return auc(labels[:, 0], scores[:, 0], "the dataset's first label column")

    # -- debugging ----------------------------------------------------------------------------

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """Names :meth:`check_out_tensor` answers: the dense input, each embedding layer's
        pooled output and every layer's output, in execution order."""
        graph = self.session.executor.graph
        names = [graph.spec.data.dense_name]
        for node in graph.nodes:
            if node.used:
                names.extend(node.spec.tops)
        return tuple(dict.fromkeys(names))

    def check_out_tensor(self, name: str) -> np.ndarray:
        """A named tensor of the network for the last batch predicted (HugeCTR's
        ``check_out_tensor``): every layer's own output, a ReLU's input included (the
        batch runs again, unfused, in the model's precision).

        Args:
            name: a tensor name (:attr:`tensor_names`).

        Returns:
            The tensor as float32 NumPy, samples first.

        Raises:
            RequestError: nothing was predicted yet, or no tensor has that name (the message
                lists the names).
        """
        if name not in self.tensor_names:
            raise RequestError(
                f"no tensor '{name}' in model '{self.layout.model}'; its tensors: "
                f"{', '.join(self.tensor_names)}"
            )
        if self._last is None:
            raise RequestError("check_out_tensor needs a prediction first")
        session = self.session
        if self._debug is None:
            self._debug = session.executor.unfused()
        with session.device():
            tensors = self._debug.tensors(
                session.xp.asarray(self._last.dense), session.embeddings(self._last)
            )
        value = tensors[name]
        return np.asarray(value.get() if hasattr(value, "get") else value, np.float32)

    def close(self) -> None:
        """Release the model's tables (its host tier is shared with other users)."""
        closing = getattr(self.session, "owned_close", None)
        if closing is not None:
            closing()
        else:
            self.session.lookup.close()


_BATCH_ARGUMENTS = (
    "num_batches",
    "source",
    "data_reader_type",
    "check_type",
    "slot_size_array",
    "data_source_params",
    "reading_file_sequentially",
)


def _dataset_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``predict``/``evaluate`` call is HugeCTR's dataset form (``num_batches``
    first) rather than arrays or a source."""
    if "num_batches" in kwargs:
        return True
    first = args[0] if args else None
    return isinstance(first, int | np.integer) and not isinstance(first, bool)


def _prefix(batches: Iterator[Any], rows: int) -> Iterator[Any]:
    """The first ``rows`` samples of ``batches`` (the last batch cut to fit)."""
    for batch in batches:
        if rows <= 0:
            return
        n = batch.samples.batch_size
        if n > rows:
            labels = None if batch.labels is None else batch.labels[:rows]
            batch = dataclasses.replace(
                batch, samples=batch.samples.sample_range(0, rows), labels=labels
            )
            n = rows
        rows -= n
        yield batch


def _shift_slots(batch: SparseBatch, shift: list[np.ndarray]) -> SparseBatch:
    """``batch`` with each slot's keys plus that slot's offset (``shift[t][s]``)."""
    keys = []
    samples = batch.batch_size
    for t, (table_keys, offsets) in enumerate(zip(batch.keys, batch.row_offsets, strict=True)):
        slot_shift = shift[t]
        if offsets is None:
            per_sample = np.asarray(table_keys).reshape(samples, len(slot_shift), -1)
            keys.append((per_sample + slot_shift[None, :, None]).reshape(-1))
        else:
            counts = np.diff(np.asarray(offsets))
            slot_of_key = np.repeat(np.tile(np.arange(len(slot_shift)), samples), counts)
            keys.append(np.asarray(table_keys).reshape(-1) + slot_shift[slot_of_key])
    return dataclasses.replace(batch, keys=tuple(keys), sample_keys=None)


def _argument(name: str, value: Any, dtype: type) -> np.ndarray:
    """A Python argument as a flat array of ``dtype``; a refusal names the argument."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise RequestError(f"argument '{name}': not an array of numbers ({exc})") from None
    if array.size == 0:
        return np.zeros(0, dtype)
    integers = np.dtype(dtype).kind == "i"
    if array.dtype.kind not in ("iu" if integers else "iuf"):
        wanted = "integers" if integers else "numbers"
        raise RequestError(f"argument '{name}': expected {wanted}, got {array.dtype}")
    if integers:
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise RequestError(f"argument '{name}': {bad} does not fit {np.dtype(dtype).name}")
    return array.astype(dtype, copy=False).reshape(-1)


def _device_of(device_id: int | None) -> int | None:
    """``InferenceParams.device_id`` as served: the CPU (with a warning) on a machine where
    no GPU can be used, so a script written for a GPU runs anywhere."""
    if device_id is None or first_gpu() is not None:
        return device_id
    try:
        array_module(device_id)
    except NotAvailableError as exc:
        reason = str(exc).split(";")[0]  # without its hint: the fallback below is the answer
        log.warning(
            "%s.device_id = %s: %s; scoring on the CPU (device_id=None asks for the CPU)",
            SOURCE,
            device_id,
            reason,
        )
    return None


def _own_session(
    config: PSConfig, device_id: int | None, graphs: bool, precision: str | None = None
) -> RankingSession:
    """A session of ``config``'s one model with a lookup of its own, closed by its
    ``owned_close`` or, at the latest, when it is garbage-collected or the process exits."""
    lookup = ModelLookup(config, config.models[0], device_id, engine=gpu_engine)
    try:
        session = RankingSession.for_lookup(lookup, precision, graphs)
    except BaseException:
        lookup.close()
        raise
    session.owned_close = weakref.finalize(session, lookup.close)  # type: ignore[attr-defined]
    return session


def write_predictions(
    path: str | os.PathLike[str], result: DatasetPredictions, overwrite: bool = False
) -> Path:
    """Write a dataset's predictions as Parquet: the label columns (when there are any)
    next to one ``prediction`` column per label (``prediction_<i>`` for several).

    Args:
        path: the output file.
        result: :meth:`InferenceModel.predict_dataset`'s result.
        overwrite: replace an existing file.

    Returns:
        The path.

    Raises:
        ModelFileError: the file exists and ``overwrite`` is false.
    """
    out = Path(path)
    if out.exists() and not overwrite:
        raise ModelFileError(f"{out} exists; {OVERWRITE_HINT}")
    arrays, names = [], []
    if result.labels is not None:
        for j, name in enumerate(result.columns.labels):
            arrays.append(pa.array(result.labels[:, j]))
            names.append(name)
    width = result.scores.shape[1]
    for j in range(width):
        arrays.append(pa.array(result.scores[:, j]))
        names.append("prediction" if width == 1 else f"prediction_{j}")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays(arrays, names=names), out)
    return out
